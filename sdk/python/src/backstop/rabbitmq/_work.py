"""What both RabbitMQ workers (asyncio and threads) check and build before
they consume: ``work``'s arguments, its metrics, its typed policies, and
the state kept across lost connections."""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple

from .. import _decide
from .._policy import Policy
from .._retry import Classify, check_classify, classifier
from . import _core
from ._metrics import QueueMetrics, worker_metrics


class Setup(NamedTuple):
    cls: Callable[[BaseException], Dict[str, Any]]
    timeout: float  # the handler's deadline, in seconds
    client: Any
    qm: Optional[QueueMetrics]
    typed: Mapping[str, Tuple[Policy, Any]]
    kept: _core.Kept
    backoff: _core.Backoff


def setup(name: str, handler: Any, prefetch: int, classify: Optional[Classify], registry: Any, metrics_policy: str,
          policies: Optional[Mapping[str, Policy]], handler_timeout: Any) -> Setup:
    """Checks ``work``'s arguments (raising at once, naming the argument)
    and builds what the worker of queue ``name`` needs."""
    check_classify("work", classify)
    cls = classifier(classify)
    timeout = _decide.handler_timeout(handler_timeout, _decide.HANDLER_TIMEOUT_S)
    _core.check_int("work", "prefetch", prefetch, 1, 65535)
    if not callable(handler):
        raise TypeError("work: handler must be callable (got %r)" % (handler,))
    client, qm = worker_metrics(registry, metrics_policy, name)
    return Setup(cls, timeout, client, qm, _decide.typed_policies(policies, client), _core.Kept(), _core.Backoff())
