"""``backstop.redis.Queue``: the Redis queue over a synchronous redis-py
client. The I/O layer only: each method runs an operation of the core
(``_core.py``) by doing its steps with the client, the worker's handler in
a thread of its own."""

from __future__ import annotations

import inspect
import threading
from datetime import datetime, timedelta
from typing import Any, Callable, List, Mapping, Optional, Sequence, Union

import redis

from .. import _decide
from .. import queue as _queue
from .._deadline import run_within
from .._policy import Policy
from .._retry import Classify
from ._core import (Handle, Handler, Job, Keys, Outcome, Pause, Payload, Promoted, Ran, Reclaimed, Stats, Step, Steps, T,
                    _Base, advance)
from ._core import Tell, log


def drive(steps: Steps[T], do: Callable[[Step], Any]) -> T:
    """Runs an operation of the core: ``do(step)`` does each step's I/O."""
    done, v = advance(steps)
    while not done:
        try:
            reply = do(v)
        except Exception as e:
            done, v = advance(steps, error=e)
        else:
            done, v = advance(steps, reply)
    return v  # type: ignore[no-any-return]


class Queue(_Base):
    """One queue in Redis, over a redis-py client: ``redis.Redis`` (also
    Sentinel's ``master_for``) or ``redis.RedisCluster``, with or without
    ``decode_responses``. Safe to share between threads (redis-py's
    connection pool is).

    ``keys`` overrides the default key layout (``Keys.for_queue(name)``),
    ``group`` names the consumer group (default ``"workers"``). Redis errors
    (``redis.exceptions.RedisError``) propagate; invalid arguments raise
    ``ValueError`` or ``TypeError`` before anything is sent.
    """

    def __init__(self, client: Any, name: str, *, keys: Optional[Keys] = None, group: str = "workers") -> None:
        if inspect.iscoroutinefunction(getattr(client, "execute_command", None)):
            raise TypeError("Queue needs a synchronous redis client; use AsyncQueue with redis.asyncio")
        super().__init__(client, name, keys=keys, group=group)

    def _drive(self, steps: Steps[T]) -> T:
        return drive(steps, self._call)

    def ensure_group(self) -> bool:
        """Creates the jobs stream and its consumer group (reading from the
        start) when missing; True when it created the group."""
        return self._drive(self._ensure_group_steps())

    def enqueue(self, job_id: str, payload: Payload = b"", job_type: Optional[str] = None) -> str:
        """Adds a job and returns its stream entry id. ``job_id`` is its
        stable identity (the idempotency key); the server's clock stamps
        ``first_enqueued_ms``; ``attempt`` starts at 1. ``job_type`` (None or
        "": untyped) is 1..64 of ``[A-Za-z0-9_./-]``: its outcomes are
        counted per type, and ``work(policies=...)`` picks its policy."""
        return self._drive(self._enqueue_steps(job_id, payload, job_type))

    def ack(self, entry: Union[str, Job]) -> bool:
        """Records a success (the entry is acked, deleted and counted in
        one step). False when the entry was no longer pending."""
        return self._drive(self._ack_steps(entry))

    def retry(self, entry: Union[str, Job], delay_ms: Union[int, timedelta], reason: str,
              last_error: str = "") -> Optional[int]:
        """Moves the job to the delayed set, due ``delay_ms`` from now by
        the server's clock, with its attempt incremented. ``reason`` is the
        decision's (``transient``, ``retry_after``, ``uncertain``). Returns
        the due time (unix ms), or None when the entry was no longer
        pending. A malformed entry is refused (``ResponseError``) and left
        pending: dead-letter it with reason ``"malformed"``."""
        return self._drive(self._later_steps("retry", entry, delay_ms, reason, last_error))

    def defer(self, entry: Union[str, Job], delay_ms: Union[int, timedelta], reason: str,
              last_error: str = "") -> Optional[int]:
        """Moves a job the policy refused to run (``reason``
        ``circuit_open`` or ``budget_exhausted``) back to the delayed set,
        due ``delay_ms`` from now by the server's clock, its attempt count
        unchanged: a deferral spends no attempt. ``last_error`` ``""`` keeps
        the entry's own. Counted in ``attempts:deferred`` and
        ``deferred:<reason>``, apart from retries. Returns the due time (unix
        ms), or None when the entry was no longer pending; a malformed entry
        is refused (``ResponseError``) as ``retry`` refuses it."""
        return self._drive(self._later_steps("defer", entry, delay_ms, reason, last_error))

    def dead_letter(self, entry: Union[str, Job], reason: str, last_error: str = "") -> Optional[str]:
        """Moves the job to the dead letter stream with ``reason`` and the
        last error (any entry, malformed ones too: every field is kept).
        Returns the DLQ entry id, or None when the entry was no longer
        pending."""
        return self._drive(self._dead_letter_steps(entry, reason, last_error))

    def promote(self, limit: int = 500) -> Promoted:
        """Moves at most ``limit`` (1..10000) due jobs from the delayed set
        to the stream, in one atomic step. Returns ``(moved,
        next_due_ms)``."""
        return self._drive(self._promote_steps(limit))

    def run(self, job_id: Optional[str] = None, *, due_before: Union[None, int, datetime] = None,
            limit: int = 100, actor: Optional[str] = None) -> Ran:
        """Moves delayed jobs to the stream now, before they are due, in one
        atomic step counted in ``force_run`` (Cloud Tasks' RunTask): the job
        whose job id is ``job_id``, or at most ``limit`` (1..10000) jobs due at
        or before ``due_before`` (an aware datetime or unix ms), earliest
        first. A member that is not a job ``retry`` wrote moves raw, as
        ``promote`` moves it. Returns ``(moved, left)``: ``moved`` is 0 when
        the job id is not in the delayed set. With ``actor`` (who, 1..256
        bytes), each job moved is recorded in the audit stream
        (``keys.audit``: action ``run``, actor, at_ms, id, reason), as the Go
        CLI's ``queue run`` records its own."""
        return self._drive(self._run_steps(job_id, due_before, limit, actor))

    def reclaim(self, consumer: str, *, min_idle_ms: Union[int, timedelta] = 60_000, count: int = 100,
                max_deliveries: int = 5) -> Reclaimed:
        """Takes over at most ``count`` (1..1000) entries pending for longer
        than ``min_idle_ms`` (their consumer crashed) for ``consumer``.
        Entries already delivered ``max_deliveries`` times go to the DLQ as
        ``crash_loop`` instead. Returns ``(dead_lettered, jobs)``: process
        the jobs as if read."""
        return self._drive(self._reclaim_steps(consumer, min_idle_ms, count, max_deliveries))

    def replay(self, limit: int = 1000, reason: Optional[str] = None, *, job_type: Optional[str] = None,
               actor: Optional[str] = None) -> int:
        """Moves at most ``limit`` dead letters (those with ``reason`` only,
        when given, and of ``job_type`` only, when given), oldest first, back
        to the stream with the attempt reset to 1, in bounded batches.
        Returns how many moved. With ``actor`` (who, 1..256 bytes), each one
        is recorded first in the audit stream (``keys.audit``: action
        ``replay``, actor, at_ms, id, reason, type, dlq_entry), as the Go
        CLI's ``dlq replay`` records its own."""
        return self._drive(self._replay_steps(limit, reason, job_type, actor))

    def hold(self, consumer: str, entries: Sequence[Union[str, Job]]) -> List[bool]:
        """Keeps entries pending to ``consumer`` from being reclaimed,
        without delivering them again: their idle time is reset (XCLAIM ...
        JUSTID), their delivery count left alone. Returns, per entry,
        whether ``consumer`` holds it: False for one pending to another
        consumer (left alone) or no longer pending. Redis runs it when it
        refuses ``ack``, ``retry`` and ``dead_letter`` for lack of memory
        (maxmemory with noeviction). At most 1000 entries."""
        return self._drive(self._hold_steps(consumer, entries))

    def read(self, consumer: str, *, count: int = 16, block_ms: Optional[Union[int, timedelta]] = None) -> List[Job]:
        """Reads at most ``count`` new jobs for ``consumer`` with the
        consumer group (XREADGROUP ``>``), waiting up to ``block_ms`` for
        one (None: not at all). Every job read must get an outcome
        (``apply``, or ``ack``/``retry``/``dead_letter``), or it stays
        pending until ``reclaim``."""
        return self._drive(self._read_steps(consumer, count, block_ms))

    def stats(self) -> Stats:
        """The queue's sizes and counters, in one round trip."""
        return self._drive(self._stats_steps())

    def apply(self, job: Job, exc: Optional[BaseException], policy: Policy, *,
              classify: Optional[Classify] = None) -> Outcome:
        """Applies the outcome of running ``job``: ``exc`` is the exception
        it raised, or None for a success (acked, and reported to the
        policy's budget and breaker).

        The exception is described as ``Policy.retry`` does (``classify``,
        else ``backstop.describe``; a ``RetryError``, a ``@policy.retry``
        in the handler that gave up, by its last exception, marked
        ``retried_downstream`` unless it is ``circuit_open``: the default
        policy dead-letters it rather than retry it again, docs/layers.md)
        and decided with the job's ``attempt``, its id as the idempotency
        key and the time since ``first_enqueued_ms`` as ``elapsed_ms``; a
        retry goes to the delayed set after the decided delay, anything else
        to the DLQ with the decision's reason. A malformed job is
        dead-lettered with reason ``malformed``, as is a failure the policy
        refuses (``InputError``, from a ``classify`` returning bad fields).
        """
        return self._drive(self._apply_steps(job, exc, policy, classify))

    def _move(self, job: Job, plan: _decide.Plan) -> Outcome:
        """One attempt at applying a plan (``_plan``)."""
        return self._drive(self._move_steps(job, plan))

    def work(self, policy: Policy, handler: Handler, *, consumer: Optional[str] = None,
             stop: Optional[threading.Event] = None, classify: Optional[Classify] = None, batch: int = 16,
             block_ms: int = 1000, promote_every: float = 1.0, promote_limit: int = 500,
             reclaim_every: float = 30.0, min_idle_ms: int = 60_000, max_deliveries: int = 5,
             metrics: Any = None, policies: Optional[Mapping[str, Policy]] = None,
             handler_timeout: Union[None, float, timedelta] = None, on_outcome: Any = None) -> None:
        """Consumes the queue until ``stop`` is set: reads jobs (``batch`` at
        a time, blocking up to ``block_ms``), calls ``handler(job)`` and
        applies its outcome with ``apply``; every ``promote_every`` seconds
        it promotes due retries, every ``reclaim_every`` seconds it reclaims
        entries idle for ``min_idle_ms`` (0 turns a step off; intervals are
        jittered ±20%). A malformed job is dead-lettered without calling the
        handler. On stop it finishes the batch it read, applying every
        outcome, and returns. Errors talking to Redis are logged
        (``backstop.queue``) and retried after a second. Each crash loop
        reclaim could not dead-letter (``Reclaimed.skipped``: it stays
        pending) is logged as an error, as the Go worker logs it. A
        handler's ``BaseException`` (``KeyboardInterrupt``) ends the loop
        and leaves its entry pending for ``reclaim``.

        When Redis refuses to apply an outcome for a while (out of memory
        with noeviction, a read-only replica during a failover, a server
        loading or busy, a lost connection), the worker keeps the outcome,
        decided once, and sends it again with jittered backoff (20 ms
        doubling to at most 2 s and a quarter of ``min_idle_ms``) until
        Redis takes it or the entry is no longer pending. Meanwhile it holds
        the job and the jobs read with it (``hold``), so that reclaim does
        not run them a second time elsewhere, and reads nothing new. Stopped
        meanwhile, it makes one last attempt and logs that the outcome was
        not applied: the entry stays pending, for ``reclaim``. A request
        Redis rejects as such (bad arguments, a key of the wrong type) is
        logged and not sent again. The log says when an outcome is first
        refused and after how many refusals it was applied. A job that
        waited in its batch for half of ``min_idle_ms`` is held again before
        it runs, and skipped when another consumer took it meanwhile.

        Before each job the worker asks the policy's breaker
        (``policy.acquire``): refused, the handler is not called, the job is
        deferred (``defer``; dead-lettered as ``circuit_open`` when
        ``policy.on_open`` is ``"dead_letter"``), and the worker reads
        nothing until ``retry_in_ms`` has passed (``stop`` ends the wait;
        promoting and reclaiming go on). In half-open only the admitted
        trials run. A failure the policy answers with ``circuit_open`` or
        ``budget_exhausted`` is deferred the same way.

        ``metrics`` (``backstop.metrics.create_metrics(policy_name,
        queue_name)``: its target must be this queue's name) counts the
        outcomes in the ``backstop_client_*`` families ``@policy.retry``
        exports: a job the breaker refused before it ran as ``refused``, a
        deferred failure as a retry with its reason.

        Each handler runs within ``handler_timeout`` seconds (default 5 x
        ``min_idle_ms``; 5 minutes when ``min_idle_ms`` is 0), in a thread
        of its own, while the worker holds the job and the rest of its
        batch (``hold``, every ``min_idle_ms``/3, at least 10 ms) so that
        no reclaim takes a job whose worker is alive. At the deadline the
        thread is abandoned (Python cannot stop it: it runs on, its result
        dropped; the log says so) and the job fails with
        ``backstop.DeadlineExceeded``, error kind ``timeout``, decided and
        applied like any failure. ``backstop.attempt_time_left()`` in the
        handler gives what is left of it.

        ``on_outcome`` (a callable, or None) is called with a
        ``backstop.queue.OutcomeEvent`` for each outcome the worker applied
        (the script ran on the pending entry): successes, retries,
        deferrals, dead letters (malformed entries too), as Node's
        ``onOutcome`` and Go's ``WithOutcomeHook``, for per-job alerting
        (docs/monitoring.md, "Page on a dead letter of a job type"). It runs
        in the worker's loop, before the next job: keep it short. What it
        raises is logged (``backstop.queue``), and the worker goes on.
        """
        stop = stop or threading.Event()

        def do(step: Step) -> Any:
            if isinstance(step, Pause):
                stop.wait(step.seconds)
            elif isinstance(step, Handle):
                job, ids = step.job, step.ids

                def hold(done: threading.Event, left: float) -> None:
                    # The heartbeat: reclaim leaves a job alone while its worker holds it.
                    if not done.wait(min(left, step.beat)):
                        try:
                            self.hold(step.consumer, ids)
                        except (redis.RedisError, ValueError):
                            pass

                run_within(lambda: handler(job), step.timeout, "handler", hold)
            elif isinstance(step, Tell):
                _queue.tell(step.on_outcome, step.event, log)
            else:
                return self._call(step)
            return None

        drive(self._work_steps(policy, stop, consumer, classify, batch, block_ms, promote_every, promote_limit,
                               reclaim_every, min_idle_ms, max_deliveries, metrics, policies, handler_timeout,
                                     on_outcome), do)
