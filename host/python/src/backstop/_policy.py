"""Policy, Decision and load_policy: the policy API over backstop.wasm."""

from __future__ import annotations

import json
import math
import operator
import os
import struct
import weakref
from dataclasses import dataclass
from datetime import timedelta
from random import random as _draw
from time import time as _time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, TypedDict, TypeVar, Union, overload

from ._errors import BackstopError, InputError
from ._runtime import Instance, shared

if TYPE_CHECKING:
    from ._retry import BeforeSleep, Classify

F = TypeVar("F", bound=Callable[..., Any])

# Packed decision (ABI.md, "The packed decision").
_REASONS = ("transient", "retry_after", "uncertain", "permanent_error", "max_attempts_reached",
            "max_elapsed_exceeded", "uncertain_limit_reached", "not_idempotent", "budget_exhausted",
            "circuit_open", "retry_after_too_long")
_CLASSES = ("retryable", "permanent", "uncertain")
_ACTIONS = ("retry", "dead_letter")
_CIRCUIT = ("closed", "open", "half_open")

# gRPC status names, indexed by code.
GRPC_CODES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
              "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
              "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
              "UNAUTHENTICATED")
_GRPC_BY_NAME = {n: i for i, n in enumerate(GRPC_CODES)}

_FLAG_KEY, _FLAG_PUSHBACK = 1, 2
_U16 = 0xFFFF
_I64 = (-(1 << 63), (1 << 63) - 1)
_I32 = (-(1 << 31), (1 << 31) - 1)

# The failure fields (the vector `input` names) and their "absent" values;
# None for now_ms and random means "the host's clock / a fresh draw".
_DEFAULTS: Dict[str, Any] = {
    "attempt": 0, "http_status": 0, "grpc_code": 0, "elapsed_ms": 0, "now_ms": None,
    "random": None, "prev_delay_ms": 0, "method": "", "error_kind": "", "retry_after": "",
    "grpc_retry_pushback_ms": "", "idempotency_key": "",
}
_NFIELDS = len(_DEFAULTS)
_fields = operator.itemgetter(*_DEFAULTS)

# decide_batch record (ABI.md, "decide_batch"): 64 bytes, little-endian.
_RECORD = struct.Struct("<qqqdqiiIIHHHH")
assert _RECORD.size == 64
_CHUNK = 4096  # records per decide_batch call: 256 KiB, the call cost vanishes


class Failure(TypedDict, total=False):
    """The fields of a failure, named as in the shared vectors. All are
    optional; absent means zero or empty."""

    attempt: int  # 1-based number of the execution that just failed
    http_status: Optional[int]
    grpc_code: Union[int, str, Any, None]  # 14, "UNAVAILABLE" or grpc.StatusCode.UNAVAILABLE
    error_kind: Optional[str]  # "timeout", "connection_refused", ...
    retry_after: Union[str, int, float, timedelta, None]  # raw header, or seconds
    grpc_retry_pushback_ms: Union[str, int, None]
    method: Optional[str]
    idempotency_key: Optional[str]
    elapsed_ms: Union[int, float, timedelta]
    now_ms: Union[int, float, None]  # default: the host's clock
    random: Union[float, str, None]  # default: random.random()
    prev_delay_ms: Union[int, float, timedelta]


@dataclass(frozen=True)
class Decision:
    """What to do about a failure.

    ``action`` is ``"retry"`` (after ``delay_ms``) or ``"dead_letter"``;
    ``reason`` says why (``transient``, ``retry_after``, ``uncertain`` for a
    retry; ``permanent_error``, ``max_attempts_reached``, ... otherwise);
    ``klass`` is the failure's class (``retryable``, ``permanent``,
    ``uncertain``; ``"class"`` in JSON). ``delay`` is the delay as a
    ``timedelta`` and ``delay_seconds`` as a float, ready for ``time.sleep``.
    """

    action: str
    delay_ms: int
    reason: str
    klass: str

    @property
    def retry(self) -> bool:
        return self.action == "retry"

    @property
    def delay(self) -> timedelta:
        return timedelta(milliseconds=self.delay_ms)

    @property
    def delay_seconds(self) -> float:
        return self.delay_ms / 1000

    def to_dict(self) -> Dict[str, Any]:
        """The decision in the vector `expect` shape (and key order)."""
        return {"action": self.action, "delay_ms": self.delay_ms, "reason": self.reason, "class": self.klass}


_new = object.__new__
_heads: Dict[int, Dict[str, Any]] = {}  # the fields of each action/class/reason (bits 48..54)


def _unpack(w: int) -> Decision:
    """The Decision of a packed word. Filling a new object's __dict__ from
    a template makes the same frozen object as Decision(...) in half the
    time (no per-field object.__setattr__): this is decide_many's inner loop."""
    h = w >> 48
    t = _heads.get(h)
    if t is None:
        t = _heads[h] = {"action": _ACTIONS[h >> 6 & 1], "delay_ms": 0, "reason": _REASONS[h & 15],
                         "klass": _CLASSES[h >> 4 & 3]}
    d = _new(Decision)
    fields = d.__dict__
    fields.update(t)
    fields["delay_ms"] = w & 0xFFFFFFFFFFFF
    return d


class Policy:
    """A retry policy loaded into backstop.wasm. Make one with
    ``load_policy``. It is safe to use from several threads; a stateful
    policy (retry budget, circuit breaker) sees calls one at a time.

    Each Policy has its own budget and breaker state, even when two are
    loaded from the same source. ``close()`` (or a ``with`` block) frees it
    in the module; an unreachable Policy is freed when collected.
    """

    def __init__(self, inst: Instance, handle: int) -> None:
        self._inst = inst
        self._h = handle
        with inst.lock:
            s = inst.policy_stateful(handle)
        if s < 0:
            raise inst.error("policy_stateful", s)
        self._stateful = s == 1
        self._finalizer = weakref.finalize(self, _free, inst, handle)

    @property
    def stateful(self) -> bool:
        """True when the policy has a retry budget or a circuit breaker."""
        return self._stateful

    def decide(self, failure: Optional[Mapping[str, Any]] = None, /, **fields: Any) -> Decision:
        """Decides a failure given as a dict, as keyword fields, or both
        (the keywords win). The field names are those of ``Failure``.

        ``now_ms`` defaults to the host's clock and ``random`` to
        ``random.random()``: the module itself has neither.

        Raises ``InputError`` for an invalid field (the message names it:
        ``attempt: must be >= 1 (got 0)``) and for an unknown field name.
        """
        if failure is not None:
            fields = {**failure, **fields} if fields else failure  # type: ignore[assignment]
        d = {**_DEFAULTS, **fields}
        if len(d) != _NFIELDS:
            _merge(fields)  # raises for the unknown field
        with self._inst.lock:
            return _unpack(self._decide_locked(d, None))

    def _decide_locked(self, d: Dict[str, Any], now0: Optional[int]) -> int:
        """Decides the merged failure d; the caller holds the lock."""
        attempt, http, grpc, elapsed, now, rnd, prev, method, kind, ra, push, key = _fields(d)
        if now is None:
            now = d["now_ms"] = int(_time() * 1000) if now0 is None else now0
        if rnd is None:
            rnd = d["random"] = _draw()
        inst = self._inst
        try:
            flags, ml, kl, hl = 1 if key else 0, 0, 0, 0  # bit 0: an idempotency key
            if method or kind or ra or push:
                strs, ml, kl, hl, flags = _strings(method, kind, ra, push, flags)
                inst.ensure_buffer(len(strs))[:len(strs)] = strs
            # The struct in the call checks the types of the common case.
            w = inst.decide(self._h, attempt, http, grpc, elapsed, now, rnd, prev, flags, ml, kl, hl)
        except (AttributeError, struct.error):  # unusual types or ranges: convert them
            attempt, http, grpc, elapsed, now, rnd, prev, flags, strs, ml, kl, hl = _convert(d)
            if strs:
                inst.ensure_buffer(len(strs))[:len(strs)] = strs
            w = inst.decide(self._h, attempt, http, grpc, elapsed, now, rnd, prev, flags, ml, kl, hl)
        if w < 0:
            raise inst.error("decide", w)
        return w

    def decide_many(self, failures: Iterable[Mapping[str, Any]]) -> List[Decision]:
        """Decides many failures, in order, as ``decide`` would one by one,
        but in a few calls into the module (about 1 µs a failure).

        All draws of the host's clock in one call share one ``now_ms``. A
        stateful policy decides the whole batch without interleaving other
        calls. An invalid failure does not stop the batch: the others are
        decided (and counted by a stateful policy), then ``InputError`` is
        raised for the first invalid one, with its ``index`` and the
        ``decisions`` (``None`` where invalid).
        """
        fs = failures if isinstance(failures, list) else list(failures)
        n = len(fs)
        out: List[Optional[Decision]] = [None] * n
        first: Optional[InputError] = None
        now0 = int(_time() * 1000)
        inst = self._inst
        with inst.lock:
            i = 0
            while i < n:
                hi = min(n, i + _CHUNK)
                k, buf = _pack_chunk(fs, i, hi, now0)
                if k:
                    out_off = (len(buf) + 7) & ~7
                    view = inst.ensure_buffer(out_off + 8 * k)
                    view[:len(buf)] = buf
                    r = inst.decide_batch(self._h, 0, k, out_off)
                    if r < 0:
                        raise inst.error("decide_batch", r)
                    words = view[out_off:out_off + 8 * k].cast("q").tolist()
                    if first is None and min(words) < 0:  # the message is of the first bad record
                        j = next(j for j, w in enumerate(words) if w < 0)
                        first = _at(inst.error("decide_batch", words[j]), i + j)
                    # Equal words share one (frozen) Decision.
                    memo: Dict[int, Decision] = {}
                    get, put = memo.get, memo.setdefault
                    out[i:i + k] = [get(w) or put(w, _unpack(w)) if w >= 0 else None for w in words]
                    i += k
                if i < hi:  # fs[i] cannot go in a record (invalid, or a long string): alone
                    try:
                        out[i] = _unpack(self._decide_locked(_merge(fs[i]), now0))
                    except InputError as e:
                        first = first or _at(e, i)
                    i += 1
        if first is not None:
            first.decisions = out
            raise first
        return out  # type: ignore[return-value]

    def record_success(self, now_ms: Optional[int] = None) -> None:
        """Reports a success at now_ms (default: the host's clock) to the
        retry budget and the circuit breaker. A no-op for a stateless policy."""
        if not self._stateful:
            return
        now = _now(now_ms)
        inst = self._inst
        with inst.lock:
            r = inst.record_success(self._h, now)
            if r < 0:
                raise inst.error("record_success", r)

    def circuit_state(self, now_ms: Optional[int] = None) -> str:
        """The circuit breaker's state at now_ms (default: the host's clock):
        ``"closed"`` (also when the policy has no breaker), ``"open"`` or
        ``"half_open"``."""
        if not self._stateful:
            return "closed"
        now = _now(now_ms)
        inst = self._inst
        with inst.lock:
            r = inst.circuit_state(self._h, now)
            if r < 0:
                raise inst.error("circuit_state", r)
        return _CIRCUIT[r]

    @overload
    def retry(self, fn: F, /) -> F: ...
    @overload
    def retry(self, fn: None = None, /, *, before_sleep: Optional[BeforeSleep] = None, classify: Optional[Classify] = None,
              method: Optional[str] = None, idempotency_key: Optional[str] = None) -> Callable[[F], F]: ...

    def retry(self, fn: Optional[Callable[..., Any]] = None, /, *, before_sleep: Optional[BeforeSleep] = None,
              classify: Optional[Classify] = None, method: Optional[str] = None,
              idempotency_key: Optional[str] = None) -> Any:
        """A decorator that retries a function (sync or ``async def``) as
        this policy decides: ``@policy.retry`` or ``@policy.retry(...)``.

        An exception (``Exception`` subclasses only: ``KeyboardInterrupt``
        and ``asyncio.CancelledError`` propagate at once) is described as a
        failure by ``classify`` (a mapping from exception types, or a
        function), else by ``backstop.describe``; then the policy decides.
        A retry calls ``before_sleep(RetryState)`` (awaited if it returns an
        awaitable) and sleeps ``decision.delay`` (``asyncio.sleep`` for a
        coroutine function, so cancelling the task ends the wait). Giving up
        raises ``RetryError`` from the last exception, with ``reason`` and
        ``attempts``. A success is reported with ``record_success``.
        ``method`` and ``idempotency_key`` describe the request for the
        idempotency gate when the exception does not.
        """
        from ._retry import retrying

        wrap = retrying(self, before_sleep=before_sleep, classify=classify, method=method,
                        idempotency_key=idempotency_key)
        return wrap(fn) if fn is not None else wrap

    def close(self) -> None:
        """Frees the policy in the module. Later calls raise BackstopError."""
        with self._inst.lock:
            self._h = 0  # under the lock: no call can use the handle once freed
        self._finalizer()

    def __enter__(self) -> Policy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _free(inst: Instance, handle: int) -> None:
    with inst.lock:
        try:
            inst.policy_free(handle)
        except BackstopError:
            pass  # the instance trapped: it holds nothing any more


def load_policy(source: Union[str, bytes, bytearray, Mapping[str, Any], "os.PathLike[str]"]) -> Policy:
    """Loads a policy from a preset name (``"default"``, ``"critical"``,
    ``"batch"``, ``"fast-transient"``), JSON or YAML text (str or bytes), a
    dict (the policy object) or a ``pathlib.Path`` to a JSON or YAML file.

    Raises ``PolicyError`` naming every invalid field.
    """
    if isinstance(source, os.PathLike):
        data = open(source, "rb").read()
    elif isinstance(source, str):
        data = source.encode("utf-8")
    elif isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif isinstance(source, Mapping):
        data = json.dumps(source).encode("utf-8")
    else:
        raise TypeError("load_policy: expected a preset name, JSON or YAML text, a dict or a Path (got %s)"
                        % type(source).__name__)
    return load_into(shared(), data)


def load_into(inst: Instance, source: Any) -> Policy:
    """Loads a policy into a given instance (tests use their own)."""
    data = source.encode("utf-8") if isinstance(source, str) else source
    with inst.lock:
        inst.ensure_buffer(len(data))[:len(data)] = data
        h = inst.policy_load(len(data))
        if h < 0:
            raise inst.error("policy_load", h)
    return Policy(inst, h)


# -- failure fields ------------------------------------------------------------


def _merge(fields: Mapping[str, Any]) -> Dict[str, Any]:
    """The failure with every field, absent ones at their defaults."""
    d = {**_DEFAULTS, **fields}
    if len(d) != _NFIELDS:
        name = next(k for k in fields if k not in _DEFAULTS)
        raise InputError(str(name), "unknown field (want one of %s)" % ", ".join(_DEFAULTS))
    return d


def _at(e: BackstopError, index: int) -> InputError:
    if not isinstance(e, InputError):
        raise e
    return InputError(e.field, e.reason, index)


def _pack_chunk(fs: List[Mapping[str, Any]], lo: int, hi: int, now0: int) -> Tuple[int, bytearray]:
    """Packs fs[lo:hi] as decide_batch records followed by their strings.
    Stops before a failure that cannot go in a record (an invalid field or
    a string over 64 KiB), which the caller decides alone. Returns how many
    were packed, and the bytes."""
    soff = (hi - lo) * 64
    buf = bytearray(soff)
    off = 0
    # Locals, not globals, in the loop: this runs a million times a second.
    pack, defaults, nfields, fields, draw, strings = _RECORD.pack_into, _DEFAULTS, _NFIELDS, _fields, _draw, _strings
    for f in fs[lo:hi]:
        d = {**defaults, **f}
        if len(d) != nfields:
            break
        attempt, http, grpc, elapsed, now, rnd, prev, method, kind, ra, push, key = fields(d)
        if now is None:
            now = now0
        if rnd is None:
            rnd = draw()
        try:
            flags, strs, ml, kl, hl = 1 if key else 0, b"", 0, 0, 0  # bit 0: an idempotency key
            if method or kind or ra or push:
                strs, ml, kl, hl, flags = strings(method, kind, ra, push, flags)
            pack(buf, off, attempt, elapsed, now, rnd, prev, http, grpc, flags, soff, ml, kl, hl, 0)
        except (AttributeError, struct.error):  # unusual types or ranges: convert them
            d["now_ms"], d["random"] = now, rnd
            try:
                attempt, http, grpc, elapsed, now, rnd, prev, flags, strs, ml, kl, hl = _convert(d)
                pack(buf, off, attempt, elapsed, now, rnd, prev, http, grpc, flags, soff, ml, kl, hl, 0)
            except (InputError, struct.error):
                break
        if strs:
            buf += strs
            soff += len(strs)
        off += 64
    return off >> 6, buf



def _strings(method: Any, kind: Any, ra: Any, push: Any, flags: int) -> Tuple[bytes, int, int, int, int]:
    """The strings of a failure as the ABI lays them out: method, error
    kind, then the hint (Retry-After wins over the gRPC pushback)."""
    m = method.encode() if method else b""
    k = kind.encode() if kind else b""
    if ra:
        h = ra.encode()
    elif push:
        h = push.encode()
        flags |= _FLAG_PUSHBACK
    else:
        h = b""
    return m + k + h, len(m), len(k), len(h), flags


def _convert(d: Dict[str, Any]) -> Tuple[Any, ...]:
    """Converts every field of a merged failure dict to its ABI value,
    accepting the looser types the fast path does not."""
    attempt = _sat(_int("attempt", d["attempt"]), _I64)
    http = _sat(_int("http_status", d["http_status"] or 0), _I32)
    grpc = _sat(_grpc(d["grpc_code"]), _I32)
    elapsed = _sat(_ms("elapsed_ms", d["elapsed_ms"]), _I64)
    now = _sat(_ms("now_ms", d["now_ms"]), _I64)
    rnd = _float("random", d["random"])
    prev = _sat(_ms("prev_delay_ms", d["prev_delay_ms"]), _I64)
    flags = _FLAG_KEY if d["idempotency_key"] else 0
    ra = _hint("retry_after", d["retry_after"])
    push = _hint("grpc_retry_pushback_ms", d["grpc_retry_pushback_ms"])
    strs, ml, kl, hl, flags = _strings(_str("method", d["method"]), _str("error_kind", d["error_kind"]), ra, push, flags)
    return attempt, http, grpc, elapsed, now, rnd, prev, flags, strs, ml, kl, hl


def _now(now_ms: Any) -> int:
    return int(_time() * 1000) if now_ms is None else _sat(_ms("now_ms", now_ms), _I64)


def _sat(v: int, lim: Tuple[int, int]) -> int:
    # Saturate so an out-of-range value stays out of range (and is refused
    # by the module with its message) instead of wrapping into a valid one.
    return min(max(v, lim[0]), lim[1])


def _int(name: str, v: Any) -> int:
    if v is None:
        return 0
    try:
        return operator.index(v)
    except TypeError:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise InputError(name, "must be an integer (got %r)" % (v,)) from None


def _ms(name: str, v: Any) -> int:
    """Milliseconds from an int, a float (truncated) or a timedelta."""
    if isinstance(v, timedelta):
        return v // timedelta(milliseconds=1)
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    return _int(name, v)


def _float(name: str, v: Any) -> float:
    try:
        return float(v)  # also "NaN", "Infinity", "-Infinity"
    except (TypeError, ValueError):
        raise InputError(name, 'must be a number, "NaN", "Infinity" or "-Infinity" (got %r)' % (v,)) from None


def _grpc(v: Any) -> int:
    if v is None:
        return 0
    if isinstance(v, str):
        code = _GRPC_BY_NAME.get(v.upper())
        if code is None:
            raise InputError("grpc_code", 'unknown gRPC status name "%s"' % v)
        return code
    value = getattr(v, "value", None)  # grpc.StatusCode: value is (14, "unavailable")
    if isinstance(value, tuple) and value:
        v = value[0]
    return _int("grpc_code", v)


def _hint(name: str, v: Any) -> str:
    """A Retry-After or pushback value: the raw string, or seconds (int,
    float, timedelta) for Retry-After and milliseconds for the pushback."""
    if v is None or v == "":
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, bytes):
        return v.decode("latin-1")
    if name == "retry_after":
        if isinstance(v, timedelta):
            v = v.total_seconds()
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return str(math.ceil(v)) if math.isfinite(v) else "garbage"
    elif isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    raise InputError(name, "must be a string or a number (got %r)" % (v,))


def _str(name: str, v: Any) -> str:
    if v is None or isinstance(v, str):
        return v or ""
    raise InputError(name, "must be a string (got %r)" % (v,))
