"""The queue families a RabbitMQ worker counts itself (the broker cannot
count outcomes by reason): the names the exporter gives the Redis stats
hash, as the Go worker's ``WithMetrics`` exports them, with ``job_type``."""

from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, Optional, Set, Tuple

from .. import queue as _queue
from .. import _decide
from ..metrics import Metrics, create_metrics, register_families
from ._core import Job

#: backstop_job_attempts buckets: the exporter's (exporter/stats.go attemptBuckets).
ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50)
#: How many job types a queue labels by name; the rest, and invalid ones, are "other".
TYPE_LIMIT = 50

# (attribute, kind, name without _total, help, labels after queue and job_type),
# as internal/queuemetrics (Go) declares them.
_FAMILIES = (
    ("attempts", "Counter", "backstop_attempts",
     "Attempts by outcome (success, retry, dead_letter; deferred: a job the breaker or the budget refused, "
     "its attempt not spent), counted by the workers.", ("outcome",)),
    ("retries", "Counter", "backstop_retries", "Retries scheduled, by the policy's reason.", ("reason",)),
    ("deferrals", "Counter", "backstop_deferrals",
     "Jobs deferred without spending an attempt, by reason (circuit_open, budget_exhausted).", ("reason",)),
    ("dead_letters", "Counter", "backstop_dead_letters", "Jobs dead-lettered, by reason.", ("reason",)),
    ("max_attempts", "Counter", "backstop_max_attempts_reached",
     "Jobs dead-lettered because they used up their attempts.", ()),
    ("job_attempts", "Histogram", "backstop_job_attempts",
     "The attempt on which each job finished, by outcome (success, dead_letter).", ("outcome",)),
)

_registries: "weakref.WeakKeyDictionary[Any, Dict[str, Any]]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class QueueMetrics:
    """The queue families of one queue in one registry (shared by every
    worker of the queue in the process, and so is its type limit)."""

    def __init__(self, queue: str, fam: Dict[str, Any]) -> None:
        self.queue, self._fam = queue, fam
        self._types: Set[str] = set()

    def _type(self, t: str) -> str:
        if not t:
            return ""
        if not _queue.JOB_TYPE.match(t):
            return "other"
        with _lock:
            if t in self._types:
                return t
            if len(self._types) >= TYPE_LIMIT:
                return "other"
            self._types.add(t)
            return t

    def observe(self, job: Job, plan: _decide.Plan) -> None:
        """Counts an applied outcome as the Redis scripts count it in the
        stats hash."""
        action, reason = plan[0], plan[1]
        f, q, t = self._fam, self.queue, self._type(job.job_type)
        attempt = 0 if job.malformed or reason == "malformed" else job.attempt  # a due time past the bound too
        if action == "ack":
            f["attempts"].labels(q, t, "success").inc()
            self._finished(t, "success", attempt)
        elif action == "retry":
            f["attempts"].labels(q, t, "retry").inc()
            f["retries"].labels(q, t, reason).inc()
        elif action == "defer":
            f["attempts"].labels(q, t, "deferred").inc()
            f["deferrals"].labels(q, t, reason).inc()
        else:
            f["attempts"].labels(q, t, "dead_letter").inc()
            f["dead_letters"].labels(q, t, reason).inc()
            if reason == "max_attempts_reached":
                f["max_attempts"].labels(q, t).inc()
            self._finished(t, "dead_letter", attempt)

    def _finished(self, t: str, outcome: str, attempt: int) -> None:
        if attempt >= 1:
            self._fam["job_attempts"].labels(self.queue, t, outcome).observe(attempt)


_queues: "weakref.WeakKeyDictionary[Any, Dict[str, QueueMetrics]]" = weakref.WeakKeyDictionary()


def queue_metrics(registry: Any, queue: str) -> QueueMetrics:
    try:
        import prometheus_client  # noqa: F401
    except ImportError as e:
        raise ImportError("work(registry=...) needs prometheus_client: pip install prometheus-client") from e

    with _lock:
        fam = _registries.get(registry)
        if fam is None:
            fam = register_families(registry, _FAMILIES, ("queue", "job_type"), ATTEMPT_BUCKETS, "work")
            _registries[registry] = fam
            _queues[registry] = {}
        qm = _queues[registry].get(queue)
        if qm is None:
            qm = _queues[registry][queue] = QueueMetrics(queue, fam)
    return qm


def worker_metrics(registry: Any, policy: str, queue: str) -> Tuple[Optional[Metrics], Optional[QueueMetrics]]:
    """The worker's metrics in ``registry`` (None: none): the process
    families (``backstop_client_*``, target = the queue) and the queue
    families."""
    if registry is None:
        return None, None
    return create_metrics(policy, queue, registry), queue_metrics(registry, queue)
