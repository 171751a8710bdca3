"""backstop.queue: what every broker's worker shares, as Go's ``queue``.

The brokers live beside it: ``backstop.redis`` (Redis Streams) and
``backstop.rabbitmq`` (RabbitMQ, asyncio and ``backstop.rabbitmq.sync``).
This module holds what does not depend on one: the shape of a job a
worker decides about (``JobLike``, which ``backstop.redis.Job`` and
``backstop.rabbitmq.Job`` both have), the actions a worker applies
(``ACTIONS``), the job-type check every ``enqueue`` makes, and the worker's
``handler_timeout``, ``policies`` and ``metrics`` checks and loop jitter.

Deprecated: ``backstop.queue`` used to be the Redis queue. Its names
(``from backstop.queue import Queue, AsyncQueue, Job, ...``) still work,
as aliases of ``backstop.redis``'s, with a ``DeprecationWarning``: import
them from ``backstop.redis``.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import math
import random
import re
import warnings
from datetime import timedelta
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Protocol, Tuple

from .._host._contract import OUTCOME_ACTION_NAMES
from .._policy import Policy
from ..metrics import Metrics

#: What a worker does with a job (``Outcome.action`` of ``Policy.outcome``):
#: run it, ack it, retry it later (attempt + 1), defer it (attempt
#: unchanged) or dead-letter it.
ACTIONS = OUTCOME_ACTION_NAMES

# A handler's deadline by default: RabbitMQ's (below the broker's
# consumer_timeout, 30 min), and Redis's without a min idle time.
HANDLER_TIMEOUT_S = 300.0

JOB_TYPE = re.compile(r"[A-Za-z0-9_./-]{1,64}\Z")


class JobLike(Protocol):
    """What deciding needs of a job (``backstop.redis.Job``,
    ``backstop.rabbitmq.Job``)."""

    @property
    def id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def first_enqueued_ms(self) -> int: ...
    @property
    def prev_delay_ms(self) -> int: ...
    @property
    def malformed(self) -> bool: ...
    @property
    def job_type(self) -> str: ...
    @property
    def last_reason(self) -> str: ...


@dataclass(frozen=True)
class OutcomeEvent:
    """An outcome a worker applied (the broker has it: Redis' script ran,
    RabbitMQ's next message was confirmed and the delivery acked): what
    ``work(on_outcome=...)`` is called with, the fields of Node's
    ``onOutcome`` and Go's ``queue.OutcomeEvent``.

    ``action`` is ``"ack"``, ``"retry"``, ``"defer"`` or ``"dead_letter"``;
    ``reason`` the policy's (``"success"`` for an ack, ``"crash_loop"`` and
    ``"malformed"`` for a job dead-lettered without running); ``klass`` the
    failure's class as the policy decided it (``"retryable"``,
    ``"permanent"``, ``"uncertain"``; ``""`` for a success or a job that did
    not run); ``delay_ms`` how long a retried or deferred job waits (0
    otherwise); ``error`` the handler's error (``""`` on success); ``job``
    the job as it was delivered (``id``, ``attempt``, ``job_type``, ...).
    """

    queue: str
    job: Any
    action: str
    reason: str
    klass: str
    delay_ms: int
    error: str


#: work's ``on_outcome``: called with each applied outcome.
OnOutcome = Callable[[OutcomeEvent], Any]


def check_on_outcome(on_outcome: Any) -> None:
    """work's ``on_outcome``: None or a callable."""
    if on_outcome is not None and not callable(on_outcome):
        raise TypeError("work: on_outcome must be callable (got %r)" % (on_outcome,))


def tell(on_outcome: Optional[OnOutcome], event: OutcomeEvent, log: logging.Logger) -> Any:
    """Calls ``on_outcome(event)``; what it raises is logged, never the
    worker's end. Returns what it returned (an awaitable, for the asyncio
    workers to await: ``atell``)."""
    if on_outcome is None:
        return None
    try:
        return on_outcome(event)
    except Exception:
        log.exception("queue %s: on_outcome raised for job %s", event.queue, getattr(event.job, "id", "?"))
        return None


async def atell(on_outcome: Optional[OnOutcome], event: OutcomeEvent, log: logging.Logger) -> None:
    """``tell`` for the asyncio workers: an awaitable it returns is awaited."""
    r = tell(on_outcome, event, log)
    if inspect.isawaitable(r):
        try:
            await r
        except Exception:
            log.exception("queue %s: on_outcome raised for job %s", event.queue, getattr(event.job, "id", "?"))


def check_job_type(where: str, name: str, v: Any) -> None:
    """A job type: 1..64 of [A-Za-z0-9_./-] (no ':', which separates the
    stats fields t:<type>:<counter>), as enqueue.lua checks it."""
    if not isinstance(v, str):
        raise TypeError("%s: %s must be a string (got %r)" % (where, name, v))
    if not JOB_TYPE.match(v):
        raise ValueError("%s: %s must be 1..64 of [A-Za-z0-9_./-] (got %r)" % (where, name, v))


def error_text(exc: Optional[BaseException]) -> str:
    """The text a job's last error is recorded with: ``Type: message``."""
    if exc is None:
        return ""
    s = str(exc)
    name = type(exc).__name__
    return "%s: %s" % (name, s) if s else name


def handler_timeout(v: Any, default: float) -> float:
    """work's ``handler_timeout`` in seconds (a number or a timedelta), or
    ``default`` for None."""
    if v is None:
        return default
    t = v.total_seconds() if isinstance(v, timedelta) else v
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        raise ValueError("work: handler_timeout must be a number of seconds > 0 or a timedelta (got %r)" % (v,))
    return float(t)


def jitter(seconds: float) -> float:
    """Spreads loop intervals ±20% so a fleet of workers does not poll the
    broker in step."""
    return seconds * (0.8 + 0.4 * random.random()) if seconds > 0 else 0.0


def check_metrics(queue: str, metrics: Any) -> None:
    """work's ``metrics``: from ``backstop.metrics.create_metrics``, with the queue's name as target."""
    if metrics is None:
        return
    if not callable(getattr(metrics, "attempt", None)):
        raise TypeError("work: metrics must come from backstop.metrics.create_metrics (got %r)" % (metrics,))
    if metrics.target != queue:
        raise ValueError("work: metrics must have target %r, the queue's name (got %r)" % (queue, metrics.target))


def typed_policies(policies: Optional[Mapping[str, Policy]], metrics: Any) -> Dict[str, Tuple[Policy, Any]]:
    """work's ``policies``: job type -> (policy, metrics), checked; a type's
    policy is recorded under policy=<type> in the worker's families."""
    if policies is None:
        return {}
    if not isinstance(policies, Mapping):
        raise TypeError("work: policies must be a mapping of job type to Policy (got %s)" % type(policies).__name__)
    out: Dict[str, Tuple[Policy, Any]] = {}
    for t, p in policies.items():
        check_job_type("work", "policies key", t)
        if not isinstance(p, Policy):
            raise TypeError("work: policies[%r] must be a Policy (got %s)" % (t, type(p).__name__))
        m = metrics
        if isinstance(metrics, Metrics):
            m = Metrics(t, metrics.target, metrics._fam)
        out[t] = (p, m)
    return out


# The Redis queue's names, from when this module was the Redis queue.
_REDIS = frozenset(("AsyncHandler", "AsyncQueue", "Handler", "Job", "Keys", "Outcome", "Payload", "Promoted", "Queue",
                    "Ran", "Reclaimed", "Stats", "script_source", "log"))


def __getattr__(name: str) -> Any:
    """``backstop.queue.Queue`` and the other Redis names: deprecated
    aliases of ``backstop.redis``'s (imported on first use, so that this
    module needs no redis-py)."""
    if name not in _REDIS:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    warnings.warn("backstop.queue.%s is deprecated: use backstop.redis.%s (backstop.queue is broker-neutral now)"
                  % (name, name), DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module("backstop.redis"), name)
