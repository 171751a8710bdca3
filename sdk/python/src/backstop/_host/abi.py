"""The policy ABI (wasm/ABI.md) from the host's side: the calls a Policy
makes into backstop.wasm, the failure encoded as the module takes it (the
generated fast path of ``_contract``: scalars, a batch of 64-byte
records; anything else as a failure value, which the core checks and
describes) and the words it answers decoded. The host's clock and random
draws (the module has neither) are taken here. ``runtime.py`` beside it
runs the module."""

from __future__ import annotations

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
from .runtime import Instance, shared

_CHUNK = 4096  # records per decide_batch call: 256 KiB, the call cost vanishes
_BATCH_BYTES = 1 << 20  # and their strings: valid ones take up to 192 KiB each


# What the fast path (_contract's generated encoding and the struct of the
# call) raises for a value it does not take as it is.
_UNUSUAL = (AttributeError, struct.error, UnicodeEncodeError, OverflowError, TypeError)

_NFIELDS = len(C.DEFAULTS)


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


def int64(name: str, v: Any, truncate: bool, inst: Optional[Instance] = None) -> int:
    """An i64 argument of a call, not a failure's field: an integer or a
    float that is one, in the int64 range, None as 0; truncate set, also
    any finite float (the fraction dropped) or a timedelta (in ms). Any
    other value goes to the core as a failure's now_ms (truncate set) or
    attempt, which it reads by the same rules: its message, under name.
    inst is the instance whose lock the caller holds; else the shared one
    is taken."""
    if truncate and isinstance(v, timedelta):
        v = v // _MS
    if v is None:
        return 0
    i = None
    if isinstance(v, float):
        if math.isfinite(v) and (truncate or v.is_integer()):
            i = math.trunc(v)
    elif v.__class__ is not bool:
        try:
            i = operator.index(v)
        except TypeError:
            pass
    if i is not None and -_I64 <= i < _I64:
        return i
    probe = {"now_ms" if truncate else "attempt": v}
    if inst is None:
        inst = shared()
        with inst.lock:
            e = inst.error("decide_value", inst.decide_value(0, put(inst, value(probe))))
    else:
        e = inst.error("decide_value", inst.decide_value(0, put(inst, value(probe))))
    if not isinstance(e, InputError):
        raise e
    raise InputError(name, e.reason)


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


def decide_value(inst: Instance, handle: int, failure: Any) -> Decision:
    """Decides failure (merged, or as given) in the core, which reads it as
    a value (``value``): the slow path of a failure the fast path does not
    take (a value of an unusual type, or out of range, an unknown field,
    not a mapping). The core's InputError says what is wrong with it."""
    w = inst.decide_value(handle, put(inst, value(failure)))
    if w < 0:
        raise inst.error("decide_value", w)
    return C.decision(w)


# decide(inst, handle, d, now0) decides the merged failure d (every field
# of C.DEFAULTS, no other) and returns its Decision. An absent now_ms is
# now0, or the host's clock without one; an absent random a fresh draw.
# Its fast path is the generated code's, inline; the rest goes to
# decide_value.
decide: Callable[[Instance, int, Dict[str, Any], Optional[int]], Decision] = C.decider(_time, _draw, decide_value, _UNUSUAL)


def outcome(inst: Instance, handle: int, event: int, failure: Any, now: Any, deliveries: Any,
            limit: Any) -> C.Outcome:
    """The core's outcome of a job's event, for the failure (a mapping of
    fields, as for ``decide``) at ``now`` (None: the failure's now_ms, else
    the host's clock); an invalid failure raises InputError with the
    outcome, one the fast path does not take goes to outcome_value."""
    try:
        d = {**C.DEFAULTS, **failure}
    except TypeError:
        d = None
    if d is None or len(d) != _NFIELDS:
        # Not a mapping, or an unknown field: the core says which, before the
        # counts are checked (it is invalid whatever they are).
        w = inst.outcome_value(handle, event, put(inst, value(failure)), 0, 0)
    else:
        tail = (int64("deliveries", deliveries, False, inst), int64("max_deliveries", limit, False, inst))
        if now is not None:
            d["now_ms"] = now
        if d["now_ms"] is None:
            d["now_ms"] = now_ms()
        if d["random"] is None:
            d["random"] = _draw()
        try:
            args, strs = C.decide_args(d)
            if strs:
                inst.ensure_buffer(len(strs))[:len(strs)] = strs
            w = inst.outcome(handle, event, *args, *tail)  # its struct checks the ranges
        except _UNUSUAL:
            w = inst.outcome_value(handle, event, put(inst, value(d)), *tail)
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
    that cannot go in a record, alone): the decisions (None where invalid)
    and the error of the first invalid failure."""
    n = len(fs)
    out: List[Optional[Decision]] = [None] * n
    first: Optional[InputError] = None
    i = 0
    while i < n:
        hi = min(n, i + _CHUNK)
        buf = bytearray((hi - i) * C.RECORD_SIZE)
        k = C.pack_records(buf, fs[i:hi], now0, C.DEFAULTS, _draw, _UNUSUAL, _BATCH_BYTES)
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
            get, put_, decision = memo.get, memo.setdefault, C.decision
            out[i:i + k] = [get(w) or put_(w, decision(w)) if w >= 0 else None for w in words]
            i += k
        if i < hi:  # fs[i] cannot go in a record (see pack_records): alone
            try:
                try:
                    d = {**C.DEFAULTS, **fs[i]}
                except TypeError:
                    d = None
                if d is not None and len(d) == _NFIELDS:
                    out[i] = decide(inst, handle, d, now0)
                else:
                    out[i] = decide_value(inst, handle, fs[i])
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


# -- the failure as a value (wasm/ABI.md, "decide_value") ------------------------


def put(inst: Instance, b: bytes) -> int:
    """Writes b at the start of the buffer and returns its length."""
    inst.ensure_buffer(len(b))[:len(b)] = b
    return len(b)


def value(failure: Any) -> bytearray:
    """failure in the value encoding: an object of its fields when it is a
    mapping, each of Python's own values mapped first to what it means for
    its field (``_meaning``); else the value itself, which the core refuses
    (a failure must be an object). A field at its default (None, or
    C.DEFAULTS' own object: merged) is absent to the core too: left out."""
    out = bytearray()
    try:
        fields = {**failure}
    except TypeError:
        _encode(out, failure)
        return out
    entries, get = {}, C.DEFAULTS.get
    for k, v in fields.items():
        if v is get(k, _UNKNOWN) or v is None and k in C.DEFAULTS:
            continue
        key = _KEYS.get(k)
        if key is None:  # an unknown name, as every host writes it (two may write the same)
            b = well_formed(k if isinstance(k, str) else str(k)).encode()
            key = _U32(len(b)) + b
        entries[key] = _meaning(k, v)
    out += _HEAD(C.VALUE_OBJECT, len(entries))
    for key, v in entries.items():
        out += key
        _encode(out, v)
    return out


def _encode(out: bytearray, v: Any) -> None:
    """Appends v's tag and payload; a nested mapping only as "an object",
    a list or tuple as "an array", any other type by its name."""
    if v is None:
        out.append(C.VALUE_NULL)
        return
    if v is True or v is False:
        out.append(C.VALUE_TRUE if v else C.VALUE_FALSE)
        return
    if isinstance(v, float):
        out += _FLOAT(C.VALUE_FLOAT, v)
        return
    if isinstance(v, int):
        tag, b = C.VALUE_INT, _decimal(v).encode()
    elif isinstance(v, str):
        tag, b = C.VALUE_STRING, well_formed(v).encode()
    elif isinstance(v, (bytes, bytearray, memoryview)):
        tag, b = C.VALUE_BYTES, bytes(v)
    elif isinstance(v, (list, tuple)):
        out.append(C.VALUE_ARRAY)
        return
    elif isinstance(v, Mapping):
        out += _HEAD(C.VALUE_OBJECT, 0)
        return
    else:
        tag, b = C.VALUE_OTHER, ("a " + type(v).__name__).encode()
    out += _HEAD(tag, len(b))
    out += b


def _meaning(name: Any, v: Any) -> Any:
    """What a Python value of its own means for the field name, as the host
    takes it: a timedelta in ms (a time field) or seconds (retry_after), a
    grpc.StatusCode its number, an integer-like object (IntEnum, numpy)
    its int for a number; any other value as it is."""
    f = _FIELDS.get(name)
    if f is None or v is None or isinstance(v, (int, float, str, bytes, bytearray, memoryview)):
        return v
    if isinstance(v, timedelta):
        if f.type == "int64" and f.ms:
            return v // _MS
        return v.total_seconds() if f.type == "hint" and not f.ms else v
    if f.type == "grpc_code":
        code = getattr(v, "value", None)  # grpc.StatusCode: value is (14, "unavailable")
        if isinstance(code, tuple) and code:
            v = code[0]
    if f.type in _NUMBERS:
        try:
            return operator.index(v)
        except TypeError:
            pass
    return v


_FIELDS = {f.name: f for f in C.FIELDS}
_KEYS = {f.name: struct.pack("<I", len(f.name)) + f.name.encode() for f in C.FIELDS}  # each field's key, encoded
_UNKNOWN = object()  # a name's default when it is no field
_NUMBERS = frozenset(("int64", "int32", "grpc_code", "hint", "random"))
_MS = timedelta(milliseconds=1)
_I64 = 1 << 63
_HEAD = struct.Struct("<BI").pack  # a tag and a u32
_U32 = struct.Struct("<I").pack
_FLOAT = struct.Struct("<Bd").pack


def _at(e: BackstopError, index: int) -> InputError:
    if not isinstance(e, InputError):
        raise e
    return InputError(e.field, e.reason, index)


def _decimal(i: int) -> str:
    """i in decimal, also past sys.get_int_max_str_digits() (and an int
    subclass's digits, not its str)."""
    try:
        return int.__repr__(i)
    except ValueError:
        q, r = divmod(abs(i), _10_4000)
        return ("-" if i < 0 else "") + _decimal(q) + str(r).zfill(4000)


_10_4000 = 10 ** 4000


def well_formed(s: str) -> str:
    """s with each lone surrogate as U+FFFD, as JSON readers and
    TextEncoder write them."""
    return _SURROGATE.sub("\ufffd", s)


_SURROGATE = re.compile("[\ud800-\udfff]")
