"""What a queue worker decides about a job, whatever the broker: the plan
(ack, retry, defer, dead letter) from the handler's outcome and the policy,
the breaker's gate before a job runs, and the worker's metrics, with the
``Runner`` that takes these steps for each job. Shared by
``backstop.redis`` and ``backstop.rabbitmq``; imports no broker
client."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from ._deadline import DeadlineExceeded
from ._errors import InputError
from ._policy import Decision, Policy
from .metrics import Metrics
from .queue import JobLike, check_job_type, error_text

#: (action, reason, decision, last error, delay ms): what to do about a job.
Plan = Tuple[str, str, Optional[Decision], str, int]

# Decisions that defer a job instead of dead-lettering it (on_open: defer).
DEFERRED = frozenset(("circuit_open", "budget_exhausted"))
OPEN_POLL_MS = 1000  # a refused job's wait when the policy cannot say how long


def plan(job: JobLike, exc: Optional[BaseException], policy: Policy,
         classify: Callable[[BaseException], Dict[str, Any]], malformed: str, now_ms: int,
         enqueue_now_ms: Optional[int] = None) -> Plan:
    """What to do about a job's outcome. Deciding is local (backstop.wasm);
    only the move that follows talks to the broker. ``malformed`` is the
    error a malformed job is dead-lettered with. ``enqueue_now_ms`` is now on
    the clock that stamped ``first_enqueued_ms`` (the Redis server's): the
    job's elapsed time is measured on it (default ``now_ms``)."""
    if job.malformed:
        return "dead_letter", "malformed", None, malformed + (" (%s)" % error_text(exc) if exc is not None else ""), 0
    if exc is None:
        policy.record_success()
        return "ack", "success", None, "", 0
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
        d = policy.decide(fields)
    except InputError as e:
        return "dead_letter", "malformed", None, "%s (policy refused the failure: %s)" % (text, e), 0
    if d.retry:
        return "retry", d.reason, d, text, d.delay_ms
    if d.reason in DEFERRED and on_open(policy) != "dead_letter":
        # Not the job's fault: it waits (until the breaker may half-open, or
        # its backoff for the budget, which budget_exhausted carries; 0 only
        # without a backoff: poll rather than spin), spending no attempt.
        delay = d.delay_ms if d.delay_ms > 0 else OPEN_POLL_MS
        if d.reason == "circuit_open":
            delay = refused_for(policy) or OPEN_POLL_MS
        return "defer", d.reason, d, text, delay
    return "dead_letter", d.reason, d, text, 0


def gate(job: JobLike, policy: Policy) -> Optional[Plan]:
    """The plan for a job the breaker refuses before it runs (acquire), or
    None when it may run."""
    if job.malformed:
        return None
    retry_in = refused_for(policy)
    if retry_in is None:
        return None
    if on_open(policy) == "dead_letter":
        return "dead_letter", "circuit_open", None, "circuit breaker open: the job was not run", 0
    return "defer", "circuit_open", None, "", retry_in


def on_open(policy: Policy) -> str:
    return getattr(policy, "on_open", "defer")


def refused_for(policy: Policy) -> Optional[int]:
    """How long (ms) the policy's breaker refuses a call now (acquire), or
    None when it allows one. A policy that cannot answer allows: its
    decision after the call still applies."""
    acquire = getattr(policy, "acquire", None)
    if acquire is None:
        return None
    try:
        permit = acquire()
    except Exception:
        return None
    if permit.allowed:
        return None
    return permit.retry_in_ms if permit.retry_in_ms > 0 else OPEN_POLL_MS


def check_metrics(queue: str, metrics: Any) -> None:
    if metrics is None:
        return
    if not callable(getattr(metrics, "attempt", None)):
        raise TypeError("work: metrics must come from backstop.metrics.create_metrics (got %r)" % (metrics,))
    if metrics.target != queue:
        raise ValueError("work: metrics must have target %r, the queue's name (got %r)" % (queue, metrics.target))


def count(metrics: Any, policy: Policy, job: JobLike, p: Plan, gated: bool) -> None:
    """Counts a job's outcome in the worker's metrics (the families
    @policy.retry exports; target = the queue): a job the breaker refused
    before it ran is refused; a failed job deferred (the breaker opened, the
    budget ran out) is a retry with that reason."""
    if metrics is None or job.malformed:
        return
    action, reason = p[0], p[1]
    if gated:
        metrics.refused("circuit_open")
    elif action == "ack":
        metrics.attempt("success")
    elif action in ("retry", "defer"):
        metrics.attempt("retry")
        metrics.retry(reason, p[4])
    else:
        metrics.attempt("dead_letter")
    if getattr(policy, "stateful", False):
        metrics.state(policy.circuit_state())
        metrics.budget(policy.budget_tokens())


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


def deadline_passed(log: logging.Logger, queue: str, job: JobLike, e: DeadlineExceeded) -> None:
    """Logs a handler that did not end by its deadline (the job fails as a
    timeout): once, and whether it still runs."""
    log.warning("queue %s: job %s (attempt %d): %s, failed as a timeout%s", queue, job.id, job.attempt, e,
                "; the handler still runs, abandoned" if e.abandoned else "")


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
                 malformed: str) -> None:
        self.log, self.queue, self.default, self.typed = log, queue, (policy, metrics), typed
        self.classify, self.malformed = classify, malformed

    def policy_for(self, job: JobLike) -> Tuple[Policy, Any]:
        """The policy and metrics a job runs with: its type's own
        (``policies=``), else the worker's."""
        return self.typed.get(job.job_type, self.default)

    def own(self, job: JobLike) -> bool:
        """Whether the job's type has a policy of its own (its breaker
        defers its jobs without pausing the worker)."""
        return job.job_type in self.typed

    gate = staticmethod(gate)

    def failure(self, job: JobLike, e: Exception) -> Exception:
        """The handler's exception, as the job's outcome; a missed deadline
        is logged (once, and whether the handler still runs)."""
        if isinstance(e, DeadlineExceeded):
            deadline_passed(self.log, self.queue, job, e)
        return e

    def plan(self, job: JobLike, exc: Optional[BaseException], policy: Policy, now_ms: int,
             enqueue_now_ms: Optional[int] = None) -> Plan:
        """What to do about the handler's outcome (``exc`` None: success);
        ``enqueue_now_ms`` as ``plan``'s."""
        return plan(job, exc, policy, self.classify, self.malformed, now_ms, enqueue_now_ms)

    count = staticmethod(count)
