"""backstop.queue: the Redis queue contract for Python workers.

Jobs live in a Redis stream with a consumer group, cold retries in a delayed
sorted set, dead letters in a stream and counters in a hash; every move
between them is one atomic Lua script (the ones in ``backstop/scripts``,
copies of the contract's ``contract/scripts``) that also acknowledges the
source entry, so a crash at any point loses nothing and an outcome is
applied at most once. ``Queue`` takes a redis-py client (``redis.Redis``,
``redis.RedisCluster``), ``AsyncQueue`` an asyncio one::

    import redis, backstop
    from backstop.queue import Queue

    q = Queue(redis.Redis(), "orders")
    q.ensure_group()
    q.enqueue("order-42", b'{"sku": 7}')
    for job in q.read("worker-1", block_ms=1000):
        try:
            handle(job)
        except Exception as exc:
            q.apply(job, exc, policy)   # retry (delayed), dead letter, as the policy decides
        else:
            q.apply(job, None, policy)  # ack

Needs the ``redis`` extra: ``pip install 'backstop-policy[redis]'``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import random
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from importlib import resources
from typing import Any, Awaitable, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

try:
    import redis
    from redis.exceptions import ResponseError
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("backstop.queue needs redis-py: pip install 'backstop-policy[redis]'") from e

from . import _decide
from ._deadline import DeadlineExceeded, await_within, run_within
from .metrics import Metrics
from ._policy import Decision, Policy
from ._retry import Classify, check_classify, classifier

__all__ = ["AsyncQueue", "Job", "Keys", "Outcome", "Promoted", "Queue", "Ran", "Reclaimed", "Stats"]

log = logging.getLogger("backstop.queue")

_INT = re.compile(r"[+-]?[0-9]+\Z")
_ATTEMPT = re.compile(r"[1-9][0-9]{0,13}\Z")
_DIGITS = re.compile(r"[0-9]+\Z")
# A full stream id, as the scripts want it: Redis reads "5000" as a range in XPENDING.
_ENTRY_ID = re.compile(r"(0|[1-9][0-9]{0,19})-(0|[1-9][0-9]{0,19})\Z")
# discard: the Go CLI's dlq delete / purge (shipped, not called here).
_SCRIPTS = ("enqueue", "ack", "retry", "defer", "dead_letter", "promote", "reclaim", "replay", "hold", "run", "discard")
_source_cache: Dict[str, str] = {}


def script_source(name: str) -> str:
    """The Lua source of one of the contract's scripts (``enqueue``, ``ack``,
    ``retry``, ``dead_letter``, ``promote``, ``reclaim``, ``replay``,
    ``hold``, ``run``, ``discard``) as sent to Redis: the package's ``scripts/lib.lua`` (the
    helpers the scripts share), a newline, then ``scripts/<name>.lua``."""
    if name not in _SCRIPTS:
        raise ValueError("unknown script %r (want one of %s)" % (name, ", ".join(_SCRIPTS)))
    src = _source_cache.get(name)
    if src is None:
        scripts = resources.files("backstop") / "scripts"
        lib = (scripts / "lib.lua").read_text("utf-8")
        src = _source_cache[name] = lib + "\n" + (scripts / (name + ".lua")).read_text("utf-8")
    return src


@dataclass(frozen=True)
class Keys:
    """The Redis keys of one queue. ``Keys.for_queue(name)`` is the default
    layout, ``{name}:jobs``, ``{name}:delayed``, ``{name}:dlq``,
    ``{name}:stats``: one hash tag, so the scripts work on a Redis Cluster.
    Name them by hand to drive an existing layout (on a cluster the four
    must still hash to one slot)."""

    jobs: str  # stream of work, with the consumer group
    delayed: str  # sorted set of cold retries, score = due time (unix ms)
    dlq: str  # stream of dead letters
    stats: str  # hash of counters

    @classmethod
    def for_queue(cls, name: str) -> Keys:
        tag = "{" + name + "}"
        return cls(tag + ":jobs", tag + ":delayed", tag + ":dlq", tag + ":stats")


@dataclass(frozen=True)
class Job:
    """A job as a worker sees it: one delivery of a stream entry.

    ``attempt`` is the 1-based number of this execution (it lives in Redis,
    so it survives crashes); ``id`` is the job's stable identity, the
    idempotency key a downstream can deduplicate on. ``malformed`` marks an
    entry without an id, a whole ``attempt`` >= 1 or ``first_enqueued_ms``:
    ``apply`` dead-letters it with reason ``malformed``; ``fields`` holds
    every field of the entry (text) to see why. An entry with none of
    backstop's fields (a plain producer's XADD) is not malformed but the
    job's first attempt (``from_entry``).
    """

    entry_id: str
    id: str
    attempt: int
    first_enqueued_ms: int
    payload: bytes
    last_error: str = ""  # the error of the previous attempt, after a retry
    last_reason: str = ""  # its retry reason, or the dead letter reason after a replay
    malformed: bool = False
    prev_delay_ms: int = 0  # the delay before this attempt (decorrelated backoff)
    fields: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    # The job type ("" untyped); one written by someone else may not be valid.
    job_type: str = ""

    @property
    def first_enqueued(self) -> datetime:
        """When the job was first enqueued (the server's clock), in UTC."""
        return datetime.fromtimestamp(self.first_enqueued_ms / 1000, timezone.utc)

    @classmethod
    def from_entry(cls, entry_id: Any, fields: Mapping[Any, Any]) -> Job:
        """A Job from a stream entry as redis-py returns it (bytes or str).

        A plain entry (one without any of the fields ``id``, ``attempt``,
        ``first_enqueued_ms``, ``malformed_delayed_member``: XADDed by a
        producer that does not know backstop) is the job's first attempt:
        its id is the entry id, ``first_enqueued_ms`` the entry id's time,
        its payload the ``payload`` field, or without one every field as a
        JSON object, each name (in bytewise order) to its last value."""
        f = {_text(k): v for k, v in fields.items()}
        eid = _text(entry_id)
        if not any(k in f for k in _NOT_PLAIN):
            ms = _whole(eid.partition("-")[0])
            if ms is not None and 0 <= ms <= _MAX_SAFE:
                payload = _bytes(f["payload"]) if "payload" in f else _fields_json(fields)
                return cls(eid, eid, 1, ms, payload, fields={k: _text(v) for k, v in f.items()},
                           job_type=_text(f.get("type", "")))
        jid = _text(f.get("id", ""))
        attempt, first = _whole(f.get("attempt")), _whole(f.get("first_enqueued_ms"))
        # The scripts' rule (retry.lua): digits only, attempt in 1..1e14.
        malformed = (not jid or not _ATTEMPT.match(_text(f.get("attempt", "")))
                     or not _DIGITS.match(_text(f.get("first_enqueued_ms", ""))))
        return cls(eid, jid, attempt or 0, first or 0, _bytes(f.get("payload", b"")),
                   _text(f.get("last_error", "")), _text(f.get("last_reason", "")), malformed,
                   max(0, _whole(f.get("prev_delay_ms")) or 0), {k: _text(v) for k, v in f.items()},
                   job_type=_text(f.get("type", "")))


# A plain entry has none of these (the spec's plain producers); the last is
# what a delayed member that was not JSON leaves in the entry promote wrote.
_NOT_PLAIN = ("id", "attempt", "first_enqueued_ms", "malformed_delayed_member")
_MAX_SAFE = (1 << 53) - 1  # an entry id's ms part above it: malformed (no exact double for every script)
_JSON_ESCAPE = re.compile(rb'[\x00-\x1f"\\]')


def _json_byte(m: "re.Match[bytes]") -> bytes:
    b = m.group(0)[0]
    return b"\\u%04x" % b if b < 0x20 else b"\\" + m.group(0)


def _raw(v: Any) -> bytes:
    """A field name or value as the bytes Redis holds."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    return ("" if v is None else str(v)).encode("utf-8", "surrogateescape")


def _fields_json(fields: Union[Mapping[Any, Any], Sequence[Tuple[Any, Any]]]) -> bytes:
    """The payload of a plain entry without a ``payload`` field: a JSON
    object of every field name to its last value, the names in bytewise
    (UTF-8) order, no spaces; only ``\\``, ``"`` and the bytes below 0x20
    (``\\u00xx``) escaped, every other byte as it is (so not always UTF-8).
    ``fields`` is a mapping or (name, value) pairs in entry order (bytes
    or str)."""
    items = fields.items() if isinstance(fields, Mapping) else fields
    last: Dict[bytes, bytes] = {}
    for k, v in items:
        last[_raw(k)] = _raw(v)
    q = lambda b: b'"' + _JSON_ESCAPE.sub(_json_byte, b) + b'"'  # noqa: E731
    return b"{" + b",".join(q(k) + b":" + q(last[k]) for k in sorted(last)) + b"}"


@dataclass(frozen=True)
class Outcome:
    """What ``apply`` did with a job.

    ``action`` is ``"ack"``, ``"retry"``, ``"defer"`` or ``"dead_letter"``;
    ``reason`` is ``"success"`` for an ack, the decision's reason, or
    ``"malformed"``; ``decision`` is the policy's ``Decision`` (``None`` for
    an ack, a malformed entry, or a job the breaker refused before it ran).
    A ``"defer"`` (``circuit_open``, ``budget_exhausted``) puts the job back
    in the delayed set, its attempt unchanged, due in ``delay_ms``. ``applied`` is False when the entry was no longer
    pending (another worker moved it first): then nothing changed. A retry
    gives its ``due_ms`` (unix ms, the server's clock), a dead letter its
    ``dlq_id``.
    """

    action: str
    reason: str
    decision: Optional[Decision]
    applied: bool
    due_ms: Optional[int] = None
    dlq_id: Optional[str] = None
    delay_ms: Optional[int] = None


class Promoted(NamedTuple):
    moved: int  # due jobs moved from the delayed set to the stream
    next_due_ms: Optional[int]  # ms until the next one is due; None when the set is empty


class Ran(NamedTuple):
    moved: int  # delayed jobs moved to the stream; 0 when the id is not in the delayed set
    left: int  # jobs still due at or before due_before (beyond limit); 0 for an id


class _Reclaimed(NamedTuple):
    dead_lettered: int  # crash loops moved to the DLQ (reason crash_loop)
    jobs: List[Job]  # the entries claimed for the consumer, to process


class Reclaimed(_Reclaimed):
    """What ``reclaim`` did: ``(dead_lettered, jobs)``, and ``skipped``, the
    crash loops the DLQ refused (a key of the wrong type, an entry too large
    for it, Redis out of memory) as ``(entry_id, reason)`` pairs: they stay
    pending, their delivery count unchanged, and are tried again after
    ``min_idle_ms`` (counted as ``reclaim_skipped``). Unpacks as a pair."""

    skipped: List[Tuple[str, str]]

    def __new__(cls, dead_lettered: int, jobs: List[Job], skipped: Sequence[Tuple[str, str]] = ()) -> "Reclaimed":
        self = super().__new__(cls, dead_lettered, jobs)
        self.skipped = list(skipped)
        return self


@dataclass(frozen=True)
class Stats:
    """A queue's sizes, read live, and its counters (the stats hash, e.g.
    ``counters["attempts:success"]``)."""

    jobs: int  # entries in the stream (pending ones included)
    pending: int  # delivered, without an outcome yet
    delayed: int
    dlq: int
    counters: Dict[str, int]


Payload = Union[bytes, bytearray, memoryview, str]
Handler = Callable[[Job], Any]
AsyncHandler = Callable[[Job], Union[Awaitable[Any], Any]]


class _Base:
    """What the sync and asyncio queues share: keys, arguments, replies."""

    def __init__(self, client: Any, name: str, *, keys: Optional[Keys] = None, group: str = "workers") -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("queue: name must be a non-empty string (got %r)" % (name,))
        if not isinstance(group, str) or not group:
            raise ValueError("queue: group must be a non-empty string (got %r)" % (group,))
        if keys is not None and not isinstance(keys, Keys):
            raise TypeError("queue: keys must be a backstop.queue.Keys (got %r)" % (keys,))
        self.client = client
        self.name = name
        self.keys = keys or Keys.for_queue(name)
        self.group = group
        self._scripts = {n: client.register_script(script_source(n)) for n in _SCRIPTS}

    def __repr__(self) -> str:
        return "%s(%r, group=%r, keys=%r)" % (type(self).__name__, self.name, self.group, self.keys)

    # Each operation: the script, its KEYS and ARGV, checked here so that a
    # mistake is a ValueError naming the argument rather than a script error.

    def _enqueue(self, job_id: str, payload: Payload, job_type: Optional[str]) -> Tuple[str, List[str], List[Any]]:
        if not isinstance(job_id, str) or not job_id:
            raise ValueError("enqueue: job_id must be a non-empty string (got %r)" % (job_id,))
        if job_type:
            _check_job_type("enqueue", "job_type", job_type)
        elif job_type is not None and not isinstance(job_type, str):
            raise TypeError("enqueue: job_type must be a string or None (got %r)" % (job_type,))
        if not isinstance(payload, (bytes, bytearray, memoryview, str)):
            raise TypeError("enqueue: payload must be bytes or str (got %s)" % type(payload).__name__)
        if isinstance(payload, (bytearray, memoryview)):
            payload = bytes(payload)
        args: List[Any] = [job_id, payload] + ([job_type] if job_type else [])
        return "enqueue", [self.keys.jobs, self.keys.stats], args

    def _ack(self, entry: Union[str, Job]) -> Tuple[str, List[str], List[Any]]:
        return "ack", [self.keys.jobs, self.keys.stats], [self.group, _entry("ack", entry)]

    def _retry(self, entry: Union[str, Job], delay_ms: Union[int, timedelta], reason: str,
               last_error: str) -> Tuple[str, List[str], List[Any]]:
        delay = _delay(delay_ms)
        _reason("retry", reason)
        return "retry", [self.keys.jobs, self.keys.delayed, self.keys.stats], \
            [self.group, _entry("retry", entry), delay, reason, _str_arg("retry", "last_error", last_error)]

    def _defer(self, entry: Union[str, Job], delay_ms: Union[int, timedelta], reason: str,
               last_error: str) -> Tuple[str, List[str], List[Any]]:
        delay = _delay(delay_ms)
        _reason("defer", reason)
        return "defer", [self.keys.jobs, self.keys.delayed, self.keys.stats], \
            [self.group, _entry("defer", entry), delay, reason, _str_arg("defer", "last_error", last_error)]

    def _dead_letter(self, entry: Union[str, Job], reason: str, last_error: str) -> Tuple[str, List[str], List[Any]]:
        _reason("dead_letter", reason)
        return "dead_letter", [self.keys.jobs, self.keys.dlq, self.keys.stats], \
            [self.group, _entry("dead_letter", entry), reason, _str_arg("dead_letter", "last_error", last_error)]

    def _promote(self, limit: int) -> Tuple[str, List[str], List[Any]]:
        _whole_in("promote", "limit", limit, 1, 10000)
        return "promote", [self.keys.delayed, self.keys.jobs, self.keys.stats], [limit]

    def _force_run(self, job_id: Optional[str], due_before: Union[None, int, datetime],
                   limit: int, cursor: str = "0") -> Tuple[str, List[str], List[Any]]:
        keys = [self.keys.delayed, self.keys.jobs, self.keys.stats]
        if (job_id is None) == (due_before is None):
            raise ValueError("run: give one of job_id and due_before (got job_id=%r, due_before=%r)" % (job_id, due_before))
        if job_id is not None:
            if not isinstance(job_id, str) or not job_id:
                raise ValueError("run: job_id must be a non-empty string (got %r)" % (job_id,))
            return "run", keys, ["id", job_id, cursor]
        if isinstance(due_before, datetime):
            if due_before.tzinfo is None:
                raise ValueError("run: due_before must be an aware datetime (got %r)" % (due_before,))
            due_before = int(due_before.timestamp() * 1000)
        _whole_in("run", "due_before", due_before, 0, None)
        _whole_in("run", "limit", limit, 1, 10000)
        return "run", keys, ["before", due_before, limit]

    def _reclaim(self, consumer: str, min_idle_ms: Union[int, timedelta], count: int,
                 max_deliveries: int) -> Tuple[str, List[str], List[Any]]:
        if not isinstance(consumer, str) or not consumer:
            raise ValueError("reclaim: consumer must be a non-empty string (got %r)" % (consumer,))
        idle = _ms("reclaim", "min_idle_ms", min_idle_ms)
        _whole_in("reclaim", "count", count, 1, 1000)
        _whole_in("reclaim", "max_deliveries", max_deliveries, 1, None)
        return "reclaim", [self.keys.jobs, self.keys.dlq, self.keys.stats], \
            [self.group, consumer, idle, count, max_deliveries]

    def _hold(self, consumer: str, entries: Sequence[Union[str, Job]]) -> Tuple[str, List[str], List[Any]]:
        if not isinstance(consumer, str) or not consumer:
            raise ValueError("hold: consumer must be a non-empty string (got %r)" % (consumer,))
        if isinstance(entries, (str, bytes, Job)) or not isinstance(entries, Sequence) or len(entries) > 1000:
            raise ValueError("hold: entries must be a sequence of at most 1000 entry ids or Jobs (got %r)" % (entries,))
        return "hold", [self.keys.jobs], [self.group, consumer, *(_entry("hold", e) for e in entries)]

    def _replay_batch(self, limit: int, reason: str, cursor: str, job_type: str = "") -> Tuple[str, List[str], List[Any]]:
        return "replay", [self.keys.dlq, self.keys.jobs, self.keys.stats], [limit, reason, cursor, limit * 10, job_type]

    def _xreadgroup(self, consumer: str, count: int, block_ms: Optional[Union[int, timedelta]]) -> Dict[str, Any]:
        if not isinstance(consumer, str) or not consumer:
            raise ValueError("read: consumer must be a non-empty string (got %r)" % (consumer,))
        _whole_in("read", "count", count, 1, None)
        if block_ms is not None:
            block_ms = _ms("read", "block_ms", block_ms)
        return dict(groupname=self.group, consumername=consumer, streams={self.keys.jobs: ">"},
                    count=count, block=block_ms)

    def _plan(self, job: Job, exc: Optional[BaseException], policy: Policy,
              classify: Callable[[BaseException], Dict[str, Any]]) -> Tuple[str, str, Optional[Decision], str, int]:
        """What to do about a job's outcome: (action, reason, decision,
        last error, delay ms). Deciding is local (backstop.wasm); only the
        move that follows talks to Redis."""
        if not isinstance(job, Job):
            raise TypeError("apply: job must be a backstop.queue.Job (got %s)" % type(job).__name__)
        return _decide.plan(job, exc, policy, classify, "malformed entry: needs id, attempt >= 1 and first_enqueued_ms",
                            int(time.time() * 1000))

    def _gate(self, job: Job, policy: Policy) -> Optional[Tuple[str, str, Optional[Decision], str, int]]:
        """The plan for a job the breaker refuses before it runs (acquire),
        or None when it may run."""
        return _decide.gate(job, policy)


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

    def _run(self, op: Tuple[str, List[str], List[Any]]) -> Any:
        name, keys, args = op
        # EVALSHA, and on NOSCRIPT, SCRIPT LOAD and EVALSHA again.
        return self._scripts[name](keys=keys, args=args)

    def ensure_group(self) -> bool:
        """Creates the jobs stream and its consumer group (reading from the
        start) when missing; True when it created the group."""
        try:
            self.client.xgroup_create(self.keys.jobs, self.group, id="0", mkstream=True)
        except ResponseError as e:
            if "BUSYGROUP" in str(e):
                return False
            # Redis refuses XGROUP CREATE before it looks for the group when
            # it refuses writes (out of memory, a read-only replica): a group
            # that exists is all a worker needs.
            try:
                if _has_group(self, self.client.xinfo_groups(self.keys.jobs)):
                    return False
            except redis.RedisError:
                pass
            raise
        return True

    def enqueue(self, job_id: str, payload: Payload = b"", job_type: Optional[str] = None) -> str:
        """Adds a job and returns its stream entry id. ``job_id`` is its
        stable identity (the idempotency key); the server's clock stamps
        ``first_enqueued_ms``; ``attempt`` starts at 1. ``job_type`` (None or
        "": untyped) is 1..64 of ``[A-Za-z0-9_./-]``: its outcomes are
        counted per type, and ``work(policies=...)`` picks its policy."""
        return _text(self._run(self._enqueue(job_id, payload, job_type)))

    def ack(self, entry: Union[str, Job]) -> bool:
        """Records a success (the entry is acked, deleted and counted in
        one step). False when the entry was no longer pending."""
        return bool(self._run(self._ack(entry)) == 1)

    def retry(self, entry: Union[str, Job], delay_ms: Union[int, timedelta], reason: str,
              last_error: str = "") -> Optional[int]:
        """Moves the job to the delayed set, due ``delay_ms`` from now by
        the server's clock, with its attempt incremented. ``reason`` is the
        decision's (``transient``, ``retry_after``, ``uncertain``). Returns
        the due time (unix ms), or None when the entry was no longer
        pending. A malformed entry is refused (``ResponseError``) and left
        pending: dead-letter it with reason ``"malformed"``."""
        due = self._run(self._retry(entry, delay_ms, reason, last_error))
        return int(due) or None

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
        due = self._run(self._defer(entry, delay_ms, reason, last_error))
        return int(due) or None

    def dead_letter(self, entry: Union[str, Job], reason: str, last_error: str = "") -> Optional[str]:
        """Moves the job to the dead letter stream with ``reason`` and the
        last error (any entry, malformed ones too: every field is kept).
        Returns the DLQ entry id, or None when the entry was no longer
        pending."""
        return _dlq_id(self._run(self._dead_letter(entry, reason, last_error)))

    def promote(self, limit: int = 500) -> Promoted:
        """Moves at most ``limit`` (1..10000) due jobs from the delayed set
        to the stream, in one atomic step. Returns ``(moved,
        next_due_ms)``."""
        return _promoted(self._run(self._promote(limit)))

    def run(self, job_id: Optional[str] = None, *, due_before: Union[None, int, datetime] = None,
            limit: int = 100) -> Ran:
        """Moves delayed jobs to the stream now, before they are due, in one
        atomic step counted in ``force_run`` (Cloud Tasks' RunTask): the job
        whose job id is ``job_id``, or at most ``limit`` (1..10000) jobs due at
        or before ``due_before`` (an aware datetime or unix ms), earliest
        first. A member that is not a job ``retry`` wrote moves raw, as
        ``promote`` moves it. Returns ``(moved, left)``: ``moved`` is 0 when
        the job id is not in the delayed set."""
        args = self._force_run(job_id, due_before, limit)
        if job_id is None:
            return _ran(self._run(args))
        # Each call scans a bounded part of the set (run.lua): Redis serves
        # others between them.
        moved = 0
        while True:
            n, cursor = self._run(args)
            moved += int(n)
            if _text(cursor) == "0":
                return Ran(moved, 0)
            args = self._force_run(job_id, None, limit, _text(cursor))

    def reclaim(self, consumer: str, *, min_idle_ms: Union[int, timedelta] = 60_000, count: int = 100,
                max_deliveries: int = 5) -> Reclaimed:
        """Takes over at most ``count`` (1..1000) entries pending for longer
        than ``min_idle_ms`` (their consumer crashed) for ``consumer``.
        Entries already delivered ``max_deliveries`` times go to the DLQ as
        ``crash_loop`` instead. Returns ``(dead_lettered, jobs)``: process
        the jobs as if read."""
        return _reclaimed(self._run(self._reclaim(consumer, min_idle_ms, count, max_deliveries)))

    def replay(self, limit: int = 1000, reason: Optional[str] = None, *, job_type: Optional[str] = None) -> int:
        """Moves at most ``limit`` dead letters (those with ``reason`` only,
        when given, and of ``job_type`` only, when given), oldest first, back
        to the stream with the attempt reset to 1, in bounded batches.
        Returns how many moved."""
        reason = _replay_args(limit, reason)
        jtype = _replay_type(job_type)
        moved, cursor = 0, "-"
        while moved < limit:
            n, cursor = _replayed(self._run(self._replay_batch(min(limit - moved, 1000), reason, cursor, jtype)))
            moved += n
            if cursor == "0":
                break
        return moved

    def hold(self, consumer: str, entries: Sequence[Union[str, Job]]) -> List[bool]:
        """Keeps entries pending to ``consumer`` from being reclaimed,
        without delivering them again: their idle time is reset (XCLAIM ...
        JUSTID), their delivery count left alone. Returns, per entry,
        whether ``consumer`` holds it: False for one pending to another
        consumer (left alone) or no longer pending. Redis runs it when it
        refuses ``ack``, ``retry`` and ``dead_letter`` for lack of memory
        (maxmemory with noeviction). At most 1000 entries."""
        if not entries:
            self._hold(consumer, ["0-1"])  # check the arguments all the same
            return []
        return _held(self._run(self._hold(consumer, entries)))

    def read(self, consumer: str, *, count: int = 16, block_ms: Optional[Union[int, timedelta]] = None) -> List[Job]:
        """Reads at most ``count`` new jobs for ``consumer`` with the
        consumer group (XREADGROUP ``>``), waiting up to ``block_ms`` for
        one (None: not at all). Every job read must get an outcome
        (``apply``, or ``ack``/``retry``/``dead_letter``), or it stays
        pending until ``reclaim``."""
        return _jobs(self.client.xreadgroup(**self._xreadgroup(consumer, count, block_ms)))

    def stats(self) -> Stats:
        """The queue's sizes and counters, in one round trip."""
        p = self.client.pipeline(transaction=False)
        _stats_commands(self, p)
        return _stats(p.execute(raise_on_error=False))

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
        check_classify("apply", classify)
        return self._apply(job, exc, policy, classifier(classify))

    def _apply(self, job: Job, exc: Optional[BaseException], policy: Policy,
               classify: Callable[[BaseException], Dict[str, Any]]) -> Outcome:
        return self._move(job, self._plan(job, exc, policy, classify))

    def _move(self, job: Job, plan: Tuple[str, str, Optional[Decision], str, int]) -> Outcome:
        """One attempt at applying a plan (``_plan``)."""
        action, reason, d, text, delay = plan
        if action == "ack":
            return Outcome("ack", reason, None, self.ack(job))
        if action == "retry":
            due = self.retry(job, delay, reason, text)
            return Outcome("retry", reason, d, due is not None, due_ms=due)
        if action == "defer":
            due = self.defer(job, delay, reason, text)
            return Outcome("defer", reason, d, due is not None, due_ms=due, delay_ms=delay)
        dlq = self.dead_letter(job, reason, text)
        return Outcome("dead_letter", reason, d, dlq is not None, dlq_id=dlq)

    def work(self, policy: Policy, handler: Handler, *, consumer: Optional[str] = None,
             stop: Optional[threading.Event] = None, classify: Optional[Classify] = None, batch: int = 16,
             block_ms: int = 1000, promote_every: float = 1.0, promote_limit: int = 500,
             reclaim_every: float = 30.0, min_idle_ms: int = 60_000, max_deliveries: int = 5,
             metrics: Any = None, policies: Optional[Mapping[str, Policy]] = None,
             handler_timeout: Union[None, float, timedelta] = None) -> None:
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
        """
        check_classify("work", classify)
        cls = classifier(classify)
        consumer = consumer or _default_consumer()
        stop = stop or threading.Event()
        _work_args(self, consumer, batch, block_ms, promote_limit)
        _check_metrics(self.name, metrics)
        typed = _typed_policies(policies, metrics)
        timeout, beat = _deadline_args(handler_timeout, min_idle_ms)
        self.ensure_group()
        clock = time.monotonic
        next_promote, next_reclaim = clock(), clock() + _jitter(reclaim_every)
        paused = [0.0]  # no read before (clock): the breaker refused a job

        def process(job: Job, waiting: Sequence[Job] = (), read_at: Optional[float] = None) -> None:
            # A job that waited in the batch for half of min_idle_ms may have
            # been reclaimed by another consumer: hold it first, skip it if so.
            if min_idle_ms > 0 and read_at is not None and clock() - read_at > min_idle_ms / 2000:
                try:
                    if not self.hold(consumer, [job])[0]:
                        log.info("queue %s: entry %s (job %s) skipped: another consumer took it, or it was finished",
                                 self.name, job.entry_id, job.id)
                        return
                except redis.RedisError:
                    pass  # cannot tell: run it
            exc: Optional[Exception] = None
            # A job type with its own policy (policies=) runs with it; its
            # breaker defers its jobs without pausing the reads.
            own = job.job_type in typed
            jpolicy, jmetrics = typed.get(job.job_type, (policy, metrics))
            plan = self._gate(job, jpolicy)
            gated = plan is not None
            if plan is None:
                if not job.malformed:
                    ids = _batch_ids(job, waiting)

                    def hold(done: threading.Event, left: float) -> None:
                        # The heartbeat: reclaim leaves a job alone while its worker holds it.
                        if not done.wait(min(left, beat)):
                            try:
                                self.hold(consumer, ids)
                            except (redis.RedisError, ValueError):
                                pass

                    try:
                        run_within(lambda: handler(job), timeout, "handler", hold)
                    except DeadlineExceeded as e:
                        _decide.deadline_passed(log, self.name, job, e)
                        exc = e
                    except Exception as e:
                        exc = e
                try:
                    plan = self._plan(job, exc, jpolicy, cls)
                except Exception:
                    # The entry stays pending; reclaim delivers it again.
                    log.exception("queue %s: outcome of entry %s (job %s) not applied", self.name, job.entry_id, job.id)
                    return
            _count(jmetrics, jpolicy, job, plan, gated)
            if plan[0] == "defer" and plan[1] == "circuit_open" and not own:
                paused[0] = max(paused[0], clock() + plan[4] / 1000)
            settle = _Settle(self, job, plan, waiting, min_idle_ms)
            while settle.attempt(stop.is_set()):
                try:
                    self.hold(consumer, settle.ids)
                except (redis.RedisError, ValueError) as e:
                    settle.hold_failed(e)
                stop.wait(settle.pause())

        while not stop.is_set():
            try:
                now = clock()
                if promote_every > 0 and now >= next_promote:
                    while self.promote(promote_limit).moved == promote_limit and not stop.is_set():
                        pass
                    next_promote = now + _jitter(promote_every)
                if reclaim_every > 0 and now >= next_reclaim:
                    next_reclaim = now + _jitter(reclaim_every)
                    reclaimed = self.reclaim(consumer, min_idle_ms=min_idle_ms, count=100,
                                             max_deliveries=max_deliveries)
                    dead, claimed = reclaimed
                    _log_reclaimed(self.name, reclaimed)
                    read_at = clock()
                    for i, job in enumerate(claimed):
                        process(job, claimed[i + 1:], read_at)
                wait = _paused(paused[0], promote_every, next_promote, clock())
                if wait > 0:
                    # The breaker refused a job: read nothing until it may
                    # half-open.
                    stop.wait(wait)
                    continue
                jobs = self.read(consumer, count=batch, block_ms=_block(block_ms, promote_every, next_promote, clock()))
            except ResponseError as e:
                if "NOGROUP" in str(e):  # the stream was deleted
                    try:
                        self.ensure_group()
                    except redis.RedisError:
                        stop.wait(1)
                    continue
                log.warning("queue %s: %s", self.name, e)
                stop.wait(1)
                continue
            except redis.RedisError as e:
                log.warning("queue %s: %s", self.name, e)
                stop.wait(1)
                continue
            read_at = clock()
            for i, job in enumerate(jobs):
                process(job, jobs[i + 1:], read_at)


class AsyncQueue(_Base):
    """``Queue`` for asyncio, over ``redis.asyncio.Redis`` or
    ``redis.asyncio.RedisCluster``: the same methods, as coroutines."""

    def __init__(self, client: Any, name: str, *, keys: Optional[Keys] = None, group: str = "workers") -> None:
        if not inspect.iscoroutinefunction(getattr(client, "execute_command", None)):
            raise TypeError("AsyncQueue needs a redis.asyncio client; use Queue with a synchronous one")
        super().__init__(client, name, keys=keys, group=group)

    async def _run(self, op: Tuple[str, List[str], List[Any]]) -> Any:
        name, keys, args = op
        return await self._scripts[name](keys=keys, args=args)

    async def ensure_group(self) -> bool:
        """See ``Queue.ensure_group``."""
        try:
            await self.client.xgroup_create(self.keys.jobs, self.group, id="0", mkstream=True)
        except ResponseError as e:
            if "BUSYGROUP" in str(e):
                return False
            try:
                if _has_group(self, await self.client.xinfo_groups(self.keys.jobs)):
                    return False
            except redis.RedisError:
                pass
            raise
        return True

    async def enqueue(self, job_id: str, payload: Payload = b"", job_type: Optional[str] = None) -> str:
        """See ``Queue.enqueue``."""
        return _text(await self._run(self._enqueue(job_id, payload, job_type)))

    async def ack(self, entry: Union[str, Job]) -> bool:
        """See ``Queue.ack``."""
        return bool(await self._run(self._ack(entry)) == 1)

    async def retry(self, entry: Union[str, Job], delay_ms: Union[int, timedelta], reason: str,
                    last_error: str = "") -> Optional[int]:
        """See ``Queue.retry``."""
        return int(await self._run(self._retry(entry, delay_ms, reason, last_error))) or None

    async def defer(self, entry: Union[str, Job], delay_ms: Union[int, timedelta], reason: str,
                    last_error: str = "") -> Optional[int]:
        """See ``Queue.defer``."""
        return int(await self._run(self._defer(entry, delay_ms, reason, last_error))) or None

    async def dead_letter(self, entry: Union[str, Job], reason: str, last_error: str = "") -> Optional[str]:
        """See ``Queue.dead_letter``."""
        return _dlq_id(await self._run(self._dead_letter(entry, reason, last_error)))

    async def promote(self, limit: int = 500) -> Promoted:
        """See ``Queue.promote``."""
        return _promoted(await self._run(self._promote(limit)))

    async def run(self, job_id: Optional[str] = None, *, due_before: Union[None, int, datetime] = None,
                  limit: int = 100) -> Ran:
        """See ``Queue.run``."""
        args = self._force_run(job_id, due_before, limit)
        if job_id is None:
            return _ran(await self._run(args))
        moved = 0
        while True:
            n, cursor = await self._run(args)
            moved += int(n)
            if _text(cursor) == "0":
                return Ran(moved, 0)
            args = self._force_run(job_id, None, limit, _text(cursor))

    async def reclaim(self, consumer: str, *, min_idle_ms: Union[int, timedelta] = 60_000, count: int = 100,
                      max_deliveries: int = 5) -> Reclaimed:
        """See ``Queue.reclaim``."""
        return _reclaimed(await self._run(self._reclaim(consumer, min_idle_ms, count, max_deliveries)))

    async def replay(self, limit: int = 1000, reason: Optional[str] = None, *, job_type: Optional[str] = None) -> int:
        """See ``Queue.replay``."""
        reason = _replay_args(limit, reason)
        jtype = _replay_type(job_type)
        moved, cursor = 0, "-"
        while moved < limit:
            n, cursor = _replayed(await self._run(self._replay_batch(min(limit - moved, 1000), reason, cursor, jtype)))
            moved += n
            if cursor == "0":
                break
        return moved

    async def hold(self, consumer: str, entries: Sequence[Union[str, Job]]) -> List[bool]:
        """See ``Queue.hold``."""
        if not entries:
            self._hold(consumer, ["0-1"])
            return []
        return _held(await self._run(self._hold(consumer, entries)))

    async def read(self, consumer: str, *, count: int = 16,
                   block_ms: Optional[Union[int, timedelta]] = None) -> List[Job]:
        """See ``Queue.read``."""
        return _jobs(await self.client.xreadgroup(**self._xreadgroup(consumer, count, block_ms)))

    async def stats(self) -> Stats:
        """See ``Queue.stats``."""
        p = self.client.pipeline(transaction=False)
        _stats_commands(self, p)
        return _stats(await p.execute(raise_on_error=False))

    async def apply(self, job: Job, exc: Optional[BaseException], policy: Policy, *,
                    classify: Optional[Classify] = None) -> Outcome:
        """See ``Queue.apply``."""
        check_classify("apply", classify)
        return await self._apply(job, exc, policy, classifier(classify))

    async def _apply(self, job: Job, exc: Optional[BaseException], policy: Policy,
                     classify: Callable[[BaseException], Dict[str, Any]]) -> Outcome:
        return await self._move(job, self._plan(job, exc, policy, classify))

    async def _move(self, job: Job, plan: Tuple[str, str, Optional[Decision], str, int]) -> Outcome:
        """See ``Queue._move``."""
        action, reason, d, text, delay = plan
        if action == "ack":
            return Outcome("ack", reason, None, await self.ack(job))
        if action == "retry":
            due = await self.retry(job, delay, reason, text)
            return Outcome("retry", reason, d, due is not None, due_ms=due)
        if action == "defer":
            due = await self.defer(job, delay, reason, text)
            return Outcome("defer", reason, d, due is not None, due_ms=due, delay_ms=delay)
        dlq = await self.dead_letter(job, reason, text)
        return Outcome("dead_letter", reason, d, dlq is not None, dlq_id=dlq)

    async def work(self, policy: Policy, handler: AsyncHandler, *, consumer: Optional[str] = None,
                   stop: Optional[asyncio.Event] = None, classify: Optional[Classify] = None, batch: int = 16,
                   block_ms: int = 1000, promote_every: float = 1.0, promote_limit: int = 500,
                   reclaim_every: float = 30.0, min_idle_ms: int = 60_000, max_deliveries: int = 5,
                   metrics: Any = None, policies: Optional[Mapping[str, Policy]] = None,
                   handler_timeout: Union[None, float, timedelta] = None) -> None:
        """``Queue.work`` for asyncio: ``handler`` is a coroutine function
        (or returns an awaitable), run one job at a time; ``stop`` an
        ``asyncio.Event``. Cancelling the task ends it at once: a job whose
        handler was cancelled gets no outcome and stays pending for
        ``reclaim``; set ``stop`` to finish the batch first. Outcomes Redis
        refuses are kept and sent again, crash loops reclaim could not
        dead-letter are logged, and a job the breaker refuses is deferred
        while the worker stops reading, as ``Queue.work`` does. The
        awaitable a handler returns runs as a task within
        ``handler_timeout`` (as ``Queue.work``'s, with the same holds), and
        is cancelled at the deadline; the worker gives it half a second to
        end, then moves on (logged)."""
        check_classify("work", classify)
        cls = classifier(classify)
        consumer = consumer or _default_consumer()
        stop = stop or asyncio.Event()
        _work_args(self, consumer, batch, block_ms, promote_limit)
        _check_metrics(self.name, metrics)
        typed = _typed_policies(policies, metrics)
        timeout, beat = _deadline_args(handler_timeout, min_idle_ms)
        await self.ensure_group()
        clock = time.monotonic
        next_promote, next_reclaim = clock(), clock() + _jitter(reclaim_every)
        paused = [0.0]  # no read before (clock): the breaker refused a job

        async def process(job: Job, waiting: Sequence[Job] = (), read_at: Optional[float] = None) -> None:
            if min_idle_ms > 0 and read_at is not None and clock() - read_at > min_idle_ms / 2000:
                try:
                    if not (await self.hold(consumer, [job]))[0]:
                        log.info("queue %s: entry %s (job %s) skipped: another consumer took it, or it was finished",
                                 self.name, job.entry_id, job.id)
                        return
                except redis.RedisError:
                    pass
            exc: Optional[Exception] = None
            # A job type with its own policy (policies=) runs with it; its
            # breaker defers its jobs without pausing the reads.
            own = job.job_type in typed
            jpolicy, jmetrics = typed.get(job.job_type, (policy, metrics))
            plan = self._gate(job, jpolicy)
            gated = plan is not None
            if plan is None:
                if not job.malformed:
                    ids = _batch_ids(job, waiting)

                    async def hold(task: "asyncio.Future[Any]", left: float) -> None:
                        await asyncio.wait({task}, timeout=min(left, beat))
                        if not task.done():
                            try:
                                await self.hold(consumer, ids)
                            except (redis.RedisError, ValueError):
                                pass

                    try:
                        r = handler(job)
                        if inspect.isawaitable(r):
                            await await_within(r, timeout, "handler", hold)
                    except DeadlineExceeded as e:
                        _decide.deadline_passed(log, self.name, job, e)
                        exc = e
                    except Exception as e:
                        exc = e
                try:
                    plan = self._plan(job, exc, jpolicy, cls)
                except Exception:
                    log.exception("queue %s: outcome of entry %s (job %s) not applied", self.name, job.entry_id, job.id)
                    return
            _count(jmetrics, jpolicy, job, plan, gated)
            if plan[0] == "defer" and plan[1] == "circuit_open" and not own:
                paused[0] = max(paused[0], clock() + plan[4] / 1000)
            settle = _Settle(self, job, plan, waiting, min_idle_ms)
            while True:
                stopped = stop.is_set()
                try:
                    settle.applied(await self._move(job, plan))
                    return
                except Exception as e:
                    if not settle.refused(e, stopped):
                        return
                try:
                    await self.hold(consumer, settle.ids)
                except (redis.RedisError, ValueError) as e:
                    settle.hold_failed(e)
                try:
                    await asyncio.wait_for(stop.wait(), settle.pause())
                except asyncio.TimeoutError:
                    pass

        async def pause() -> None:
            try:
                await asyncio.wait_for(stop.wait(), 1)
            except asyncio.TimeoutError:
                pass

        while not stop.is_set():
            try:
                now = clock()
                if promote_every > 0 and now >= next_promote:
                    while (await self.promote(promote_limit)).moved == promote_limit and not stop.is_set():
                        pass
                    next_promote = now + _jitter(promote_every)
                if reclaim_every > 0 and now >= next_reclaim:
                    next_reclaim = now + _jitter(reclaim_every)
                    reclaimed = await self.reclaim(consumer, min_idle_ms=min_idle_ms, count=100,
                                                   max_deliveries=max_deliveries)
                    dead, claimed = reclaimed
                    _log_reclaimed(self.name, reclaimed)
                    read_at = clock()
                    for i, job in enumerate(claimed):
                        await process(job, claimed[i + 1:], read_at)
                wait = _paused(paused[0], promote_every, next_promote, clock())
                if wait > 0:
                    try:
                        await asyncio.wait_for(stop.wait(), wait)
                    except asyncio.TimeoutError:
                        pass
                    continue
                jobs = await self.read(consumer, count=batch,
                                       block_ms=_block(block_ms, promote_every, next_promote, clock()))
            except ResponseError as e:
                if "NOGROUP" in str(e):
                    try:
                        await self.ensure_group()
                    except redis.RedisError:
                        await pause()
                    continue
                log.warning("queue %s: %s", self.name, e)
                await pause()
                continue
            except redis.RedisError as e:
                log.warning("queue %s: %s", self.name, e)
                await pause()
                continue
            read_at = clock()
            for i, job in enumerate(jobs):
                await process(job, jobs[i + 1:], read_at)


# -- outcomes Redis refuses ------------------------------------------------------

_APPLY_BASE = 0.02  # seconds: the first pause after Redis refused an outcome
_APPLY_CAP = 2.0  # the longest pause (also at most a quarter of min_idle_ms)
_REFUSED_CODES = frozenset(("OOM", "READONLY", "LOADING", "BUSY", "MASTERDOWN", "MISCONF", "TRYAGAIN", "CLUSTERDOWN",
                            "NOREPLICAS"))


def _write_refused(exc: BaseException) -> bool:
    """Whether ``exc`` says that Redis could not apply a write now but may
    soon, so that the same request is worth sending again: the replies OOM
    (maxmemory reached with noeviction), READONLY (a replica, during a
    failover), LOADING, BUSY (a slow script), MASTERDOWN, MISCONF (writes
    refused after a failed save), TRYAGAIN, CLUSTERDOWN, NOREPLICAS and
    "ERR max number of clients reached"; no reply at all (a connection
    refused, reset or lost, a timeout). Anything else is not sent again:
    bad arguments (``ERR backstop ...``, a ValueError), WRONGTYPE, NOPERM,
    a failed authentication."""
    ex = redis.exceptions
    if isinstance(exc, (ex.AuthenticationError, getattr(ex, "AuthorizationError", ex.AuthenticationError))):
        return False
    if isinstance(exc, (ex.ConnectionError, ex.TimeoutError, ConnectionError, TimeoutError)):
        return True  # redis-py: BusyLoadingError (LOADING) and "max number of clients reached" too
    if isinstance(exc, ResponseError):
        # redis-py strips the code of the replies it knows (OOM, READONLY...)
        # from the message and keeps it in the class and in status_code.
        for cls in ("OutOfMemoryError", "ReadOnlyError", "TryAgainError", "ClusterDownError"):
            if isinstance(exc, getattr(ex, cls, ())):
                return True
        code = getattr(exc, "status_code", None) or str(exc).split(" ", 1)[0]
        return code in _REFUSED_CODES
    return False


class _Settle:
    """The state of applying one job's outcome while Redis refuses it: the
    plan, decided once, is sent again with jittered backoff (doubling from
    20 ms to at most 2 s and a quarter of ``min_idle_ms``), the job and the
    jobs of its batch still waiting are held in between, and the log says
    what happened. Shared by ``Queue.work`` and ``AsyncQueue.work``, which
    do the I/O."""

    def __init__(self, q: _Base, job: Job, plan: Tuple[str, str, Optional[Decision], str, int],
                 waiting: Sequence[Job], min_idle_ms: int) -> None:
        self.q, self.job, self.plan, self.action = q, job, plan, plan[0]
        self.ids = _batch_ids(job, waiting)
        self.ceiling = min(_APPLY_CAP, max(0.001, min_idle_ms / 4000)) if min_idle_ms > 0 else _APPLY_CAP
        self.delay = min(_APPLY_BASE, self.ceiling)
        self.refusals = 0
        self._hold_failed = False

    def attempt(self, stopped: bool) -> bool:
        """One attempt (sync): whether to hold, pause and attempt again."""
        q = self.q
        assert isinstance(q, Queue)
        try:
            self.applied(q._move(self.job, self.plan))
            return False
        except Exception as e:
            return self.refused(e, stopped)

    def applied(self, out: Outcome) -> None:
        if self.refusals:
            log.info("queue %s: outcome %s of entry %s (job %s) applied after %d refusal(s)%s", self.q.name, self.action,
                     self.job.entry_id, self.job.id, self.refusals, "" if out.applied else " (no longer pending)")

    def refused(self, e: Exception, stopped: bool) -> bool:
        """Logs a failed attempt; whether to hold, pause and attempt again."""
        name, job = self.q.name, self.job
        if not _write_refused(e):
            # Not worth sending again: the entry stays pending for reclaim.
            log.error("queue %s: outcome %s of entry %s (job %s) not applied: %s", name, self.action, job.entry_id,
                      job.id, e, exc_info=e)
            return False
        self.refusals += 1
        if stopped:
            log.error("queue %s: outcome %s of entry %s (job %s) not applied: the worker stopped while Redis refused it "
                      "(%d time(s)); the entry stays pending: %s", name, self.action, job.entry_id, job.id,
                      self.refusals, e)
            return False
        if self.refusals == 1:
            log.warning("queue %s: outcome %s of entry %s (job %s) refused, retrying: %s", name, self.action,
                        job.entry_id, job.id, e)
        return True

    def hold_failed(self, e: Exception) -> None:
        if not self._hold_failed:
            log.warning("queue %s: cannot hold entry %s (job %s) while its outcome is refused: %s", self.q.name,
                        self.job.entry_id, self.job.id, e)
        self._hold_failed = True

    def pause(self) -> float:
        """The next pause, in seconds."""
        d = self.delay
        self.delay = min(2 * d, self.ceiling)
        return d / 2 + random.random() * d / 2


# -- arguments -----------------------------------------------------------------


def _entry(who: str, entry: Union[str, Job]) -> str:
    if isinstance(entry, Job):
        return entry.entry_id
    if isinstance(entry, bytes):
        entry = entry.decode("ascii", "replace")
    m = _ENTRY_ID.match(entry) if isinstance(entry, str) else None
    if m is None or int(m.group(1)) >= 1 << 64 or int(m.group(2)) >= 1 << 64:
        raise ValueError("%s: entry must be a stream entry id (<ms>-<seq>) or a Job (got %r)" % (who, entry))
    return entry


def _reason(who: str, reason: str) -> None:
    if not isinstance(reason, str) or not reason:
        raise ValueError("%s: reason must be a non-empty string (got %r)" % (who, reason))


def _str_arg(who: str, name: str, v: Any) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        raise TypeError("%s: %s must be a string (got %s)" % (who, name, type(v).__name__))
    return v


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _whole_in(who: str, name: str, v: Any, lo: int, hi: Optional[int]) -> None:
    if not _is_int(v) or v < lo or (hi is not None and v > hi):
        want = "in %d..%d" % (lo, hi) if hi is not None else ">= %d" % lo
        raise ValueError("%s: %s must be a whole number %s (got %r)" % (who, name, want, v))


def _ms(who: str, name: str, v: Any) -> int:
    if isinstance(v, timedelta):
        v = v // timedelta(milliseconds=1)
    if not _is_int(v) or v < 0:
        raise ValueError("%s: %s must be a whole number of milliseconds >= 0 or a timedelta (got %r)" % (who, name, v))
    return int(v)


def _delay(v: Any) -> int:
    return _ms("retry", "delay_ms", v)


_JOB_TYPE = _decide.JOB_TYPE
_check_job_type = _decide.check_job_type


def _replay_type(job_type: Optional[str]) -> str:
    if job_type is None:
        return ""
    _check_job_type("replay", "job_type", job_type)
    return job_type


_typed_policies = _decide.typed_policies


def _replay_args(limit: int, reason: Optional[str]) -> str:
    _whole_in("replay", "limit", limit, 1, None)
    if reason is not None and not isinstance(reason, str):
        raise TypeError("replay: reason must be a string or None (got %r)" % (reason,))
    return reason or ""


def _work_args(q: _Base, consumer: str, batch: int, block_ms: int, promote_limit: int) -> None:
    """Checks work's arguments before anything runs."""
    q._xreadgroup(consumer, batch, None)
    _whole_in("work", "block_ms", block_ms, 1, None)  # 0 would block forever, deaf to stop
    _whole_in("work", "promote_limit", promote_limit, 1, 10000)


def _batch_ids(job: Job, waiting: Sequence[Job]) -> List[str]:
    """The entries a worker holds for job: it, and the jobs of its batch
    still waiting (at most 1000 in all)."""
    return [job.entry_id] + [j.entry_id for j in waiting][:999]


def _deadline_args(handler_timeout: Any, min_idle_ms: int) -> Tuple[float, float]:
    """work's handler deadline (seconds: default 5 x min_idle_ms, or 5 min
    without one) and the pause between two holds of a running job
    (min_idle_ms / 3, at least 10 ms)."""
    default = 5 * min_idle_ms / 1000 if _is_int(min_idle_ms) and min_idle_ms > 0 else _decide.HANDLER_TIMEOUT_S
    return _decide.handler_timeout(handler_timeout, default), max(min_idle_ms / 3000, 0.01)


def _default_consumer() -> str:
    return "%s-%d" % (socket.gethostname(), os.getpid())


_jitter = _decide.jitter
_DEFERRED = _decide.DEFERRED
_OPEN_POLL_MS = _decide.OPEN_POLL_MS
_check_metrics = _decide.check_metrics
_count = _decide.count
_on_open = _decide.on_open
_refused_for = _decide.refused_for


def _paused(until: float, promote_every: float, next_promote: float, now: float) -> float:
    """How long the read loop waits for the breaker (seconds, 0 = read): no
    longer than until the next promote."""
    if until <= now:
        return 0.0
    if promote_every <= 0:
        return until - now
    return max(0.001, min(until, next_promote) - now)


def _block(block_ms: int, promote_every: float, next_promote: float, now: float) -> int:
    """How long a read may block: no longer than until the next promote."""
    if promote_every <= 0:
        return block_ms
    return max(1, min(block_ms, int((next_promote - now) * 1000)))


# -- replies (bytes or str, RESP2 or RESP3) ----------------------------------------


def _text(v: Any) -> str:
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8", "replace")
    return "" if v is None else str(v)


def _bytes(v: Any) -> bytes:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    return ("" if v is None else str(v)).encode("utf-8")


def _whole(v: Any) -> Optional[int]:
    """A decimal int64, as Go's strconv.ParseInt reads it; else None."""
    s = _text(v)
    if not _INT.match(s):
        return None
    n = int(s)
    return n if -(1 << 63) <= n < (1 << 63) else None


def _dlq_id(v: Any) -> Optional[str]:
    return _text(v) if isinstance(v, (bytes, bytearray, str)) else None


def _promoted(v: Sequence[Any]) -> Promoted:
    moved, nxt = int(v[0]), int(v[1])
    return Promoted(moved, None if nxt < 0 else nxt)


def _ran(v: Sequence[Any]) -> Ran:
    return Ran(int(v[0]), int(v[1]))


def _log_reclaimed(queue: str, r: Reclaimed) -> None:
    # As the Go worker logs them: each crash loop the DLQ refused (it stays
    # pending), then how many were dead-lettered.
    for entry_id, why in r.skipped:
        log.error("queue %s: crash loop %s stays pending: %s", queue, entry_id, why)  # why: "not dead-lettered: ..."
    if r.dead_lettered:
        log.warning("queue %s: %d crash loop(s) dead-lettered", queue, r.dead_lettered)


def _reclaimed(v: Sequence[Any]) -> Reclaimed:
    # {dead-lettered, {claimed entries}, {{skipped entry id, why}, ...}}
    jobs = []
    for e in v[1] or ():
        if isinstance(e, (list, tuple)) and len(e) == 2 and isinstance(e[1], (list, tuple)):
            f = e[1]
            jobs.append(Job.from_entry(e[0], {f[i]: f[i + 1] for i in range(0, len(f) - 1, 2)}))
    skipped = [(_text(s[0]), _text(s[1])) for s in v[2] or () if isinstance(s, (list, tuple)) and len(s) == 2]
    return Reclaimed(int(v[0]), jobs, skipped)


def _held(v: Sequence[Any]) -> List[bool]:
    return [int(x) == 1 for x in v]


def _has_group(q: _Base, groups: Any) -> bool:
    """Whether XINFO GROUPS (as redis-py returns it) lists the queue's group."""
    return any(_text(g.get("name", g.get(b"name")) if isinstance(g, dict) else "") == q.group for g in groups or ())


def _replayed(v: Sequence[Any]) -> Tuple[int, str]:
    return int(v[0]), _text(v[1])


def _jobs(reply: Any) -> List[Job]:
    # RESP2: [[stream, [(id, fields), ...]]]; RESP3: {stream: [[(id, fields), ...]]}.
    if not reply:
        return []
    if isinstance(reply, dict):
        streams = [entries[0] if entries and isinstance(entries[0], list) else entries for entries in reply.values()]
    else:
        streams = [s[1] for s in reply]
    return [Job.from_entry(eid, fields or {}) for entries in streams for eid, fields in entries]


def _stats_commands(q: _Base, p: Any) -> None:
    p.xlen(q.keys.jobs)
    p.xpending(q.keys.jobs, q.group)
    p.zcard(q.keys.delayed)
    p.xlen(q.keys.dlq)
    p.hgetall(q.keys.stats)


def _stats(r: List[Any]) -> Stats:
    for v in r:
        if isinstance(v, Exception) and "NOGROUP" not in str(v):
            raise v
    pending = r[1]["pending"] if isinstance(r[1], dict) else 0  # NOGROUP: no group yet, nothing pending
    return Stats(int(r[0]), int(pending), int(r[2]), int(r[3]), {_text(k): int(v) for k, v in r[4].items()})


_error_text = _decide.error_text
