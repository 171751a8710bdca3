"""What both RabbitMQ workers (asyncio and threads) check and build before
they consume: ``work``'s arguments, its metrics, the runner (its typed
policies: ``backstop._decide.Runner``, the Redis worker's too), and the
state kept across lost connections."""

from __future__ import annotations

import logging
from typing import Any, Mapping, NamedTuple, Optional

from .. import queue as _queue
from .. import _decide
from .._policy import Policy
from .._retry import Classify, check_classify, classifier
from . import _core
from ._metrics import QueueMetrics, worker_metrics


class Setup(NamedTuple):
    runner: _decide.Runner  # the steps around each job's decision
    timeout: float  # the handler's deadline, in seconds
    qm: Optional[QueueMetrics]
    kept: _core.Kept
    backoff: _core.Backoff


def setup(log: logging.Logger, name: str, policy: Policy, handler: Any, prefetch: int, classify: Optional[Classify],
          registry: Any, metrics_policy: str, policies: Optional[Mapping[str, Policy]], handler_timeout: Any,
          on_outcome: Any = None) -> Setup:
    """Checks ``work``'s arguments (raising at once, naming the argument)
    and builds what the worker of queue ``name`` needs."""
    check_classify("work", classify)
    cls = classifier(classify)
    timeout = _queue.handler_timeout(handler_timeout, _queue.HANDLER_TIMEOUT_S)
    _core.check_int("work", "prefetch", prefetch, 1, 65535)
    if not callable(handler):
        raise TypeError("work: handler must be callable (got %r)" % (handler,))
    _queue.check_on_outcome(on_outcome)
    client, qm = worker_metrics(registry, metrics_policy, name)
    runner = _decide.Runner(log, name, policy, client, _queue.typed_policies(policies, client), cls, _core.MALFORMED,
                            on_outcome)
    return Setup(runner, timeout, qm, _core.Kept(), _core.Backoff())
