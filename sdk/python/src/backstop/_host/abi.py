"""The policy ABI (wasm/ABI.md) from the host's side: the calls a Policy
makes into backstop.wasm, the failure encoded as the module takes it
(scalars, a batch of 64-byte records) and the words it answers decoded.
What the fields are, their types and where each goes is the generated
``_contract``: this file has one converter per type, never one per field.
The host's clock and random draws (the module has neither) are taken
here. ``runtime.py`` beside it runs the module."""

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
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Tuple

from .._errors import BackstopError, InputError
from . import _contract as C
from ._contract import Decision
from .runtime import Instance

_GRPC_BY_NAME = {n: i for i, n in enumerate(C.GRPC_CODE_NAMES)}
_CHUNK = 4096  # records per decide_batch call: 256 KiB, the call cost vanishes
_BATCH_BYTES = 1 << 20  # and their strings: valid ones take up to 192 KiB each


# What the fast path (_contract's generated encoding and the struct of the
# call) raises for a value it does not take as it is.
_UNUSUAL = (AttributeError, struct.error, UnicodeEncodeError, OverflowError, TypeError, C.Unusual)

_NFIELDS = len(C.DEFAULTS)


# -- one converter per type ------------------------------------------------------


def _wrong(name: str, kind: str, v: Any) -> InputError:
    """A value the field's type does not take, in the schema's words (C.EXPECTS)."""
    return InputError(name, "must be %s (got %s)" % (C.EXPECTS[kind], _describe(v)))


def int64(name: str, v: Any, truncate: bool) -> int:
    """An int64 field: an integer (or an integral float); times (truncate
    set) drop fractions and also take a timedelta."""
    if truncate and isinstance(v, timedelta):
        v = v // timedelta(milliseconds=1)
    return _integer(name, v, 63, truncate, "int64")


def _integer(name: str, v: Any, bits: int, truncate: bool, kind: str) -> int:
    """An integer of type kind that fits in bits + 1 (signed): an int, or a float
    that is one (or, truncate set, any finite one); an int64 says when it
    does not fit, an int32 only what it must be."""
    if v is None:
        return 0
    if v.__class__ is not bool:
        if isinstance(v, float):
            i, shown = (math.trunc(v) if math.isfinite(v) and (truncate or v.is_integer()) else None), _es_format(v)
        else:
            try:
                i, shown = operator.index(v), None
            except TypeError:
                i = None
        if i is not None:
            if -(1 << bits) <= i < 1 << bits:
                return i
            if bits == 63:
                raise InputError(name, "must fit in 64 bits (got %s)" % (shown or _decimal(i)))
    raise _wrong(name, kind, v)


def _grpc(name: str, v: Any) -> int:
    """A gRPC code: a number, a status name or a grpc.StatusCode."""
    if isinstance(v, str):
        # Only ASCII letters fold ("unavailable"), as in every host.
        code = _GRPC_BY_NAME.get(v.upper()) if v.isascii() else None
        if code is None:
            raise InputError(name, "unknown gRPC status name %s" % _quote(v))
        return code
    value = getattr(v, "value", None)  # grpc.StatusCode: value is (14, "unavailable")
    if isinstance(value, tuple) and value:
        v = value[0]
    return _integer(name, v, 31, False, "grpc_code")


def _text(name: str, v: Any) -> bytes:
    """A string field as UTF-8 (a lone surrogate as U+FFFD, as every host
    writes it), or bytes as they are; at most MAX_STRING bytes."""
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
        raise _wrong(name, "string", v)
    if len(b) > C.MAX_STRING:
        raise InputError(name, "must be at most %d bytes (got %d)" % (C.MAX_STRING, len(b)))
    return b


def _hint(f: C.Field, v: Any) -> bytes:
    """A Retry-After or pushback value: the raw string or bytes, or a number
    of seconds (also a timedelta) or, for a field in ms, milliseconds,
    written as the integer it rounds up to ("NaN", "Infinity", "-Infinity"
    stay malformed, as the policy ignores them)."""
    if not f.ms and isinstance(v, timedelta):
        v = v.total_seconds()
    if v.__class__ is not bool:
        if isinstance(v, float):
            return _text(f.name, _es_format(v) if not math.isfinite(v) else str(math.ceil(v)))
        try:
            return _text(f.name, _decimal(operator.index(v)))
        except TypeError:
            pass
    if v is None or isinstance(v, (str, bytes, bytearray, memoryview)):
        return _text(f.name, v)
    raise _wrong(f.name, "hint", v)


def _flag(name: str, v: Any, key: bool) -> bool:
    """A flag's field: True, False or absent; an idempotency key (key set)
    also a string or bytes, present when not empty; nothing else, not 1 nor
    "true", as in every host."""
    if v is None or v is True or v is False:
        return bool(v)
    if key and isinstance(v, (str, bytes, bytearray, memoryview)):
        return len(v) > 0
    raise _wrong(name, "key" if key else "bool", v)


def _random(name: str, v: Any) -> float:
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
    raise _wrong(name, "random", v)


_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "+Infinity": math.inf, "-Infinity": -math.inf}
_CONVERT: Dict[str, C.Convert] = {
    "int64": lambda f, v: int64(f.name, v, f.ms), "int32": lambda f, v: _integer(f.name, v, 31, False, "int32"),
    "grpc_code": lambda f, v: _grpc(f.name, v), "string": lambda f, v: _text(f.name, v), "hint": _hint,
    "key": lambda f, v: _flag(f.name, v, True), "random": lambda f, v: _random(f.name, v),
    "bool": lambda f, v: _flag(f.name, v, False)}


# -- calls into the module (the caller holds inst.lock unless said) -----------


def now_ms() -> int:
    """The host's clock, in unix ms: a failure's now_ms when absent."""
    return int(_time() * 1000)


def at(now: Any) -> int:
    """A call's now_ms: the host's clock when None."""
    return now_ms() if now is None else int64("now_ms", now, True)


def ms(name: str, v: Any) -> int:
    """A call's duration in ms, fractions dropped."""
    return int64(name, v, True)


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
    return h  # type: ignore[no-any-return]


def call(inst: Instance, handle: int, export: str, *args: Any) -> int:
    """Calls the module's export with the policy's handle and args, and
    returns its result; a negative one raises its error."""
    r = getattr(inst, export)(handle, *args)
    if r < 0:
        raise inst.error(export, r)
    return r  # type: ignore[no-any-return]


def _slow_args(inst: Instance, d: Dict[str, Any]) -> Tuple[Any, ...]:
    """decide's (and outcome's) failure arguments for the merged failure d
    (now_ms and random set) the fast path did not take: checked and
    converted (C.converted), its strings written into the buffer."""
    args, strs = C.converted(d, _CONVERT)
    if strs:
        inst.ensure_buffer(len(strs))[:len(strs)] = strs
    return args


def _decide_slow(inst: Instance, handle: int, d: Dict[str, Any]) -> int:
    return inst.decide(handle, *_slow_args(inst, d))  # type: ignore[no-any-return]


# decide(inst, handle, d, now0) decides the merged failure d (``merge``)
# and returns its Decision. An absent now_ms is now0, or the host's clock
# without one; an absent random a fresh draw. Its fast path is the
# generated code's, inline; the rest goes to _decide_slow.
decide: Callable[[Instance, int, Dict[str, Any], Optional[int]], Decision] = C.decider(_time, _draw, _decide_slow, _UNUSUAL)


def outcome(inst: Instance, handle: int, event: int, d: Dict[str, Any], deliveries: Any, limit: Any) -> C.Outcome:
    """The core's outcome of a job's event (the merged failure d, as for
    ``decide``); an invalid failure raises InputError with the outcome."""
    tail = (int64("deliveries", deliveries, False), int64("max_deliveries", limit, False))
    if d["now_ms"] is None:
        d["now_ms"] = now_ms()
    if d["random"] is None:
        d["random"] = _draw()
    try:
        args, strs = C.decide_args(d)
        if strs:
            inst.ensure_buffer(len(strs))[:len(strs)] = strs
        w = inst.outcome(handle, event, *args, *tail)  # its struct checks the ranges
    except _UNUSUAL:  # unusual types, ranges or strings: check and convert them
        w = inst.outcome(handle, event, *_slow_args(inst, d), *tail)
    if w < 0:
        raise inst.error("outcome", w)
    o = C.outcome(w)
    if o.invalid:
        e = InputError._from_module(inst.message())
        e.outcome = o
        raise e
    return o


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
            view = inst.ensure_buffer(out_off + C.RESULT_SIZE * k)
            view[:len(buf)] = buf
            call(inst, handle, "decide_batch", 0, k, out_off)
            words = view[out_off:out_off + C.RESULT_SIZE * k].cast("q").tolist()
            if first is None and min(words) < 0:  # the message is of the first bad record
                j = next(j for j, w in enumerate(words) if w < 0)
                first = _at(inst.error("decide_batch", words[j]), i + j)
            # Equal words share one (frozen) Decision.
            memo: Dict[int, Decision] = {}
            get, put, decision = memo.get, memo.setdefault, C.decision
            out[i:i + k] = [get(w) or put(w, decision(w)) if w >= 0 else None for w in words]
            i += k
        if i < hi:  # fs[i] cannot go in a record (invalid, or a long string): alone
            try:
                out[i] = decide(inst, handle, merge(fs[i]), now0)
            except InputError as e:
                first = first or _at(e, i)
            i += 1
    return out, first


def _pack_chunk(fs: List[Mapping[str, Any]], lo: int, hi: int, now0: int) -> Tuple[int, bytearray]:
    """Packs fs[lo:hi] as decide_batch records followed by their strings.
    Stops before a failure that cannot go in a record (an invalid one, or
    one whose strings do not fit in _BATCH_BYTES any more), which the caller
    decides alone. Returns how many were packed, and the bytes."""
    buf = bytearray((hi - lo) * C.RECORD_SIZE)
    return C.pack_records(buf, fs[lo:hi], now0, C.DEFAULTS, _draw, _pack_slow, _UNUSUAL, _BATCH_BYTES), buf


def _pack_slow(buf: bytearray, off: int, soff: int, d: Dict[str, Any]) -> Optional[bytes]:
    """pack_records' slow path: the merged failure d (now_ms and random
    set) the fast path did not take, checked and converted, packed at off
    with its strings at soff (C.pack_converted); None when d is invalid
    (decided alone, which raises)."""
    try:
        return C.pack_converted(buf, off, soff, d, _CONVERT)
    except InputError:
        return None


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


# -- the failure as given, and messages as every host writes them ----------------


def merge(fields: Any) -> Dict[str, Any]:
    """The failure with every field, absent ones at their defaults."""
    try:
        d = {**C.DEFAULTS, **fields}
    except TypeError:
        raise not_object(fields) from None
    if len(d) != _NFIELDS:
        # The least unknown name in code point order, as every host reports.
        name = min(well_formed(k if isinstance(k, str) else str(k)) for k in fields if k not in C.DEFAULTS)
        raise InputError(name, "unknown field")
    return d


def not_object(v: Any) -> InputError:
    return InputError("failure", "must be an object (got %s)" % _describe(v))


def _at(e: BackstopError, index: int) -> InputError:
    if not isinstance(e, InputError):
        raise e
    return InputError(e.field, e.reason, index)


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
    the shortest digits that round-trip (Python's repr), in plain notation
    from 1e-7 to 1e21, else with an exponent ("1e+21", "1.5e-7")."""
    if not math.isfinite(f):
        return "NaN" if f != f else "Infinity" if f > 0 else "-Infinity"
    sign, (mant, _, exp) = "-" if f < 0 else "", repr(abs(f)).partition("e")
    if not exp:
        return sign + (mant[:-2] if mant.endswith(".0") else mant)
    e, digits = int(exp), mant.replace(".", "")
    if 0 <= e < 21:
        return sign + digits + "0" * (e + 1 - len(digits))
    if -7 < e < 0:
        return sign + "0." + "0" * (-e - 1) + digits
    return sign + mant + ("e+" if e > 0 else "e-") + str(abs(e))


def well_formed(s: str) -> str:
    """s with each lone surrogate as U+FFFD, as JSON readers and
    TextEncoder write them."""
    return _SURROGATE.sub("\ufffd", s)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _quote(s: str) -> str:
    """s as a JSON string, as every host's messages quote it."""
    return json.dumps(well_formed(s), ensure_ascii=False).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
