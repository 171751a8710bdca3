"""What the asyncio and the sync RabbitMQ workers share, with no client
library: the topology (queue/rabbitmq/README.md), the headers, the jobs and
dead letters read from them, and the message each outcome publishes."""

from __future__ import annotations

import collections
import random
import secrets
import re
import time
from dataclasses import dataclass, field
from decimal import Decimal
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, Generator, Iterable, List, Mapping, NamedTuple, Optional, Tuple, Union

from .. import _decide
from .._policy import Policy

LEVELS = 18  # backstop.delay.L0 .. L17: the routing key's bits (and the first topology's TTL queues)
HOLD_LEVELS = 11  # backstop.hold.L0 .. L10: the queues the movers hold delayed messages in
MAX_HOP_S = (1 << HOLD_LEVELS) - 1  # 34 min in one pass: no hold outlasts the consumer timeout
DELIVER = "backstop.delay.deliver"
MOVE_PREFETCH = 1000  # deliveries a mover holds per hold queue
MOVE_RETRY_S = 10.0  # the pause before a move the broker refused is tried again
MOVE_REENTER_MS = 10_000  # a move the broker refused waits this long in the delay again
MAX_MOVE_REFUSALS = 30  # refusals of one delayed message before it is dead-lettered as unroutable
UNROUTABLE = "backstop.unroutable"  # dead letters of moves with no queue to go to
#: The fanout exchange every mover binds a queue of its own to, where a run
#: (Go's Queue.Run, ``backstop queue run --amqp.url``, Node's ``run()``) asks
#: the movers for the delayed jobs they hold.
RUN = "backstop.run"
ERROR_MAX = 8192  # bytes of UTF-8 in backstop-last-error and backstop-error, marker included
TABLE_MAX = 65536  # bytes of an encoded header table, far below RabbitMQ's frame_max (128 KiB)
DROPPED_MAX = 1024  # bytes of the backstop-dropped-headers list
MAX_DUE_AHEAD_MS = 30 * 24 * 3600 * 1000  # a backstop-due-ms further ahead than this is malformed
APPLY_GRACE_S = 10.0  # how long a stopping worker still waits for its confirms
# A delayed message enters at its highest set bit's level, not L17: each
# exchange-to-exchange hop costs the publishing channel a topic match.
ENTER = "backstop.delay.enter"
MALFORMED = "malformed message: needs message_id, backstop-attempt >= 1 and backstop-first-enqueued-ms"
DUE_TOO_FAR = "malformed message: backstop-due-ms is more than 30 days ahead"

H_ATTEMPT = "backstop-attempt"
H_FIRST = "backstop-first-enqueued-ms"
H_DEST = "backstop-destination"
H_LAST_REASON = "backstop-last-reason"
H_LAST_ERROR = "backstop-last-error"
H_PREV_DELAY = "backstop-prev-delay-ms"
H_DUE = "backstop-due-ms"
H_TYPE = "backstop-job-type"
H_REASON = "backstop-reason"
H_ERROR = "backstop-error"
H_DL_MS = "backstop-dead-lettered-ms"
H_DROPPED = "backstop-dropped-headers"
H_REFUSALS = "backstop-move-refusals"

_ATTEMPT = re.compile(r"[1-9][0-9]{0,13}\Z")
_DIGITS = re.compile(r"[0-9]{1,18}\Z")  # as Go's headerDigits: fits an int64

Payload = Union[bytes, bytearray, memoryview, str]


def level(n: int) -> str:
    """Exchange ``L<n>``, and the first topology's TTL queue of the same name."""
    return "backstop.delay.L%d" % n


def hold(n: int) -> str:
    """The queue a mover holds the messages of level n in (2^n s)."""
    return "backstop.hold.L%d" % n


def _pattern(bit: int, word: str) -> str:
    # The routing key is the delay's bits, most significant (bit 17) first.
    return ".".join(word if LEVELS - 1 - i == bit else "*" for i in range(LEVELS))


def _enter_pattern(bit: int) -> str:
    # From the enter exchange to level ``bit``: the bits above it 0, it 1.
    return ".".join("0" if LEVELS - 1 - i > bit else "1" if LEVELS - 1 - i == bit else "*" for i in range(LEVELS))


def routing_key(delay_ms: int) -> str:
    """The routing key of a delayed message: its delay in whole seconds,
    rounded up (never early) and capped at 2^11 - 1 (the rest is delayed
    again on arrival), as 18 words of 0 or 1."""
    s = min(MAX_HOP_S, max(0, -(-delay_ms // 1000)))
    return ".".join("1" if s >> (LEVELS - 1 - i) & 1 else "0" for i in range(LEVELS))


class Topology(NamedTuple):
    exchanges: List[Tuple[str, str]]  # (name, type)
    queues: List[Tuple[str, Dict[str, Any]]]  # (name, arguments)
    queue_bindings: List[Tuple[str, str, str, Dict[str, Any]]]  # (queue, exchange, routing key, arguments)
    exchange_bindings: List[Tuple[str, str, str, Dict[str, Any]]]  # (destination, source, routing key, arguments)
    queue_unbindings: Tuple[Tuple[str, str, str], ...] = ()  # (queue, exchange, routing key), after the bindings


def next_exchange(n: int) -> str:
    """Where a message leaves level n for: exchange ``L<n-1>``, the deliver
    exchange for L0."""
    return level(n - 1) if n > 0 else DELIVER


def _shared() -> Topology:
    exchanges = [(level(n), "topic") for n in range(LEVELS)] + [(DELIVER, "headers"), (ENTER, "topic"), (RUN, "fanout")]
    queues, qb, eb = [], [], []
    for n in range(LEVELS):
        # The first topology's TTL queues stay, so that messages delayed
        # before an upgrade drain; below HOLD_LEVELS they are unbound.
        queues.append((level(n), {"x-queue-type": "quorum", "x-message-ttl": (1 << n) * 1000,
                                  "x-dead-letter-exchange": next_exchange(n), "x-dead-letter-strategy": "at-least-once",
                                  "x-overflow": "reject-publish"}))
        if n >= HOLD_LEVELS:
            qb.append((level(n), level(n), _pattern(n, "1"), {}))  # no delay routes here since the cap
        eb.append((next_exchange(n), level(n), _pattern(n, "0"), {}))
    for n in range(HOLD_LEVELS):
        queues.append((hold(n), {"x-queue-type": "quorum"}))
        # Bound before the TTL queue is unbound: a message routed meanwhile
        # goes to both (a duplicate), never to neither.
        qb.append((hold(n), level(n), _pattern(n, "1"), {}))
    queues.append((UNROUTABLE, {"x-queue-type": "quorum"}))
    eb += [(level(n), ENTER, _enter_pattern(n), {}) for n in range(LEVELS)]
    eb.append((DELIVER, ENTER, routing_key(0), {}))  # no bit set: straight to the queue
    return Topology(exchanges, queues, qb, eb, tuple((level(n), level(n), _pattern(n, "1")) for n in range(HOLD_LEVELS)))


SHARED = _shared()


def topology(q: str, max_deliveries: int) -> Topology:
    """The declarations of work queue ``q`` (after SHARED's)."""
    return Topology(
        [(q + ".delay", "fanout"), (q + ".due", "fanout")],
        [(q, {"x-queue-type": "quorum", "x-delivery-limit": max_deliveries + 2, "x-dead-letter-exchange": "",
              "x-dead-letter-routing-key": q + ".dlq", "x-dead-letter-strategy": "at-least-once",
              "x-overflow": "reject-publish"}),
         (q + ".dlq", {"x-queue-type": "quorum"})],
        [(q, q + ".due", "", {})],
        [(ENTER, q + ".delay", "", {}), (q + ".due", DELIVER, "", {"x-match": "all", H_DEST: q})],
    )


# -- headers -------------------------------------------------------------------


def _text(v: Any) -> str:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(int(v))
    return str(v)


def _num(v: Any) -> Optional[int]:
    """A header number: a string of decimal digits or an AMQP integer (a
    byte array, a float, a boolean is none)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v if v >= 0 else None
    return int(v) if isinstance(v, str) and _DIGITS.match(v) else None


def now_ms() -> int:
    return int(time.time() * 1000)


def _seconds(v: Any) -> int:
    """The timestamp property in whole seconds (aio-pika gives a datetime,
    pika an int); 0 when not set."""
    if isinstance(v, datetime):
        v = int(v.timestamp())
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


@dataclass(frozen=True)
class Job:
    """One delivery of a job, read from backstop's headers.

    ``attempt`` is the 1-based number of this execution and ``id`` (the
    message id) the job's stable identity, its idempotency key.
    ``malformed`` marks a message without an id, a whole ``attempt`` >= 1
    or a first-enqueued time: the worker dead-letters it (reason
    ``malformed``) without running it; ``headers`` holds every header to
    see why. ``delivery_count`` is the broker's
    ``x-delivery-count`` (deliveries that ended without an ack), read on
    a redelivery only: on a first delivery the header is another
    publisher's (a shovel copies it), 0.

    A plain message, with neither ``backstop-attempt`` nor
    ``backstop-first-enqueued-ms`` (a producer that knows nothing of
    backstop), is the job's first attempt: its id the message id; first
    enqueued at its timestamp property, or without one when it was
    received. One without a message id has ``id`` "": the worker adopts it
    (``adopted``) before it runs. Every message the worker publishes for
    a job (retry, defer, dead letter) carries the job id as message id
    and backstop's headers, so it is plain once only."""

    id: str
    attempt: int
    first_enqueued_ms: int
    payload: bytes
    queue: str
    content_type: str = ""
    job_type: str = ""
    last_reason: str = ""
    last_error: str = ""
    prev_delay_ms: int = 0
    due_ms: int = 0
    delivery_count: int = 0
    malformed: bool = False
    headers: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def first_enqueued(self) -> datetime:
        """When the job was first enqueued, in UTC."""
        return datetime.fromtimestamp(self.first_enqueued_ms / 1000, timezone.utc)


def job_from(queue: str, message_id: Optional[str], headers: Optional[Mapping[str, Any]], body: bytes,
             content_type: Optional[str], timestamp: Any = None, received_ms: Optional[int] = None,
             redelivered: bool = False) -> Job:
    """The job of a delivery: its message id, headers, body, content type
    and timestamp property; ``received_ms`` (default now) the time of
    receipt, a plain message's first-enqueued time without a timestamp;
    ``redelivered`` the delivery's flag (only then is ``x-delivery-count``
    the broker's)."""
    h = dict(headers or {})
    jid = _text(message_id)
    prev = _num(h.get(H_PREV_DELAY)) or 0
    if H_ATTEMPT not in h and H_FIRST not in h:
        # Plain: not malformed, its first attempt (no delay before it).
        attempt, malformed, prev = 1, False, 0
        ts = _seconds(timestamp)
        first: Optional[int] = ts * 1000 if ts else (now_ms() if received_ms is None else received_ms)
    else:
        n, first = _num(h.get(H_ATTEMPT)), _num(h.get(H_FIRST))
        a = h.get(H_ATTEMPT)
        malformed = (not message_id or n is None or not _ATTEMPT.match(str(n)) or first is None
                     or (isinstance(a, str) and a != str(n)))  # "01": a leading zero
        attempt = n or 0
    count = (_num(h.get("x-delivery-count")) or 0) if redelivered else 0
    return Job(jid, attempt, first or 0, bytes(body), queue, content_type or "",
               _text(h.get(H_TYPE)), _text(h.get(H_LAST_REASON)), _text(h.get(H_LAST_ERROR)),
               prev, _num(h.get(H_DUE)) or 0, count, malformed, h)


@dataclass(frozen=True)
class DeadLetter:
    """A message in the dead letter queue, as ``inspect`` shows it. A
    message the broker moved itself (its consumer kept dying past
    ``x-delivery-limit``) has reason ``crash_loop``."""

    id: str
    reason: str
    error: str
    attempt: int
    first_enqueued_ms: int
    dead_lettered_ms: int
    payload: bytes
    job_type: str = ""
    destination: str = ""
    headers: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


def _reason(h: Mapping[str, Any]) -> str:
    """A dead letter's reason: backstop's header, else the broker's (its
    latest x-death), delivery_limit shown as crash_loop."""
    r = _text(h.get(H_REASON))
    if r:
        return r
    deaths = h.get("x-death")
    if isinstance(deaths, (list, tuple)) and deaths and isinstance(deaths[0], Mapping):
        r = _text(deaths[0].get("reason"))
    r = r or _text(h.get("x-first-death-reason"))
    return "crash_loop" if r == "delivery_limit" else r


def dead_letter_from(message_id: Optional[str], headers: Optional[Mapping[str, Any]], body: bytes) -> DeadLetter:
    """The dead letter a DLQ message is, as inspect shows it: without
    ``x-delivery-count`` (the broker's count of looks, not the dead
    letter's)."""
    h = {k: v for k, v in (headers or {}).items() if k != "x-delivery-count"}
    reason = _reason(h)
    return DeadLetter(_text(message_id), reason, _text(h.get(H_ERROR)), _num(h.get(H_ATTEMPT)) or 0,
                      _num(h.get(H_FIRST)) or 0, _num(h.get(H_DL_MS)) or 0, bytes(body), _text(h.get(H_TYPE)),
                      _text(h.get(H_DEST)), h)


class Stats(NamedTuple):
    """A queue's depths, read live: ``ready`` jobs and ``consumers`` of the
    work queue, ``dlq`` dead letters, and ``delay_levels``: the messages
    ready in the shared delay levels (``hold.L0..L10`` and the first
    topology's ``L0..L17``; not those a running mover holds, unacked), for
    every queue of the virtual host (one queue's delayed jobs cannot be
    counted apart)."""

    ready: int
    consumers: int
    dlq: int
    delay_levels: int = 0


# -- moves ---------------------------------------------------------------------


class _Publish(NamedTuple):
    exchange: str
    routing_key: str
    headers: Dict[str, Any]


class Publish(_Publish):
    """A message to publish (with confirms) before the delivery is acked:
    ``(exchange, routing_key, headers)``, with the delivery's properties
    but ``message_id`` when set (the job id: a plain message may have
    none)."""

    message_id: str

    def __new__(cls, exchange: str, routing_key: str, headers: Dict[str, Any], message_id: str = "") -> "Publish":
        self = super().__new__(cls, exchange, routing_key, headers)
        self.message_id = message_id
        return self


# The properties a message takes to its next place (with its body and
# headers): every one a publisher may set but the expiration and user_id.
PROPERTIES = ("message_id", "content_type", "content_encoding", "correlation_id", "type", "app_id", "timestamp",
              "priority", "reply_to")

# The broker's own headers: they describe the message's old place, and go
# when it moves (a malformed one keeps them, for a person to read).
_BROKER = frozenset(("x-death", "x-first-death-exchange", "x-first-death-queue", "x-first-death-reason",
                     "x-last-death-exchange", "x-last-death-queue", "x-last-death-reason", "x-delivery-count"))


def bounded_error(text: str) -> str:
    """An error as ``backstop-last-error`` and ``backstop-error`` carry it:
    at most ERROR_MAX bytes of UTF-8, a longer one cut on a character
    boundary and ended by `` …[truncated: N bytes]`` (N its full length;
    the marker counts in the bound), so that no handler's error can make
    a header frame the broker refuses."""
    b = text.encode("utf-8", "replace")
    if len(b) <= ERROR_MAX:
        return text
    marker = " …[truncated: %d bytes]" % len(b)
    keep = ERROR_MAX - len(marker.encode("utf-8"))
    return b[:keep].decode("utf-8", "ignore") + marker


def _value_size(v: Any) -> int:
    """The bytes of a field value in an AMQP table, type octet included (a
    number at its widest: its type on the wire is the client's)."""
    if v is None:
        return 1
    if isinstance(v, bool):
        return 2
    if isinstance(v, (int, float, datetime)):
        return 9
    if isinstance(v, Decimal):
        return 6
    if isinstance(v, (bytes, bytearray, memoryview)):
        return 5 + len(bytes(v))
    if isinstance(v, Mapping):
        return 1 + table_size(v)
    if isinstance(v, (list, tuple)):
        return 5 + sum(_value_size(x) for x in v)
    return 5 + len(_text(v).encode("utf-8", "replace"))  # a long string


def _entry_size(k: str, v: Any) -> int:
    return 1 + len(k.encode("utf-8", "replace")) + _value_size(v)


def table_size(h: Mapping[str, Any]) -> int:
    """The bytes of ``h`` encoded as an AMQP field table."""
    return 4 + sum(_entry_size(k, v) for k, v in h.items())


def fit(h: Dict[str, Any]) -> Dict[str, Any]:
    """The headers a publish sends, within the README's bounds (so that no
    publish exceeds the broker's frame_max, which closes the connection):
    the error headers bounded (``bounded_error``); then, if the table is
    over TABLE_MAX bytes, foreign headers (not ``backstop-*``, not
    ``x-death``) dropped, largest first (ties by name), while it exceeds
    TABLE_MAX less the room of the list at its largest, their names
    appended to ``backstop-dropped-headers`` (after an earlier list),
    whole names within DROPPED_MAX bytes."""
    out = dict(h)
    for k in (H_LAST_ERROR, H_ERROR):
        if isinstance(out.get(k), str):
            out[k] = bounded_error(out[k])
    size = table_size(out)
    if size <= TABLE_MAX:
        return out
    foreign = sorted(((_entry_size(k, v), k) for k, v in out.items() if not k.startswith("backstop-") and k != "x-death"),
                     key=lambda f: (-f[0], f[1].encode("utf-8", "replace")))
    dropped: List[str] = []
    if H_DROPPED in out:  # rewritten below, with the new names
        prev = out.pop(H_DROPPED)
        size -= _entry_size(H_DROPPED, prev)
        if _text(prev):
            dropped.append(_text(prev))
    limit = TABLE_MAX - _entry_size(H_DROPPED, " " * DROPPED_MAX)
    for n, k in foreign:
        if size <= limit:
            break
        del out[k]
        size -= n
        dropped.append(k)
    listed = ",".join(dropped).encode("utf-8", "replace")
    if len(listed) > DROPPED_MAX:
        listed = listed[:max(0, listed.rfind(b",", 0, DROPPED_MAX + 1))]  # whole names only
    out[H_DROPPED] = listed.decode("utf-8", "replace")
    return out


def _own(h: Mapping[str, Any]) -> Dict[str, Any]:
    """The headers a message takes to its next place: every one (the job
    type, others' headers) but the broker's."""
    return {k: v for k, v in h.items() if k not in _BROKER}


def enqueue_headers(q: str, job_type: Optional[str], now: int) -> Dict[str, Any]:
    h: Dict[str, Any] = {H_ATTEMPT: "1", H_FIRST: str(now), H_DEST: q}
    if job_type:
        h[H_TYPE] = job_type
    return h


def enqueued(q: str, job_id: str, job_type: Optional[str], delay_ms: int, now: int) -> Publish:
    """Job ``job_id``'s first message: to ``q``, or after ``delay_ms``
    through ``Q.delay``."""
    h = enqueue_headers(q, job_type, now)
    return delayed(q, h, delay_ms, now, job_id) if delay_ms > 0 else Publish("", q, h, job_id)


def delay_ms(who: str, v: Any) -> int:
    """``enqueue``'s ``delay`` (seconds, or a timedelta; None: none) in ms,
    rounded up; refused past 30 days (the longest due time a worker
    accepts), naming the option."""
    if v is None:
        return 0
    if isinstance(v, timedelta):
        v = v.total_seconds()
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:
        raise ValueError("%s: delay must be a number of seconds >= 0 or a timedelta (got %r)" % (who, v))
    if v * 1000 > MAX_DUE_AHEAD_MS:
        raise ValueError("%s: delay must be at most 30 days (got %r s)" % (who, v))
    return -(-int(v * 1000 * 1000) // 1000)  # µs, then ms rounded up: never early


def _job_headers(job: Job) -> Dict[str, Any]:
    """The headers a job's message takes to its next place: its own (not
    the broker's), with backstop's attempt and first-enqueued time, which
    a plain message had not."""
    h = _own(job.headers)
    h.setdefault(H_ATTEMPT, str(job.attempt))
    h.setdefault(H_FIRST, str(job.first_enqueued_ms))
    return h


def delayed(q: str, h: Dict[str, Any], delay_ms: int, now: int, message_id: str = "") -> Publish:
    h[H_DEST] = q
    h[H_DUE] = str(now + delay_ms)
    return Publish(q + ".delay", routing_key(delay_ms), h, message_id)


def dead_letter(q: str, job: Job, reason: str, error: str, now: int) -> Publish:
    # A malformed message keeps the broker's headers (x-death: where it
    # was), for a person to read; never x-delivery-count.
    h = {k: v for k, v in job.headers.items() if k != "x-delivery-count"} if job.malformed else _job_headers(job)
    h.update({H_REASON: reason, H_ERROR: error, H_DL_MS: str(now)})
    if not job.malformed:
        h.setdefault(H_DEST, q)
    return Publish("", q + ".dlq", h, job.id)


def move(q: str, job: Job, plan: _decide.Plan, now: int) -> Optional[Publish]:
    """The message a plan publishes before the ack (None for a success)."""
    action, reason, _, text, delay = plan[:5]
    if action == "ack":
        return None
    if action == "dead_letter":
        return dead_letter(q, job, reason, text, now)
    h = _job_headers(job)
    h[H_LAST_REASON] = reason
    if text:  # a deferral the breaker made before the job ran keeps the last error
        h[H_LAST_ERROR] = text
    if action == "retry":
        h.update({H_ATTEMPT: str(job.attempt + 1), H_PREV_DELAY: str(delay)})
    return delayed(q, h, delay, now, job.id)


def early(q: str, job: Job, now: int) -> Publish:
    """A job that arrived before it is due, delayed again for the rest."""
    return Publish(q + ".delay", routing_key(job.due_ms - now), dict(_job_headers(job), **{H_DEST: q}), job.id)


def adopted(q: str, job: Job) -> Publish:
    """A plain message without a message id published again to ``q`` with
    an id of its own, ``amqp-`` and 32 random lowercase hex digits (two
    events with one body are two jobs), its headers (but the broker's
    ``x-delivery-count``), properties and body unchanged: the copy runs as
    the job's attempt 1 once the broker confirmed it and the original is
    acked (a crash in between duplicates, never loses)."""
    h = {k: v for k, v in job.headers.items() if k != "x-delivery-count"}
    return Publish("", q, h, "amqp-" + secrets.token_hex(16))


def crash_loop(job: Job, max_deliveries: int) -> _decide.Plan:
    return _decide.Plan("dead_letter", "crash_loop", None, "crash loop: delivered %d times without an outcome "
                        "(max deliveries %d)" % (job.delivery_count + 1, max_deliveries), 0)


def replayed(q: str, d: DeadLetter, keep_attempts: bool, now: int) -> Publish:
    """A dead letter sent back to its queue: afresh (attempt 1, a new
    first-enqueued time), or with its attempt kept."""
    h = _own(d.headers)
    for k in (H_REASON, H_ERROR, H_DL_MS, H_DUE, H_PREV_DELAY, H_LAST_ERROR):
        h.pop(k, None)
    if not keep_attempts:
        h.update({H_ATTEMPT: "1", H_FIRST: str(now)})
    if d.reason:
        h[H_LAST_REASON] = d.reason
    dest = d.destination or q
    h[H_DEST] = dest
    return Publish("", dest, h)


# The audit queue Q.audit (Go's rabbitmq.declareAudit): quorum, the last
# 10,000 records kept; a replay given an actor records each dead letter
# there, as Go's does.
AUDIT_ARGUMENTS = {"x-queue-type": "quorum", "x-max-length": 10000, "x-overflow": "drop-head"}


def check_actor(op: str, actor: Any) -> str:
    """An actor to record in the audit: None or "" records nothing, else at
    most 256 bytes (as Go's queue.CheckActor)."""
    if actor is None or actor == "":
        return ""
    if not isinstance(actor, str) or len(actor.encode()) > 256:
        raise ValueError("%s: actor must be a string of at most 256 bytes (got %r)" % (op, actor))
    return actor


def replay_record(q: str, d: DeadLetter, actor: str, now: int) -> Publish:
    """The audit record of dead letter d replayed by actor (published with
    no body: the job is back in its queue): its headers, with action
    replay, the actor, at-ms and its reason (Go's Replay with an Actor)."""
    h = _own(d.headers)
    h.update({"backstop-audit-action": "replay", "backstop-audit-actor": actor,
              "backstop-audit-at-ms": str(now), H_REASON: d.reason})
    return Publish("", q + ".audit", h)


# -- the mover: the hops between delay levels ----------------------------------


def low_seconds(n: int, key: str) -> Optional[int]:
    """The delay still to go below level n: the value in seconds of the
    routing key's bits below n (its 18 words are bits 17..0, most
    significant first); None for a key that is not 18 words of 0 or 1."""
    words = key.split(".")
    if len(words) != LEVELS or any(w not in ("0", "1") for w in words):
        return None
    return int("".join(words[LEVELS - n:]) or "0", 2)


def release_ms(n: int, key: str, headers: Optional[Mapping[str, Any]], received_ms: int) -> int:
    """When a delivery of ``hold.L<n>`` received at ``received_ms`` (unix ms)
    leaves its level: 2^n s after it was received, or earlier when its due
    time says that it entered the level before (it waited there for a
    mover): ``backstop-due-ms`` less the delay still to go below n. Without
    a valid due time or routing key, by the receipt alone."""
    at = received_ms + (1 << n) * 1000
    due = (headers or {}).get(H_DUE)
    if isinstance(due, (bytes, bytearray)):
        due = bytes(due).decode("ascii", "replace")
    due = _num(due)
    low = low_seconds(n, key)
    if not due or low is None:
        return at
    return min(at, due - low * 1000)


# -- run (README, "Run a delayed job now") ------------------------------------

def _text(v: Any) -> str:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    return "" if v is None else str(v)


class RunCommand(NamedTuple):
    """A run's command to the movers: ``count`` the held deliveries it
    selects, or ``take`` at most ``limit`` of them, earliest due first."""

    queue: str
    job_id: str  # "" for a due time bound
    before_ms: Optional[int]
    take: bool
    limit: int


def run_command(headers: Optional[Mapping[str, Any]]) -> RunCommand:
    h = headers or {}
    take = _text(h.get("backstop-run-op")) == "take"
    return RunCommand(_text(h.get("backstop-run-queue")), _text(h.get("backstop-run-id")),
                      _num(h.get("backstop-run-due-before-ms")), take,
                      (_num(h.get("backstop-run-limit")) or 0) if take else 0)


def run_selects(cmd: RunCommand, message_id: Optional[str], headers: Optional[Mapping[str, Any]]) -> bool:
    """Whether a held delivery is one the command selects: of its queue,
    with its job id or due at or before its bound."""
    h = headers or {}
    if _text(h.get(H_DEST)) != cmd.queue:
        return False
    if cmd.job_id:
        return (message_id or "") == cmd.job_id
    return cmd.before_ms is not None and (_num(h.get(H_DUE)) or 0) <= cmd.before_ms


def due_of(headers: Optional[Mapping[str, Any]]) -> int:
    return _num((headers or {}).get(H_DUE)) or 0


def run_publish(headers: Optional[Mapping[str, Any]]) -> Publish:
    """A held delivery run now: to its work queue (default exchange), its
    attempt and every header kept but its due time (the worker would delay
    it again), its move refusals, the broker's and x-delivery-count."""
    h = {k: v for k, v in (headers or {}).items()
         if k not in _BROKER and k not in ("x-delivery-count", H_DUE, H_REFUSALS)}
    return Publish("", _text((headers or {}).get(H_DEST)), h)


MAX_RUN_LIMIT = 10_000  # the most delayed jobs one run moves by due time (Go's queue.MaxRunLimit)
RUN_WAIT_S = 5.0  # how long a run waits for a mover's answer
#: The queues a delayed message can wait in: the hold levels, then the
#: first topology's TTL levels.
RUN_LEVELS = tuple(hold(n) for n in range(HOLD_LEVELS)) + tuple(level(n) for n in range(LEVELS))


class Ran(NamedTuple):
    """What ``run`` did: ``moved`` jobs published to the queue, ``left``
    due before ``due_before`` beyond the limit."""

    moved: int
    left: int


class SilentMovers(Exception):
    """Some movers did not answer a run within 5 s: the delayed jobs they
    hold were not looked at. ``ran`` says what moved."""

    def __init__(self, silent: int, ran: Ran) -> None:
        super().__init__("run: %d movers did not answer within %gs: the delayed jobs they hold were not looked at "
                         "(moved %d)" % (silent, RUN_WAIT_S, ran.moved))
        self.silent, self.ran = silent, ran


def run_args(queue: str, job_id: Optional[str], due_before: Any, limit: Optional[int]) -> RunCommand:
    """``run``'s arguments, checked (raising at once, naming the argument),
    as the command that selects its jobs (limit: the most moved)."""
    if (job_id is None) == (due_before is None):
        raise ValueError("run: give one of job_id and due_before (got job_id=%r, due_before=%r)" % (job_id, due_before))
    if job_id is not None:
        if not isinstance(job_id, str) or not job_id:
            raise ValueError("run: job_id must be a non-empty string (got %r)" % (job_id,))
        if limit is not None:
            raise ValueError("run: limit goes with due_before, not job_id")
        return RunCommand(queue, job_id, None, True, 100_000)
    if isinstance(due_before, datetime):
        if due_before.tzinfo is None:
            raise ValueError("run: due_before must be an aware datetime (got %r)" % (due_before,))
        due_before = int(due_before.timestamp() * 1000)
    check_int("run", "due_before", due_before, 0, 1 << 62)
    limit = 100 if limit is None else limit
    check_int("run", "limit", limit, 1, MAX_RUN_LIMIT)
    return RunCommand(queue, "", due_before, True, limit)


def run_ask(cmd: RunCommand, op: str, n: int) -> Dict[str, Any]:
    """The headers of a run's command to the movers."""
    h = {"backstop-run-queue": cmd.queue, "backstop-run-op": op, "backstop-run-limit": str(n)}
    if cmd.job_id:
        h["backstop-run-id"] = cmd.job_id
    else:
        h["backstop-run-due-before-ms"] = str(cmd.before_ms)
    return h


def run_answer(headers: Optional[Mapping[str, Any]]) -> Tuple[str, int, int]:
    """A mover's answer: (its command queue, matched, moved)."""
    h = headers or {}
    return _text(h.get("backstop-run-mover")), _num(h.get("backstop-run-matched")) or 0, _num(h.get("backstop-run-moved")) or 0


def run_movers(counts: Iterable[Optional[Mapping[str, Any]]], movers: int, limit: int,
               ran: Ran) -> Generator[Tuple[str, int], Optional[Mapping[str, Any]], Ran]:
    """The movers' part of a run, without I/O (the sync and asyncio queues
    drive it): given the headers of the answers to "count" of the
    ``movers`` consumers and what the levels moved (``ran``), it yields
    (mover, n) for each "take" to ask, the most matched first, and is sent
    that mover's answer (None: it did not answer). Returns what the run did,
    or raises SilentMovers."""
    moved, left = ran
    counted = sorted((run_answer(h) for h in counts), key=lambda a: -a[1])
    silent = movers - len(counted)
    for mover, matched, _ in counted:
        if matched == 0:
            continue
        if moved >= limit:
            left += matched
            continue
        answer = yield mover, limit - moved
        if answer is None:
            silent += 1
            continue
        _, m, n = run_answer(answer)
        moved, left = moved + n, left + max(m - n, 0)
    if silent:
        raise SilentMovers(silent, Ran(moved, left))
    return Ran(moved, left)


def run_reply(matched: int, moved: int, mover: str) -> Dict[str, Any]:
    """A mover's answer to a run command (its headers)."""
    return {"backstop-run-matched": str(matched), "backstop-run-moved": str(moved), "backstop-run-mover": mover}


def moved(n: int, key: str, headers: Optional[Mapping[str, Any]]) -> Publish:
    """A delivery of ``hold.L<n>`` on to its next exchange, unchanged but for
    the hold queue's own ``x-delivery-count`` (the work queue's worker reads
    it as its own: crash loops)."""
    return Publish(next_exchange(n), key, {k: v for k, v in (headers or {}).items() if k != "x-delivery-count"})


def unroutable_error(dest: str) -> str:
    if not dest:
        return "no route for a delayed message without backstop-destination"
    return 'no route to queue "%s": it was deleted or never declared' % dest


def refused_error(refusals: int, why: str) -> str:
    return "the broker refused the delayed message's move %d times (a full queue or delay level): %s" % (refusals, why)


def _move_dead_letters(headers: Optional[Mapping[str, Any]], error: str, now: int) -> List[Publish]:
    """A delayed message the mover cannot move on, dead-lettered with reason
    ``unroutable`` (the broker's headers and the refusal count left out):
    to ``Q.dlq`` (Q its destination), or when that returns too, or it has
    none, to UNROUTABLE."""
    h = _own(headers or {})
    h.pop(H_REFUSALS, None)
    h.update({H_REASON: "unroutable", H_ERROR: error, H_DL_MS: str(now)})
    dest = _text(h.get(H_DEST))
    return ([Publish("", dest + ".dlq", h)] if dest else []) + [Publish("", UNROUTABLE, dict(h))]


def move_returned(headers: Optional[Mapping[str, Any]], now: int) -> List[Publish]:
    """What the mover publishes, in turn until one is confirmed, for a move
    the broker returned (no route: its work queue is gone)."""
    return _move_dead_letters(headers, unroutable_error(_text((headers or {}).get(H_DEST))), now)


def move_refused(headers: Optional[Mapping[str, Any]], now: int,
                 why: str = "rabbitmq: the broker rejected the message") -> List[Publish]:
    """What the mover publishes for a move the broker refused (nack: a full
    work queue or level): the message enters the delay again, due at the
    later of its own due time and now + 10 s, ``backstop-move-refusals`` +
    1, so that it does not hold a place in the mover's prefetch; at the
    30th refusal, its dead letters (``unroutable``)."""
    h = {k: v for k, v in (headers or {}).items() if k != "x-delivery-count"}
    n = (_num(h.get(H_REFUSALS)) or 0) + 1
    if n >= MAX_MOVE_REFUSALS:
        return _move_dead_letters(h, refused_error(n, why), now)
    due = max(_num(h.get(H_DUE)) or 0, now + MOVE_REENTER_MS)
    h.update({H_REFUSALS: str(n), H_DUE: str(due)})
    return [Publish(ENTER, routing_key(due - now), h)]


def after_move(n: int, pub: Publish, result: str, headers: Optional[Mapping[str, Any]], now: int) -> Optional[List[Publish]]:
    """What a mover of ``hold.L<n>`` publishes next, in turn until one is
    confirmed, after ``pub`` was ``"returned"`` (no route) or ``"refused"``
    (nack): for the move itself, its dead letters (returned) or its
    re-entry into the delay (refused); for a dead letter returned, the
    next one in turn ([]). None: the message is held and its move tried
    again after MOVE_RETRY_S (a re-entry or dead letter refused: a
    cluster electing a leader)."""
    if pub.exchange == next_exchange(n):
        return move_returned(headers, now) if result == "returned" else move_refused(headers, now)
    return [] if result == "returned" else None


# -- the worker's decisions, broker aside -------------------------------------


def blocked_message(reason: Any) -> str:
    """The log line of a connection the broker blocked (a memory or disk
    alarm: publishes wait, their confirms with them)."""
    return "rabbitmq connection blocked: %s" % _text(reason)


UNBLOCKED = "rabbitmq connection unblocked"


class Backoff:
    """The pauses of a worker connecting again: 0.1 s doubling to 5 s,
    each jittered to half to all of it (a fleet does not reconnect in
    step); reset once it consumes again."""

    BASE, CAP = 0.1, 5.0

    def __init__(self) -> None:
        self.delay = self.BASE

    def reset(self) -> None:
        self.delay = self.BASE

    def next(self) -> float:
        d = self.delay
        self.delay = min(2 * d, self.CAP)
        return d * (0.5 + random.random() / 2)


def refused_pause(n: int) -> float:
    """Seconds a delivery whose outcome the broker refused (nack) ``n``
    times in a row waits before it is handed back: 20 ms doubling to 5 s,
    jittered (half to all of it). Not at once: while a cluster elects a
    leader the refusals come back to back, and each return counts in
    x-delivery-count (a crash loop for a job that only needed a retry)."""
    d = min(5.0, 0.02 * (1 << min(n - 1, 10)))
    return d / 2 + random.random() * d / 2


class Kept:
    """Outcomes known but not yet applied (the broker refused the publish,
    or the channel was lost before it was confirmed or the delivery
    acked), by (job id, attempt): the broker delivers the message again
    and the worker applies the outcome without running the job twice.
    Bounded: the oldest are forgotten."""

    def __init__(self, size: int = 10000) -> None:
        self._d: "collections.OrderedDict[Tuple[str, int], Tuple[_decide.Plan, bool, int]]" = collections.OrderedDict()
        self.size = size

    def keep(self, job: Job, plan: _decide.Plan, published: bool, refusals: int = 0) -> None:
        """Keeps ``plan``; ``published``: its message was confirmed, only the
        ack is left (publishing it again would duplicate the job);
        ``refusals``: how often in a row the broker refused it (0: the
        channel went)."""
        if job.malformed or not job.id:
            return
        self._d[(job.id, job.attempt)] = (plan, published, refusals)
        self._d.move_to_end((job.id, job.attempt))
        while len(self._d) > self.size:
            self._d.popitem(last=False)

    def take(self, job: Job) -> Optional[Tuple[_decide.Plan, bool, int]]:
        return None if job.malformed else self._d.pop((job.id, job.attempt), None)

    def __len__(self) -> int:
        return len(self._d)


class Step(NamedTuple):
    """What to do with a delivery before (or instead of) running it."""

    plan: Optional[_decide.Plan]  # None: run the handler
    gated: bool  # the breaker refused the job
    early: bool  # due later: delay again, count nothing
    kept: bool  # an outcome kept from a lost channel (decided and counted before)
    published: bool  # ... whose message was confirmed: only the ack is left
    adopt: bool = False  # plain without a message id: published again with one (adopted), count nothing
    refusals: int = 0  # ... (kept) how often in a row the broker refused it


def triage(job: Job, policy: Policy, max_deliveries: int, kept: Kept, now: int) -> Step:
    """The README's order: malformed, an outcome kept from a lost channel,
    a plain message without an id to adopt, a crash loop (a redelivery's
    count), a due time past the bound (dead-lettered as malformed: it
    would cycle through the levels for ever), early, the breaker's
    refusal; else run."""
    if job.malformed:
        return Step(_decide.plan(job, None, policy, _no_classify, MALFORMED, now), False, False, False, False)
    k = kept.take(job)
    if k is not None:
        return Step(k[0], False, False, True, k[1], False, k[2])
    if not job.id:
        return Step(None, False, False, False, False, True)
    # The core says when a redelivery's count is a crash loop (a first delivery never is).
    if job.delivery_count and policy.outcome("delivered", deliveries=job.delivery_count,
                                             max_deliveries=max_deliveries).dead_letter:
        return Step(crash_loop(job, max_deliveries), False, False, False, False)
    if job.due_ms > now + MAX_DUE_AHEAD_MS:
        return Step(_decide.Plan("dead_letter", "malformed", None, DUE_TOO_FAR, 0), False, False, False, False)
    if job.due_ms > now:
        return Step(None, False, True, False, False)
    g = _decide.gate(job, policy)
    if g is not None:
        return Step(g, True, False, False, False)
    return Step(None, False, False, False, False)


def before_run(q: str, job: Job, step: Step, now: int) -> Optional[Publish]:
    """The publish of a delivery that does not run, nothing counted: an
    adoption or an early one's delay for the rest (None: neither)."""
    if step.adopt:
        return adopted(q, job)
    if step.early:
        return early(q, job, now)
    return None


def _no_classify(exc: BaseException) -> Dict[str, Any]:  # pragma: no cover - never called for a malformed job
    return {}


def check_name(who: str, name: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError("%s: %s must be a non-empty string (got %r)" % (who, name, v))
    return v


def check_int(who: str, name: str, v: Any, lo: int, hi: Optional[int] = None) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
        want = "in %d..%d" % (lo, hi) if hi is not None else ">= %d" % lo
        raise ValueError("%s: %s must be a whole number %s (got %r)" % (who, name, want, v))
    return v


def payload_bytes(v: Any) -> bytes:
    if isinstance(v, str):
        return v.encode("utf-8")
    if not isinstance(v, (bytes, bytearray, memoryview)):
        raise TypeError("enqueue: payload must be bytes or str (got %s)" % type(v).__name__)
    return bytes(v)


def replay_args(limit: Any, reason: Any, scan: Any) -> Tuple[int, str, int]:
    check_int("replay", "limit", limit, 1)
    if reason is not None and not isinstance(reason, str):
        raise TypeError("replay: reason must be a string or None (got %r)" % (reason,))
    if scan is None:
        scan = 10 * limit
    check_int("replay", "scan", scan, limit)
    return limit, reason or "", scan


REFRESH_AT = 10  # a dead letter looked at this often is given back as a fresh copy


def refresh(headers: List[Optional[Mapping[str, Any]]]) -> bool:
    """How dead letters looked at (by inspect, or a replay that did not take
    them) go back to the DLQ so that looking never uses them up (README,
    "The DLQ workflow"): RabbitMQ 3.10 to 4.2 count every return in
    x-delivery-count, and 4.x quorum queues drop a message at a delivery
    limit of 20 by default. False: each is returned with basic.nack
    (requeue), one by one in the order taken; True (one of them has an
    x-delivery-count of REFRESH_AT or more): each is published again
    (``refreshed``), confirmed, then acked: the copies start at 0."""
    return any((_num((h or {}).get("x-delivery-count")) or 0) >= REFRESH_AT for h in headers)


def refreshed(dlq: str, headers: Optional[Mapping[str, Any]]) -> Publish:
    """A dead letter's fresh copy at the back of ``dlq``: unchanged but for
    ``x-delivery-count`` (with the properties of the delivery)."""
    return Publish("", dlq, {k: v for k, v in (headers or {}).items() if k != "x-delivery-count"})


def matches(d: DeadLetter, reason: str) -> bool:
    return bool(d.id) and (not reason or d.reason == reason)
