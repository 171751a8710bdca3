"""The Redis queue without I/O: what ``Queue`` and ``AsyncQueue`` share.

The sans-I/O core of ``backstop.redis`` (as ``backstop.rabbitmq._core`` is
RabbitMQ's): the jobs and replies, the arguments checked, every script call
and command built, every reply read, and every operation, the worker's
loop included, written once as a generator of *steps*. A step is one piece
of I/O (``Script``, ``Command``, ``Pipeline``; in the worker's loop also
``Pause`` and ``Handle``, running the handler); the generator yields it,
is sent its reply (or thrown its exception) and returns the operation's
result (``advance``). ``_sync.py`` performs the steps with a redis-py
client and threads, ``_asyncio.py`` with ``redis.asyncio`` and tasks:
they do the I/O and nothing else. The client call a step describes is
made in one place, ``_Base._call``, whose reply the sync layer takes and
the asyncio layer awaits. What a worker decides about a job, whatever the
broker, is ``backstop._decide`` (its ``Runner``, RabbitMQ's too).
"""

from __future__ import annotations

import logging
import os
import random
import re
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from importlib import resources
from typing import (Any, Awaitable, Callable, Dict, Generator, List, Mapping, NamedTuple, Optional, Sequence, Tuple,
                    TypeVar, Union)

try:
    import redis
    from redis.exceptions import ResponseError
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("backstop.redis needs redis-py: pip install 'backstop-policy[redis]'") from e

from .. import queue as _queue
from .. import _decide
from .._policy import Decision, Policy
from .._retry import Classify, check_classify, classifier

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

    @property
    def audit(self) -> str:
        """The audit stream, where replays and runs given an ``actor`` (and
        the Go CLI's discards) are recorded: the DLQ key with ``:dlq``
        replaced by ``:audit`` (so in its hash slot), as Go's
        ``Keys.Audit``."""
        return (self.dlq[: -len(":dlq")] if self.dlq.endswith(":dlq") else self.dlq) + ":audit"


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
    # Its due time when promote moved it (unix ms, the server's clock; 0:
    # unknown): the worker measures the retry latency from it.
    due_ms: int = 0

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
                   job_type=_text(f.get("type", "")), due_ms=_whole(f.get("due_ms")) or 0)


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



# -- steps: the I/O an operation asks for ----------------------------------------


class Script(NamedTuple):
    """Run one of the contract's scripts (EVALSHA; on NOSCRIPT, SCRIPT LOAD
    and EVALSHA again). Reply: the script's."""

    name: str
    keys: List[str]
    args: List[Any]


class Command(NamedTuple):
    """Call a method of the redis-py client (``xreadgroup``,
    ``xgroup_create``, ...). Reply: the method's."""

    method: str
    args: Tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = {}


class Pipeline(NamedTuple):
    """Send commands in one round trip, without a transaction. Reply: the
    list of their replies, an error in place of a failed one."""

    commands: List[Command]


class Pause(NamedTuple):
    """The worker waits ``seconds``, or until it is stopped. Reply: None."""

    seconds: float


class Handle(NamedTuple):
    """The worker runs the handler on ``job`` within ``timeout`` seconds,
    holding ``ids`` for ``consumer`` every ``beat`` seconds meanwhile.
    Reply: None; the handler's exception is thrown back."""

    job: Job
    ids: List[str]
    consumer: str
    timeout: float
    beat: float


class Tell(NamedTuple):
    """The worker calls ``on_outcome(event)`` (``work``'s), an applied
    outcome's. Reply: None."""

    on_outcome: Any
    event: Any


Step = Union[Script, Command, Pipeline, Pause, Handle, Tell]
T = TypeVar("T")
#: An operation: yields steps, is sent their replies, returns its result.
Steps = Generator[Step, Any, T]
_MALFORMED = "malformed entry: needs id, attempt >= 1 and first_enqueued_ms"


def advance(steps: Steps[Any], reply: Any = None, error: Optional[Exception] = None) -> Tuple[bool, Any]:
    """Resumes an operation with the reply of its last step (or throws it
    the step's exception; nothing to start it): ``(False, next step)``,
    or ``(True, result)`` once it returned. The I/O layers loop on it."""
    try:
        return False, (steps.send(reply) if error is None else steps.throw(error))
    except StopIteration as done:
        return True, done.value


class _Base:
    """What the sync and asyncio queues share: keys, arguments, every
    operation as steps (``_<operation>_steps``), replies."""

    def __init__(self, client: Any, name: str, *, keys: Optional[Keys] = None, group: str = "workers") -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("queue: name must be a non-empty string (got %r)" % (name,))
        if not isinstance(group, str) or not group:
            raise ValueError("queue: group must be a non-empty string (got %r)" % (group,))
        if keys is not None and not isinstance(keys, Keys):
            raise TypeError("queue: keys must be a backstop.redis.Keys (got %r)" % (keys,))
        self.client = client
        self.name = name
        self.keys = keys or Keys.for_queue(name)
        self.group = group
        self._scripts = {n: client.register_script(script_source(n)) for n in _SCRIPTS}

    def __repr__(self) -> str:
        return "%s(%r, group=%r, keys=%r)" % (type(self).__name__, self.name, self.group, self.keys)

    def _call(self, step: Union[Script, Command, Pipeline]) -> Any:
        """The client call a step makes: the one place that touches the
        client. Its reply for a synchronous client; for an asyncio one, the
        awaitable of its reply (``AsyncQueue`` awaits it)."""
        if isinstance(step, Script):
            return self._scripts[step.name](keys=step.keys, args=step.args)
        if isinstance(step, Command):
            return getattr(self.client, step.method)(*step.args, **step.kwargs)
        p = self.client.pipeline(transaction=False)
        for c in step.commands:
            getattr(p, c.method)(*c.args, **c.kwargs)
        return p.execute(raise_on_error=False)

    # Each script call: the script, its KEYS and ARGV, checked here so that
    # a mistake is a ValueError naming the argument rather than a script error.

    def _enqueue(self, job_id: str, payload: Payload, job_type: Optional[str]) -> Script:
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
        return Script("enqueue", [self.keys.jobs, self.keys.stats], args)

    def _ack(self, entry: Union[str, Job]) -> Script:
        return Script("ack", [self.keys.jobs, self.keys.stats], [self.group, _entry("ack", entry)])

    def _later(self, op: str, entry: Union[str, Job], delay_ms: Union[int, timedelta], reason: str,
               last_error: str) -> Script:
        """``retry`` or ``defer``: back to the delayed set."""
        delay = _delay(delay_ms)
        _reason(op, reason)
        return Script(op, [self.keys.jobs, self.keys.delayed, self.keys.stats],
                      [self.group, _entry(op, entry), delay, reason, _str_arg(op, "last_error", last_error)])

    def _dead_letter(self, entry: Union[str, Job], reason: str, last_error: str) -> Script:
        _reason("dead_letter", reason)
        return Script("dead_letter", [self.keys.jobs, self.keys.dlq, self.keys.stats],
                      [self.group, _entry("dead_letter", entry), reason,
                       _str_arg("dead_letter", "last_error", last_error)])

    def _promote(self, limit: int) -> Script:
        _whole_in("promote", "limit", limit, 1, 10000)
        return Script("promote", [self.keys.delayed, self.keys.jobs, self.keys.stats], [limit])

    def _force_run(self, job_id: Optional[str], due_before: Union[None, int, datetime],
                   limit: int, cursor: str = "0", actor: str = "") -> Script:
        keys = [self.keys.delayed, self.keys.jobs, self.keys.stats]
        tail: List[Any] = []
        if actor:  # each job moved recorded in the audit (run.lua)
            keys.append(self.keys.audit)
            tail = [actor]
        if (job_id is None) == (due_before is None):
            raise ValueError("run: give one of job_id and due_before (got job_id=%r, due_before=%r)" % (job_id, due_before))
        if job_id is not None:
            if not isinstance(job_id, str) or not job_id:
                raise ValueError("run: job_id must be a non-empty string (got %r)" % (job_id,))
            return Script("run", keys, ["id", job_id, cursor, *tail])
        if isinstance(due_before, datetime):
            if due_before.tzinfo is None:
                raise ValueError("run: due_before must be an aware datetime (got %r)" % (due_before,))
            due_before = int(due_before.timestamp() * 1000)
        _whole_in("run", "due_before", due_before, 0, None)
        _whole_in("run", "limit", limit, 1, 10000)
        return Script("run", keys, ["before", due_before, limit, *tail])

    def _reclaim(self, consumer: str, min_idle_ms: Union[int, timedelta], count: int, max_deliveries: int) -> Script:
        if not isinstance(consumer, str) or not consumer:
            raise ValueError("reclaim: consumer must be a non-empty string (got %r)" % (consumer,))
        idle = _ms("reclaim", "min_idle_ms", min_idle_ms)
        _whole_in("reclaim", "count", count, 1, 1000)
        _whole_in("reclaim", "max_deliveries", max_deliveries, 1, None)
        return Script("reclaim", [self.keys.jobs, self.keys.dlq, self.keys.stats],
                      [self.group, consumer, idle, count, max_deliveries])

    def _hold(self, consumer: str, entries: Sequence[Union[str, Job]]) -> Script:
        if not isinstance(consumer, str) or not consumer:
            raise ValueError("hold: consumer must be a non-empty string (got %r)" % (consumer,))
        if isinstance(entries, (str, bytes, Job)) or not isinstance(entries, Sequence) or len(entries) > 1000:
            raise ValueError("hold: entries must be a sequence of at most 1000 entry ids or Jobs (got %r)" % (entries,))
        return Script("hold", [self.keys.jobs], [self.group, consumer, *(_entry("hold", e) for e in entries)])

    def _replay_batch(self, limit: int, reason: str, cursor: str, job_type: str = "", actor: str = "") -> Script:
        if actor:  # each dead letter replayed recorded in the audit (replay.lua)
            return Script("replay", [self.keys.dlq, self.keys.jobs, self.keys.stats, self.keys.audit],
                          [limit, reason, cursor, limit * 10, job_type, "", "", actor])
        return Script("replay", [self.keys.dlq, self.keys.jobs, self.keys.stats], [limit, reason, cursor, limit * 10, job_type])

    def _xreadgroup(self, consumer: str, count: int, block_ms: Optional[Union[int, timedelta]]) -> Dict[str, Any]:
        if not isinstance(consumer, str) or not consumer:
            raise ValueError("read: consumer must be a non-empty string (got %r)" % (consumer,))
        _whole_in("read", "count", count, 1, None)
        if block_ms is not None:
            block_ms = _ms("read", "block_ms", block_ms)
        return dict(groupname=self.group, consumername=consumer, streams={self.keys.jobs: ">"},
                    count=count, block=block_ms)

    def _plan(self, job: Job, exc: Optional[BaseException], policy: Policy,
              classify: Callable[[BaseException], Dict[str, Any]]) -> _decide.Plan:
        """What to do about a job's outcome: (action, reason, decision,
        last error, delay ms). Deciding is local (backstop.wasm); only the
        move that follows talks to Redis."""
        if not isinstance(job, Job):
            raise TypeError("apply: job must be a backstop.redis.Job (got %s)" % type(job).__name__)
        return _decide.plan(job, exc, policy, classify, _MALFORMED, int(time.time() * 1000))

    # -- the operations, as steps (the public methods' docstrings are Queue's) --

    def _ensure_group_steps(self) -> Steps[bool]:
        try:
            yield Command("xgroup_create", (self.keys.jobs, self.group), {"id": "0", "mkstream": True})
        except ResponseError as e:
            if "BUSYGROUP" in str(e):
                return False
            # Redis refuses XGROUP CREATE before it looks for the group when
            # it refuses writes (out of memory, a read-only replica): a group
            # that exists is all a worker needs.
            try:
                if _has_group(self, (yield Command("xinfo_groups", (self.keys.jobs,)))):
                    return False
            except redis.RedisError:
                pass
            raise
        return True

    def _enqueue_steps(self, job_id: str, payload: Payload, job_type: Optional[str]) -> Steps[str]:
        return _text((yield self._enqueue(job_id, payload, job_type)))

    def _ack_steps(self, entry: Union[str, Job]) -> Steps[bool]:
        return bool((yield self._ack(entry)) == 1)

    def _later_steps(self, op: str, entry: Union[str, Job], delay_ms: Union[int, timedelta], reason: str,
                     last_error: str) -> Steps[Optional[int]]:
        return int((yield self._later(op, entry, delay_ms, reason, last_error))) or None

    def _dead_letter_steps(self, entry: Union[str, Job], reason: str, last_error: str) -> Steps[Optional[str]]:
        return _dlq_id((yield self._dead_letter(entry, reason, last_error)))

    def _promote_steps(self, limit: int) -> Steps[Promoted]:
        return _promoted((yield self._promote(limit)))

    def _run_steps(self, job_id: Optional[str], due_before: Union[None, int, datetime], limit: int,
                   actor: Optional[str] = None) -> Steps[Ran]:
        actor = _actor("run", actor)
        args = self._force_run(job_id, due_before, limit, actor=actor)
        if job_id is None:
            return _ran((yield args))
        # Each call scans a bounded part of the set (run.lua): Redis serves
        # others between them.
        moved = 0
        while True:
            n, cursor = yield args
            moved += int(n)
            if _text(cursor) == "0":
                return Ran(moved, 0)
            args = self._force_run(job_id, None, limit, _text(cursor), actor)

    def _reclaim_steps(self, consumer: str, min_idle_ms: Union[int, timedelta], count: int,
                       max_deliveries: int) -> Steps[Reclaimed]:
        return _reclaimed((yield self._reclaim(consumer, min_idle_ms, count, max_deliveries)))

    def _replay_steps(self, limit: int, reason: Optional[str], job_type: Optional[str],
                      actor: Optional[str] = None) -> Steps[int]:
        reason = _replay_args(limit, reason)
        jtype = _replay_type(job_type)
        who = _actor("replay", actor)
        moved, cursor = 0, "-"
        while moved < limit:
            n, cursor = _replayed((yield self._replay_batch(min(limit - moved, 1000), reason, cursor, jtype, who)))
            moved += n
            if cursor == "0":
                break
        return moved

    def _hold_steps(self, consumer: str, entries: Sequence[Union[str, Job]]) -> Steps[List[bool]]:
        if not entries:
            self._hold(consumer, ["0-1"])  # check the arguments all the same
            return []
        return _held((yield self._hold(consumer, entries)))

    def _read_steps(self, consumer: str, count: int, block_ms: Optional[Union[int, timedelta]]) -> Steps[List[Job]]:
        return _jobs((yield Command("xreadgroup", (), self._xreadgroup(consumer, count, block_ms))))

    def _stats_steps(self) -> Steps[Stats]:
        return _stats((yield Pipeline(_stats_commands(self))))

    def _apply_steps(self, job: Job, exc: Optional[BaseException], policy: Policy,
                     classify: Optional[Classify]) -> Steps[Outcome]:
        check_classify("apply", classify)
        return (yield from self._move_steps(job, self._plan(job, exc, policy, classifier(classify))))

    def _move_steps(self, job: Job, plan: _decide.Plan) -> Steps[Outcome]:
        """One attempt at applying a plan (``_plan``)."""
        action, reason, d, text, delay = plan[:5]
        if action == "ack":
            return Outcome("ack", reason, None, (yield from self._ack_steps(job)))
        if action == "retry":
            due = yield from self._later_steps("retry", job, delay, reason, text)
            return Outcome("retry", reason, d, due is not None, due_ms=due)
        if action == "defer":
            due = yield from self._later_steps("defer", job, delay, reason, text)
            return Outcome("defer", reason, d, due is not None, due_ms=due, delay_ms=delay)
        dlq = yield from self._dead_letter_steps(job, reason, text)
        return Outcome("dead_letter", reason, d, dlq is not None, dlq_id=dlq)

    def _work_steps(self, policy: Policy, stop: Any, consumer: Optional[str], classify: Optional[Classify],
                    batch: int, block_ms: int, promote_every: float, promote_limit: int, reclaim_every: float,
                    min_idle_ms: int, max_deliveries: int, metrics: Any, policies: Optional[Mapping[str, Policy]],
                    handler_timeout: Union[None, float, timedelta], on_outcome: Any = None) -> Steps[None]:
        """``Queue.work``'s loop until ``stop`` (a ``threading.Event`` or an
        ``asyncio.Event``: only ``is_set`` is asked here) is set."""
        check_classify("work", classify)
        cls = classifier(classify)
        consumer = consumer or _default_consumer()
        _work_args(self, consumer, batch, block_ms, promote_limit)
        _check_metrics(self.name, metrics)
        typed = _typed_policies(policies, metrics)
        timeout, beat = _deadline_args(handler_timeout, min_idle_ms)
        _queue.check_on_outcome(on_outcome)
        runner = _decide.Runner(log, self.name, policy, metrics, typed, cls, _MALFORMED, on_outcome)
        yield from self._ensure_group_steps()
        # The scripts stamp first_enqueued_ms with the server's clock: a
        # job's elapsed time is measured on it, whatever this machine's says.
        server = _ServerClock()
        yield from server.sync_steps()
        clock = time.monotonic
        next_promote, next_reclaim = clock(), clock() + _jitter(reclaim_every)
        paused = [0.0]  # no read before (clock): the breaker refused a job

        def process(job: Job, waiting: Sequence[Job] = (), read_at: Optional[float] = None) -> Steps[None]:
            # A job that waited in the batch for half of min_idle_ms may have
            # been reclaimed by another consumer: hold it first, skip it if so.
            if min_idle_ms > 0 and read_at is not None and clock() - read_at > min_idle_ms / 2000:
                try:
                    if not (yield from self._hold_steps(consumer, [job]))[0]:
                        log.info("queue %s: entry %s (job %s) skipped: another consumer took it, or it was finished",
                                 self.name, job.entry_id, job.id)
                        return
                except redis.RedisError:
                    pass  # cannot tell: run it
            exc: Optional[Exception] = None
            # A job type with its own policy (policies=) runs with it; its
            # breaker defers its jobs without pausing the reads.
            own = runner.own(job)
            jpolicy, jmetrics = runner.policy_for(job)
            plan = runner.gate(job, jpolicy)
            if plan is None:
                took: Optional[float] = None
                if not job.malformed:
                    runner.measure(jmetrics, job, server.now_ms())
                    started = time.monotonic()
                    try:
                        yield Handle(job, _batch_ids(job, waiting), consumer, timeout, beat)
                    except Exception as e:
                        exc = runner.failure(job, e)
                    took = time.monotonic() - started
                if not job.malformed:
                    yield from server.sync_steps()
                try:
                    plan = runner.plan(job, exc, jpolicy, int(time.time() * 1000), server.now_ms(), took)
                except Exception:
                    # The entry stays pending; reclaim delivers it again.
                    log.exception("queue %s: outcome of entry %s (job %s) not applied", self.name, job.entry_id, job.id)
                    return
            runner.count(jmetrics, jpolicy, job, plan)
            if plan[0] == "defer" and plan[1] == "circuit_open" and not own:
                paused[0] = max(paused[0], clock() + plan[4] / 1000)
            settle = _Settle(self, job, plan, waiting, min_idle_ms)
            while True:
                stopped = stop.is_set()
                try:
                    out = yield from self._move_steps(job, plan)
                except Exception as e:
                    if not settle.refused(e, stopped):
                        return
                else:
                    settle.applied(out)
                    if out.applied and on_outcome is not None:
                        yield Tell(on_outcome, runner.event(job, plan))
                    return
                try:
                    yield from self._hold_steps(consumer, settle.ids)
                except (redis.RedisError, ValueError) as e:
                    settle.hold_failed(e)
                yield Pause(settle.pause())

        while not stop.is_set():
            try:
                now = clock()
                if promote_every > 0 and now >= next_promote:
                    while (yield from self._promote_steps(promote_limit)).moved == promote_limit and not stop.is_set():
                        pass
                    next_promote = now + _jitter(promote_every)
                if reclaim_every > 0 and now >= next_reclaim:
                    next_reclaim = now + _jitter(reclaim_every)
                    reclaimed = yield from self._reclaim_steps(consumer, min_idle_ms, 100, max_deliveries)
                    dead, claimed = reclaimed
                    _log_reclaimed(self.name, reclaimed)
                    read_at = clock()
                    for i, job in enumerate(claimed):
                        yield from process(job, claimed[i + 1:], read_at)
                wait = _paused(paused[0], promote_every, next_promote, clock())
                if wait > 0:
                    # The breaker refused a job: read nothing until it may
                    # half-open.
                    yield Pause(wait)
                    continue
                jobs = yield from self._read_steps(consumer, batch, _block(block_ms, promote_every, next_promote, clock()))
            except ResponseError as e:
                if "NOGROUP" in str(e):  # the stream was deleted
                    try:
                        yield from self._ensure_group_steps()
                    except redis.RedisError:
                        yield Pause(1)
                    continue
                log.warning("queue %s: %s", self.name, e)
                yield Pause(1)
                continue
            except redis.RedisError as e:
                log.warning("queue %s: %s", self.name, e)
                yield Pause(1)
                continue
            read_at = clock()
            for i, job in enumerate(jobs):
                yield from process(job, jobs[i + 1:], read_at)


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


class _ServerClock:
    """The Redis server's clock as a worker can tell it (Go's serverClock,
    ``queue/redisqueue/clock.go``): this machine's clock plus the offset
    ``TIME`` showed at the last sync, read at most every ``SYNC_S``. The
    scripts stamp ``first_enqueued_ms`` with ``TIME``, so a job's elapsed time
    (the policy's ``max_elapsed``) is measured on it: workers whose clocks
    differ by minutes decide alike."""

    SYNC_S = 10.0

    def __init__(self) -> None:
        self._offset_ms = 0  # TIME minus time.time() at the last sync
        self._synced: Optional[float] = None  # time.monotonic() of the last sync

    def now_ms(self) -> int:
        """The server's time in unix ms, as of the last sync (this machine's
        before the first)."""
        return int(time.time() * 1000) + self._offset_ms

    def sync_steps(self) -> Steps[None]:
        """Reads ``TIME`` when the last sync is older than ``SYNC_S``, taking
        the middle of the round trip as the moment Redis read its clock. A
        failed read keeps the last offset."""
        if self._synced is not None and time.monotonic() - self._synced < self.SYNC_S:
            return
        before = time.time()
        try:
            sec, usec = yield Command("time")
        except redis.RedisError:
            return
        after = time.time()
        self._offset_ms = int(sec) * 1000 + int(usec) // 1000 - round((before + after) * 500)
        self._synced = time.monotonic()


class _Settle:
    """The state of applying one job's outcome while Redis refuses it: the
    plan, decided once, is sent again with jittered backoff (doubling from
    20 ms to at most 2 s and a quarter of ``min_idle_ms``), the job and the
    jobs of its batch still waiting are held in between, and the log says
    what happened. The worker's loop (``_work_steps``) does the steps."""

    def __init__(self, q: _Base, job: Job, plan: _decide.Plan, waiting: Sequence[Job], min_idle_ms: int) -> None:
        self.q, self.job, self.plan, self.action = q, job, plan, plan[0]
        self.ids = _batch_ids(job, waiting)
        self.ceiling = min(_APPLY_CAP, max(0.001, min_idle_ms / 4000)) if min_idle_ms > 0 else _APPLY_CAP
        self.delay = min(_APPLY_BASE, self.ceiling)
        self.refusals = 0
        self._hold_failed = False

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


_check_job_type = _queue.check_job_type


def _actor(op: str, actor: Optional[str]) -> str:
    """An actor to record in the audit: None or "" records nothing, else
    1..256 bytes of UTF-8 (as the Go queue's)."""
    if actor is None or actor == "":
        return ""
    if not isinstance(actor, str) or len(actor.encode()) > 256:
        raise ValueError("%s: actor must be a string of at most 256 bytes (got %r)" % (op, actor))
    return actor


def _replay_type(job_type: Optional[str]) -> str:
    if job_type is None:
        return ""
    _check_job_type("replay", "job_type", job_type)
    return job_type


_typed_policies = _queue.typed_policies


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
    default = 5 * min_idle_ms / 1000 if _is_int(min_idle_ms) and min_idle_ms > 0 else _queue.HANDLER_TIMEOUT_S
    return _queue.handler_timeout(handler_timeout, default), max(min_idle_ms / 3000, 0.01)


def _default_consumer() -> str:
    return "%s-%d" % (socket.gethostname(), os.getpid())


_jitter = _queue.jitter
_check_metrics = _queue.check_metrics


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


def _stats_commands(q: _Base) -> List[Command]:
    return [Command("xlen", (q.keys.jobs,)), Command("xpending", (q.keys.jobs, q.group)),
            Command("zcard", (q.keys.delayed,)), Command("xlen", (q.keys.dlq,)), Command("hgetall", (q.keys.stats,))]


def _stats(r: List[Any]) -> Stats:
    for v in r:
        if isinstance(v, Exception) and "NOGROUP" not in str(v):
            raise v
    pending = r[1]["pending"] if isinstance(r[1], dict) else 0  # NOGROUP: no group yet, nothing pending
    return Stats(int(r[0]), int(pending), int(r[2]), int(r[3]), {_text(k): int(v) for k, v in r[4].items()})


_error_text = _queue.error_text
