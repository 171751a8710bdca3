"""What a queue worker does about a job, whatever the broker: the core
decides it (``Policy.outcome``, the module's ``outcome`` export) and the
``Runner`` here only describes the job's event, asks, and counts what the
answer says. Shared by ``backstop.redis`` and ``backstop.rabbitmq``;
imports no broker client."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple

from ._deadline import DeadlineExceeded
from ._errors import InputError
from ._host._contract import Outcome
from ._policy import Policy
from .queue import JobLike, OnOutcome, OutcomeEvent, error_text


class Plan(NamedTuple):
    """What to do about a job: the move a worker applies, and what it counts."""

    action: str  # ack, retry, defer or dead_letter
    reason: str
    decision: Optional[Outcome]  # the core's outcome of the handler's failure
    error: str  # the job's last error
    delay_ms: int
    count: str = "none"  # the client metric (Outcome.count)


def plan(job: JobLike, exc: Optional[BaseException], policy: Policy,
         classify: Callable[[BaseException], Dict[str, Any]], malformed: str, now_ms: int,
         enqueue_now_ms: Optional[int] = None) -> Plan:
    """What to do about a job's outcome. Deciding is local (backstop.wasm);
    only the move that follows talks to the broker. ``malformed`` is the
    error a malformed job is dead-lettered with. ``enqueue_now_ms`` is now on
    the clock that stamped ``first_enqueued_ms`` (the Redis server's): the
    job's elapsed time is measured on it (default ``now_ms``)."""
    if job.malformed:
        return Plan("dead_letter", "malformed", None, malformed + (" (%s)" % error_text(exc) if exc is not None else ""), 0)
    if exc is None:
        o = policy.outcome("success", now_ms=now_ms)
        return Plan(o.action, o.reason, None, "", o.delay_ms, o.count)
    # A RetryError is a @policy.retry inside the handler giving up: classify
    # (classifier) reads its last exception and marks it retried_downstream
    # (unless circuit_open: no call made), so the job is dead-lettered with
    # retried_downstream rather than retried again (docs/layers.md).
    fields = classify(exc)
    # A queue job has no method: it is not gated (docs/policy.md); the job
    # id is its idempotency key.
    fields.pop("method", None)
    fields.update(attempt=job.attempt, idempotency_key=job.id, now_ms=now_ms,
                  elapsed_ms=max(0, (now_ms if enqueue_now_ms is None else enqueue_now_ms) - job.first_enqueued_ms),
                  prev_delay_ms=job.prev_delay_ms)
    text = error_text(exc)
    try:
        o = policy.outcome("failure", fields)
    except InputError as e:
        return Plan("dead_letter", "malformed", None, "%s (policy refused the failure: %s)" % (text, e), 0, "dead_letter")
    return Plan(o.action, o.reason, o, text, o.delay_ms, o.count)


def gate(job: JobLike, policy: Policy) -> Optional[Plan]:
    """The plan for a job the breaker refuses before it runs, or None when
    it may run. A policy that cannot answer allows: its outcome after the
    call still applies."""
    if job.malformed:
        return None
    try:
        o = policy.outcome("before")
    except Exception:
        return None
    if o.action == "run":
        return None
    text = "circuit breaker open: the job was not run" if o.action == "dead_letter" else ""
    return Plan(o.action, o.reason, None, text, o.delay_ms, o.count)


def count(metrics: Any, policy: Policy, job: JobLike, p: Plan) -> None:
    """Counts a job's outcome in the worker's metrics (the families
    @policy.retry exports; target = the queue), as the outcome's ``count``
    says, then the breaker's state and the budget."""
    if metrics is None or job.malformed:
        return
    if p.count == "refused":
        metrics.refused(p.reason)
    elif p.count == "retry":
        metrics.attempt("retry")
        metrics.retry(p.reason, p.delay_ms)
    elif p.count != "none":
        metrics.attempt(p.count)
    if getattr(policy, "stateful", False):
        metrics.state(policy.circuit_state())
        metrics.budget(policy.budget_tokens())


def measure(metrics: Any, job: JobLike, now_ms: int) -> None:
    """Records the latency of a retried job as it starts (as Go's Runner):
    now_ms (the broker's clock) minus the failure's time, its due time minus
    the delay decided then. A job deferred since its failure (the breaker,
    the budget) is not measured: its due time is the deferral's."""
    due, prev = getattr(job, "due_ms", 0) or 0, job.prev_delay_ms
    if (metrics is None or job.malformed or job.attempt < 2 or due <= 0 or prev < 0 or prev > due
            or job.last_reason in ("circuit_open", "budget_exhausted")):
        return
    metrics.latency(now_ms - (due - prev))


class Runner:
    """The steps around a decision that a worker takes for each job,
    whatever the broker (as Go's ``queue.Runner`` serves both brokers):
    the job's policy and metrics (its type's own, ``policies=``), the
    breaker's gate before the handler runs, the handler's failure (a
    missed deadline logged), the plan for its outcome, and the count in
    the worker's metrics. No I/O: ``backstop.redis`` and both
    ``backstop.rabbitmq`` workers run the handler and apply the plan."""

    def __init__(self, log: logging.Logger, queue: str, policy: Policy, metrics: Any,
                 typed: Mapping[str, Tuple[Policy, Any]], classify: Callable[[BaseException], Dict[str, Any]],
                 malformed: str, on_outcome: Optional[OnOutcome] = None) -> None:
        self.log, self.queue, self.default, self.typed = log, queue, (policy, metrics), typed
        self.classify, self.malformed, self.on_outcome = classify, malformed, on_outcome

    def event(self, job: JobLike, p: Plan) -> OutcomeEvent:
        """The ``on_outcome`` event of an applied plan."""
        klass = p.decision.klass if p.decision is not None else ""
        delay = p.delay_ms if p.action in ("retry", "defer") else 0
        return OutcomeEvent(self.queue, job, p.action, p.reason, klass, delay, p.error)

    def policy_for(self, job: JobLike) -> Tuple[Policy, Any]:
        """The policy and metrics a job runs with: its type's own
        (``policies=``), else the worker's."""
        return self.typed.get(job.job_type, self.default)

    def own(self, job: JobLike) -> bool:
        """Whether the job's type has a policy of its own (its breaker
        defers its jobs without pausing the worker)."""
        return job.job_type in self.typed

    gate = staticmethod(gate)
    count = staticmethod(count)
    measure = staticmethod(measure)

    def failure(self, job: JobLike, e: Exception) -> Exception:
        """The handler's exception, as the job's outcome; a missed deadline
        (failed as a timeout) is logged once, and whether the handler still runs."""
        if isinstance(e, DeadlineExceeded):
            self.log.warning("queue %s: job %s (attempt %d): %s, failed as a timeout%s", self.queue, job.id,
                             job.attempt, e, "; the handler still runs, abandoned" if e.abandoned else "")
        return e

    def plan(self, job: JobLike, exc: Optional[BaseException], policy: Policy, now_ms: int,
             enqueue_now_ms: Optional[int] = None, took: Optional[float] = None) -> Plan:
        """What to do about the handler's outcome (``exc`` None: success);
        ``enqueue_now_ms`` as ``plan``'s. ``took`` is how long the handler
        ran, in seconds on the monotonic clock: reported first to the
        breaker's slow-call rate."""
        if took is not None and getattr(policy, "stateful", False) and hasattr(policy, "record_duration"):
            try:
                policy.record_duration(max(0, int(took * 1000)), now_ms)
            except Exception:  # the outcome below applies all the same
                self.log.exception("queue %s: job %s: the run's duration not recorded", self.queue, job.id)
        return plan(job, exc, policy, self.classify, self.malformed, now_ms, enqueue_now_ms)
