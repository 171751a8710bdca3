"""The policy ABI (wasm/ABI.md) from the host's side: the calls a Policy
makes into backstop.wasm, the failure fields encoded as the module takes
them (scalars, a batch of 64-byte records), and the packed words it
answers decoded. The host's clock and random draws (the module has
neither) are taken here. ``runtime.py`` beside it runs the module."""

from __future__ import annotations

import json
import math
import operator
import re
import struct
from collections import deque
from datetime import timedelta
from random import random as _draw
from time import time as _time
from typing import Any, Deque, Dict, List, Mapping, Optional, Tuple

from .._decision import Decision, Permit
from .._errors import BackstopError, InputError
from .runtime import Instance

# Packed decision (ABI.md, "The packed decision").
_REASONS = ("transient", "retry_after", "uncertain", "permanent_error", "max_attempts_reached",
            "max_elapsed_exceeded", "uncertain_limit_reached", "not_idempotent", "budget_exhausted",
            "circuit_open", "retry_after_too_long", "retried_downstream", "server_declined")
_CLASSES = ("retryable", "permanent", "uncertain")
_ACTIONS = ("retry", "dead_letter")
_CIRCUIT = ("closed", "open", "half_open")

# gRPC status names, indexed by code.
GRPC_CODES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
              "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
              "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
              "UNAUTHENTICATED")
_GRPC_BY_NAME = {n: i for i, n in enumerate(GRPC_CODES)}

# The flag bits (internal/abi/abi.go): an idempotency key, a pushback hint,
# and the two "a layer below said stop" inputs of retry at one layer.
_FLAG_KEY, _FLAG_PUSHBACK, _FLAG_DOWN, _FLAG_DECLINED = 1, 2, 4, 8
_MAX_STRING = 0xFFFF  # a method, error kind or hint, in UTF-8 bytes: a batch record's u16
_I64 = (-(1 << 63), (1 << 63) - 1)
_I32 = (-(1 << 31), (1 << 31) - 1)
_TWO63 = 2.0 ** 63


class _Unusual(Exception):
    """A failure the fast path leaves to _convert."""


# What the fast path raises for a value it does not take as it is.
_UNUSUAL = (AttributeError, struct.error, UnicodeEncodeError, OverflowError, TypeError, _Unusual)
_NO_FAILURE: Any = object()  # decide's failure argument, when only keywords are given

# The failure fields (the vector `input` names) and their "absent" values;
# None for now_ms and random means "the host's clock / a fresh draw".
_DEFAULTS: Dict[str, Any] = {
    "attempt": 0, "http_status": 0, "grpc_code": 0, "elapsed_ms": 0, "now_ms": None,
    "random": None, "prev_delay_ms": 0, "method": "", "error_kind": "", "retry_after": "",
    "grpc_retry_pushback_ms": "", "idempotency_key": "", "retried_downstream": False, "server_declined": False,
}
_NFIELDS = len(_DEFAULTS)
_fields = operator.itemgetter(*_DEFAULTS)

# decide_batch record (ABI.md, "decide_batch"): 64 bytes, little-endian.
_RECORD = struct.Struct("<qqqdqiiIIHHHH")
assert _RECORD.size == 64
_CHUNK = 4096  # records per decide_batch call: 256 KiB, the call cost vanishes
_BATCH_BYTES = 1 << 20  # and their strings: valid ones take up to 192 KiB each


_new = object.__new__
_heads: Dict[int, Dict[str, Any]] = {}  # the fields of each action/class/reason (bits 48..54)


def decision(w: int) -> Decision:
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


def permit(w: int) -> Permit:
    """The Permit of acquire's packed word."""
    return Permit(w >> 50 & 1 == 1, w & 0xFFFFFFFFFFFF, _CIRCUIT[w >> 48 & 3])


def circuit(w: int) -> str:
    """The breaker state circuit_state answers."""
    return _CIRCUIT[w]


def tokens(w: int) -> Optional[float]:
    """What budget_tokens answers: the tokens left, None without a budget."""
    if not w >> 48 & 1:
        return None
    return (w & 0xFFFFFFFFFFFF) / 1000


def now_ms() -> int:
    """The host's clock, in unix ms: a failure's now_ms when absent."""
    return int(_time() * 1000)


# -- calls into the module (the caller holds inst.lock unless said) -----------


def load(inst: Instance, data: bytes) -> int:
    """Loads policy ``data`` (JSON, YAML or a preset name) into inst and
    returns its handle; takes inst.lock, and frees collected policies'
    handles first."""
    with inst.lock:
        drain(inst)
        inst.ensure_buffer(len(data))[:len(data)] = data
        h = inst.policy_load(len(data))
        if h < 0:
            raise inst.error("policy_load", h)
    return h


def policy_flags(inst: Instance, handle: int) -> Tuple[bool, str]:
    """Whether the policy is stateful, and its on_open (``"defer"`` or
    ``"dead_letter"``); takes inst.lock."""
    with inst.lock:
        s = inst.policy_stateful(handle)
        o = inst.policy_on_open(handle) if s >= 0 else 0
    if s < 0:
        raise inst.error("policy_stateful", s)
    if o < 0:
        raise inst.error("policy_on_open", o)
    return s == 1, "dead_letter" if o == 1 else "defer"


def call(inst: Instance, handle: int, export: str, arg: int) -> int:
    """Calls the module's export with the policy's handle and one i64 and
    returns its result; a negative one raises its error."""
    r = getattr(inst, export)(handle, arg)
    if r < 0:
        raise inst.error(export, r)
    return r  # type: ignore[no-any-return]


def decide(inst: Instance, handle: int, d: Dict[str, Any], now0: Optional[int]) -> int:
    """Decides the merged failure d (``merge``) and returns the packed
    word. An absent now_ms is now0, or the host's clock without one; an
    absent random a fresh draw."""
    attempt, http, grpc, elapsed, now, rnd, prev, method, kind, ra, push, key, down, declined = _fields(d)
    if now is None:
        now = d["now_ms"] = int(_time() * 1000) if now0 is None else now0
    if rnd is None:
        rnd = d["random"] = _draw()
    try:
        # The fast path takes str strings and no bool (an int to the
        # struct); anything else goes to _convert.
        if (attempt.__class__ is bool or http.__class__ is bool or grpc.__class__ is bool or elapsed.__class__ is bool
                or now.__class__ is bool or rnd.__class__ is bool or prev.__class__ is bool
                or (key.__class__ is not str and key is not True and key is not False)
                or method.__class__ is not str or kind.__class__ is not str or ra.__class__ is not str
                or push.__class__ is not str or down.__class__ is not bool or declined.__class__ is not bool):
            raise _Unusual
        flags, ml, kl, hl = 1 if key else 0, 0, 0, 0  # bit 0: an idempotency key
        if down or declined:
            flags |= (_FLAG_DOWN if down else 0) | (_FLAG_DECLINED if declined else 0)
        if method or kind or ra or push:
            strs, ml, kl, hl, flags = _strings(method, kind, ra, push, flags)
            inst.ensure_buffer(len(strs))[:len(strs)] = strs
        # The struct in the call checks the types of the common case.
        w = inst.decide(handle, attempt, http, grpc, elapsed, now, rnd, prev, flags, ml, kl, hl)
    except _UNUSUAL:  # unusual types, ranges or strings: check and convert them
        attempt, http, grpc, elapsed, now, rnd, prev, flags, strs, ml, kl, hl = _convert(d)
        if strs:
            inst.ensure_buffer(len(strs))[:len(strs)] = strs
        w = inst.decide(handle, attempt, http, grpc, elapsed, now, rnd, prev, flags, ml, kl, hl)
    if w < 0:
        raise inst.error("decide", w)
    return w  # type: ignore[no-any-return]


def decide_many(inst: Instance, handle: int, fs: List[Mapping[str, Any]],
                now0: int) -> Tuple[List[Optional[Decision]], Optional[InputError]]:
    """Decides fs in decide_batch calls of up to _CHUNK records (a failure
    that cannot go in a record alone, with ``decide``): the decisions
    (None where invalid) and the error of the first invalid failure."""
    n = len(fs)
    out: List[Optional[Decision]] = [None] * n
    first: Optional[InputError] = None
    i = 0
    while i < n:
        hi = min(n, i + _CHUNK)
        k, buf = _pack_chunk(fs, i, hi, now0)
        if k:
            out_off = (len(buf) + 7) & ~7
            view = inst.ensure_buffer(out_off + 8 * k)
            view[:len(buf)] = buf
            r = inst.decide_batch(handle, 0, k, out_off)
            if r < 0:
                raise inst.error("decide_batch", r)
            words = view[out_off:out_off + 8 * k].cast("q").tolist()
            if first is None and min(words) < 0:  # the message is of the first bad record
                j = next(j for j, w in enumerate(words) if w < 0)
                first = _at(inst.error("decide_batch", words[j]), i + j)
            # Equal words share one (frozen) Decision.
            memo: Dict[int, Decision] = {}
            get, put = memo.get, memo.setdefault
            out[i:i + k] = [get(w) or put(w, decision(w)) if w >= 0 else None for w in words]
            i += k
        if i < hi:  # fs[i] cannot go in a record (invalid, or a long string): alone
            try:
                out[i] = decision(decide(inst, handle, merge(fs[i]), now0))
            except InputError as e:
                first = first or _at(e, i)
            i += 1
    return out, first


# Handles of collected policies not freed yet. The garbage collector runs
# finalizers wherever Python allocates, also in a thread that holds the
# instance's lock (between two calls of a decide_many, or in a WASI
# callback during a call), so a finalizer never waits for the lock: it
# queues the handle, and whoever holds the lock next frees it.
_collected: Deque[Tuple[Instance, int]] = deque()


def finalize(inst: Instance, handle: int) -> None:
    """The finalizer of a Policy: frees its handle now if the instance is
    free, else queues it for the next load or close."""
    _collected.append((inst, handle))
    if inst.lock.acquire(blocking=False):
        try:
            drain(inst)
        finally:
            inst.lock.release()


def drain(inst: Instance) -> None:
    """Frees the queued handles of inst; the caller holds inst.lock."""
    for _ in range(len(_collected)):
        try:
            owner, handle = _collected.popleft()
        except IndexError:
            return
        if owner is inst:
            free_locked(inst, handle)
        else:
            _collected.append((owner, handle))


def free_locked(inst: Instance, handle: int) -> None:
    try:
        inst.policy_free(handle)
    except BackstopError:
        pass  # the instance trapped: it holds nothing any more


# -- failure fields ------------------------------------------------------------


def merge(fields: Any) -> Dict[str, Any]:
    """The failure with every field, absent ones at their defaults."""
    try:
        d = {**_DEFAULTS, **fields}
    except TypeError:
        raise not_object(fields) from None
    if len(d) != _NFIELDS:
        # The least unknown name in code point order, as every host reports.
        name = min(well_formed(k if isinstance(k, str) else str(k)) for k in fields if k not in _DEFAULTS)
        raise InputError(name, "unknown field")
    return d


def not_object(v: Any) -> InputError:
    return InputError("failure", "must be an object (got %s)" % _describe(v))


def _at(e: BackstopError, index: int) -> InputError:
    if not isinstance(e, InputError):
        raise e
    return InputError(e.field, e.reason, index)


def _pack_chunk(fs: List[Mapping[str, Any]], lo: int, hi: int, now0: int) -> Tuple[int, bytearray]:
    """Packs fs[lo:hi] as decide_batch records followed by their strings.
    Stops before a failure that cannot go in a record (an invalid one, or
    one whose strings do not fit in _BATCH_BYTES any more), which the caller
    decides alone. Returns how many were packed, and the bytes."""
    soff = (hi - lo) * 64
    buf = bytearray(soff)
    off = 0
    # Locals, not globals, in the loop: this runs a million times a second.
    pack, defaults, nfields, fields, draw, strings = _RECORD.pack_into, _DEFAULTS, _NFIELDS, _fields, _draw, _strings
    for f in fs[lo:hi]:
        try:
            d = {**defaults, **f}
        except TypeError:  # not a mapping: decided alone, which raises
            break
        if len(d) != nfields:
            break
        attempt, http, grpc, elapsed, now, rnd, prev, method, kind, ra, push, key, down, declined = fields(d)
        if now is None:
            now = now0
        if rnd is None:
            rnd = draw()
        try:
            if (attempt.__class__ is bool or http.__class__ is bool or grpc.__class__ is bool or elapsed.__class__ is bool
                    or now.__class__ is bool or rnd.__class__ is bool or prev.__class__ is bool
                    or (key.__class__ is not str and key is not True and key is not False)
                    or method.__class__ is not str or kind.__class__ is not str or ra.__class__ is not str
                    or push.__class__ is not str or down.__class__ is not bool or declined.__class__ is not bool):
                raise _Unusual
            flags, strs, ml, kl, hl = 1 if key else 0, b"", 0, 0, 0  # bit 0: an idempotency key
            if down or declined:
                flags |= (_FLAG_DOWN if down else 0) | (_FLAG_DECLINED if declined else 0)
            if method or kind or ra or push:
                strs, ml, kl, hl, flags = strings(method, kind, ra, push, flags)
            pack(buf, off, attempt, elapsed, now, rnd, prev, http, grpc, flags, soff, ml, kl, hl, 0)
        except _UNUSUAL:  # unusual types, ranges or strings: check and convert them
            d["now_ms"], d["random"] = now, rnd
            try:
                attempt, http, grpc, elapsed, now, rnd, prev, flags, strs, ml, kl, hl = _convert(d)
            except InputError:
                break  # decided alone, which raises it
            pack(buf, off, attempt, elapsed, now, rnd, prev, http, grpc, flags, soff, ml, kl, hl, 0)
        if strs and off and soff + len(strs) > _BATCH_BYTES:
            break  # the chunk is full: this one goes alone (or starts the next)
        if strs:
            buf += strs
            soff += len(strs)
        off += 64
    return off >> 6, buf



def _strings(method: Any, kind: Any, ra: Any, push: Any, flags: int) -> Tuple[bytes, int, int, int, int]:
    """The strings of a failure as the ABI lays them out: method, error
    kind, then the hint (Retry-After wins over the gRPC pushback). The fast
    path: str values only, each at most _MAX_STRING bytes, and a pushback
    only alone (_convert checks both)."""
    m = method.encode() if method else b""
    k = kind.encode() if kind else b""
    if ra:
        if push:
            raise _Unusual
        h = ra.encode()
    elif push:
        h = push.encode()
        flags |= _FLAG_PUSHBACK
    else:
        h = b""
    if len(m) > _MAX_STRING or len(k) > _MAX_STRING or len(h) > _MAX_STRING:
        raise _Unusual
    return m + k + h, len(m), len(k), len(h), flags


def _convert(d: Dict[str, Any]) -> Tuple[Any, ...]:
    """Checks and converts every field of a merged failure dict to its ABI
    value, accepting the looser types the fast path does not. The fields
    are checked in the order every host checks them (testdata/vectors/
    README.md, "Field values"): the first invalid one raises InputError."""
    attempt = int64("attempt", d["attempt"], False)
    http = _int32("http_status", d["http_status"], "must be a 32-bit integer")
    grpc = _grpc(d["grpc_code"])
    kind = _text("error_kind", d["error_kind"])
    ra = _hint("retry_after", d["retry_after"])
    push = _hint("grpc_retry_pushback_ms", d["grpc_retry_pushback_ms"])
    method = _text("method", d["method"])
    flags = _key(d["idempotency_key"])
    elapsed = int64("elapsed_ms", d["elapsed_ms"], True)
    now = int64("now_ms", d["now_ms"], True)
    rnd = _random(d["random"])
    prev = int64("prev_delay_ms", d["prev_delay_ms"], True)
    flags |= _flag("retried_downstream", d["retried_downstream"], _FLAG_DOWN)
    flags |= _flag("server_declined", d["server_declined"], _FLAG_DECLINED)
    if ra:
        hint = ra
    else:
        hint = push
        if push:
            flags |= _FLAG_PUSHBACK
    return (attempt, http, grpc, elapsed, now, rnd, prev, flags, method + kind + hint,
            len(method), len(kind), len(hint))


def at(now_ms: Any) -> int:
    return int(_time() * 1000) if now_ms is None else int64("now_ms", now_ms, True)


def int64(name: str, v: Any, truncate: bool) -> int:
    """An int64 field: an integer (or an integral float); times (truncate
    set) drop fractions and also take a timedelta."""
    if v is None:
        return 0
    if v.__class__ is not bool:
        if isinstance(v, float):
            if not math.isfinite(v) or (not truncate and not v.is_integer()):
                raise InputError(name, "must be an integer (got %s)" % _es_format(v))
            if not -_TWO63 <= math.trunc(v) < _TWO63:
                raise InputError(name, "must fit in 64 bits (got %s)" % _es_format(v))
            return int(v)
        if truncate and isinstance(v, timedelta):
            v = v // timedelta(milliseconds=1)
        try:
            i = operator.index(v)
        except TypeError:
            pass
        else:
            if not _I64[0] <= i <= _I64[1]:
                raise InputError(name, "must fit in 64 bits (got %s)" % _decimal(i))
            return i
    raise InputError(name, "must be an integer (got %s)" % _describe(v))


def _int32(name: str, v: Any, reason: str) -> int:
    """An i32 field: an integer (or an integral float) that fits in 32 bits."""
    if v is None:
        return 0
    if v.__class__ is not bool:
        if isinstance(v, float):
            if v.is_integer() and _I32[0] <= v <= _I32[1]:
                return int(v)
        else:
            try:
                i = operator.index(v)
            except TypeError:
                pass
            else:
                if _I32[0] <= i <= _I32[1]:
                    return i
    raise InputError(name, "%s (got %s)" % (reason, _describe(v)))


def _grpc(v: Any) -> int:
    if isinstance(v, str):
        # Only ASCII letters fold ("unavailable"), as in every host.
        code = _GRPC_BY_NAME.get(v.upper()) if v.isascii() else None
        if code is None:
            raise InputError("grpc_code", "unknown gRPC status name %s" % _quote(v))
        return code
    value = getattr(v, "value", None)  # grpc.StatusCode: value is (14, "unavailable")
    if isinstance(value, tuple) and value:
        v = value[0]
    return _int32("grpc_code", v, "must be a 32-bit integer or a status name")


def _text(name: str, v: Any) -> bytes:
    """A string field as UTF-8 (a lone surrogate as U+FFFD, as every host
    writes it), or bytes as they are; at most _MAX_STRING bytes."""
    if v is None:
        return b""
    if isinstance(v, str):
        try:
            b = v.encode()
        except UnicodeEncodeError:
            b = well_formed(v).encode()
    elif isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
    else:
        raise InputError(name, "must be a string (got %s)" % _describe(v))
    if len(b) > _MAX_STRING:
        raise InputError(name, "must be at most %d bytes (got %d)" % (_MAX_STRING, len(b)))
    return b


def _hint(name: str, v: Any) -> bytes:
    """A Retry-After or pushback value: the raw string or bytes, or a number
    of seconds (retry_after, also a timedelta) or milliseconds (pushback),
    written as the integer it rounds up to ("NaN", "Infinity", "-Infinity"
    stay malformed, as the policy ignores them)."""
    if name == "retry_after" and isinstance(v, timedelta):
        v = v.total_seconds()
    if v.__class__ is not bool:
        if isinstance(v, float):
            return _text(name, _es_format(v) if not math.isfinite(v) else str(math.ceil(v)))
        try:
            return _text(name, _decimal(operator.index(v)))
        except TypeError:
            pass
    if v is None or isinstance(v, (str, bytes, bytearray, memoryview)):
        return _text(name, v)
    raise InputError(name, "must be a string or a number (got %s)" % _describe(v))


def _key(v: Any) -> int:
    """The idempotency-key flag: a string or bytes (present when not
    empty), or a boolean."""
    if v is None or v is False:
        return 0
    if v is True:
        return _FLAG_KEY
    if isinstance(v, (str, bytes, bytearray, memoryview)):
        return _FLAG_KEY if len(v) else 0
    raise InputError("idempotency_key", "must be a string or a boolean (got %s)" % _describe(v))


def _flag(name: str, v: Any, bit: int) -> int:
    """retried_downstream, server_declined: True (the bit), False or absent;
    nothing else, not 1 nor "true", as in every host."""
    if v is None or v is False:
        return 0
    if v is True:
        return bit
    raise InputError(name, "must be a boolean (got %s)" % _describe(v))


def _random(v: Any) -> float:
    """The jitter draw: a number (the module clamps it into [0, 1), NaN
    too), or "NaN", "Infinity", "-Infinity"."""
    if v is None:
        return _draw()
    if v.__class__ is not bool:
        if isinstance(v, float):
            return v
        if isinstance(v, str):
            special = _SPECIAL_FLOATS.get(v)
            if special is not None:
                return special
        else:
            try:
                i = operator.index(v)
            except TypeError:
                pass
            else:
                try:
                    return float(i)
                except OverflowError:  # past the float range, as JSON readers read it
                    return math.inf if i > 0 else -math.inf
    raise InputError("random", 'must be a number, "NaN", "Infinity" or "-Infinity" (got %s)' % _describe(v))


_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "+Infinity": math.inf, "-Infinity": -math.inf}


def _describe(v: Any) -> str:
    """How a message shows a value of the wrong type or range, as every host
    does: true, false, null, a number as JavaScript prints it, an integer in
    full, or "a string", "bytes", "an array", "an object"."""
    if v is None:
        return "null"
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, float):
        return _es_format(v)
    if isinstance(v, int):
        return _decimal(v)
    if isinstance(v, str):
        return "a string"
    if isinstance(v, (bytes, bytearray, memoryview)):
        return "bytes"
    if isinstance(v, (list, tuple)):
        return "an array"
    if isinstance(v, Mapping):
        return "an object"
    return "a " + type(v).__name__


def _decimal(i: int) -> str:
    """str(i), also past sys.get_int_max_str_digits()."""
    try:
        return str(i)
    except ValueError:
        q, r = divmod(abs(i), _10_4000)
        return ("-" if i < 0 else "") + _decimal(q) + str(r).zfill(4000)


_10_4000 = 10 ** 4000


def _es_format(f: float) -> str:
    """f as JavaScript's String(f) writes it (ECMAScript Number::toString):
    the shortest digits that round-trip, in plain notation from 1e-7 to
    1e21, else with an exponent ("1e+21", "1.5e-7")."""
    if f != f:
        return "NaN"
    if f in (math.inf, -math.inf):
        return "Infinity" if f > 0 else "-Infinity"
    if f == 0:
        return "0"
    if f < 0:
        return "-" + _es_format(-f)
    r = repr(f)  # the shortest round-trip digits: "123.45", "1e-07", "1.5e+300"
    mant, _, exp = r.partition("e")
    whole, _, frac = mant.partition(".")
    digits = (whole + frac).lstrip("0")
    n = len(whole) + (int(exp) if exp else 0) - (len(whole + frac) - len((whole + frac).lstrip("0")))
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * -n + digits
    e = n - 1
    return (digits if k == 1 else digits[0] + "." + digits[1:]) + "e" + ("+" if e >= 0 else "-") + str(abs(e))


def well_formed(s: str) -> str:
    """s with each lone surrogate as U+FFFD, as JSON readers and
    TextEncoder write them."""
    return _SURROGATE.sub("\ufffd", s)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _quote(s: str) -> str:
    """s as a JSON string, as every host's messages quote it."""
    return json.dumps(well_formed(s), ensure_ascii=False).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")

