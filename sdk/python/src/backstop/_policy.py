"""Policy, Decision and load_policy: the policy API over backstop.wasm."""

from __future__ import annotations

import json
import math
import operator
import os
import re
import struct
import weakref
from collections import deque
from datetime import timedelta
from random import random as _draw
from time import time as _time
from typing import (Any, Callable, Deque, Dict, Iterable, List, Mapping, MutableMapping, Optional, Tuple,
                    TypedDict, TypeVar, Union, overload)

from ._decision import Decision, Permit
from ._errors import BackstopError, InputError
from ._retry import BeforeSleep, Classify, retrying
from ._runtime import Instance, shared

F = TypeVar("F", bound=Callable[..., Any])

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


class Failure(TypedDict, total=False):
    """The fields of a failure, named as in the shared vectors. All are
    optional; absent (or None) means zero or empty. Any other name is an
    InputError. A string field also takes bytes, passed as they are."""

    attempt: int  # 1-based number of the execution that just failed
    http_status: Optional[int]
    grpc_code: Union[int, str, Any, None]  # 14, "UNAVAILABLE" or grpc.StatusCode.UNAVAILABLE
    error_kind: Union[str, bytes, None]  # "timeout", "connection_refused", ...
    retry_after: Union[str, bytes, int, float, timedelta, None]  # raw header, or seconds (rounded up)
    grpc_retry_pushback_ms: Union[str, bytes, int, float, None]  # raw value, or milliseconds (rounded up)
    method: Union[str, bytes, None]
    idempotency_key: Union[str, bytes, bool, None]  # the key, or True when there is one
    elapsed_ms: Union[int, float, timedelta]  # fractions are dropped
    now_ms: Union[int, float, None]  # default: the host's clock
    random: Union[float, str, None]  # default: random.random(); also "NaN", "Infinity", "-Infinity"
    prev_delay_ms: Union[int, float, timedelta]
    # A layer below already retried and gave up (an inner RetryError, a
    # Backstop-No-Retry response): given up as retried_downstream unless the
    # policy says retried_downstream: retry (docs/layers.md). Only a bool.
    retried_downstream: Optional[bool]
    server_declined: Optional[bool]  # the server asked not to be retried (X-Envoy-Overloaded)


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
            o = inst.policy_on_open(handle) if s >= 0 else 0
        if s < 0:
            raise inst.error("policy_stateful", s)
        if o < 0:
            raise inst.error("policy_on_open", o)
        self._stateful = s == 1
        self._on_open = "dead_letter" if o == 1 else "defer"  # it never changes: read once
        self._finalizer = weakref.finalize(self, _free, inst, handle)

    @property
    def stateful(self) -> bool:
        """True when the policy has a retry budget or a circuit breaker."""
        return self._stateful

    @property
    def on_open(self) -> str:
        """What a queue does with a job refused by an open breaker or an
        empty budget: ``"defer"`` (the default: back to the delayed set
        without spending an attempt) or ``"dead_letter"``."""
        return self._on_open

    def acquire(self, now_ms: Optional[int] = None) -> Permit:
        """Asks permission for one call at now_ms (default: the host's
        clock), before it is made.

        While the breaker is open every call is refused. Half-open admits at
        most ``circuit_breaker.half_open_max_calls`` trial calls (default 1)
        until they report back: a success with ``record_success``, a failure
        with ``decide`` (it reopens the breaker); a trial that has not
        reported back within ``open_for`` counts as failed. A policy without
        a breaker always allows. The retry budget is not consulted: it limits
        retries, through ``decide``.

        Raises InputError for a now_ms that is not an integer, negative, or
        0 on a stateful policy (``now_ms: must be set ...``); no state
        changes then. StateLostError when the instance holding the breaker
        trapped.
        """
        w = self._at("acquire", now_ms)
        return Permit(w >> 50 & 1 == 1, w & 0xFFFFFFFFFFFF, _CIRCUIT[w >> 48 & 3])

    def decide(self, failure: Mapping[str, Any] = _NO_FAILURE, /, **fields: Any) -> Decision:  # type: ignore[assignment]
        """Decides a failure given as a dict, as keyword fields, or both
        (the keywords win). The field names are those of ``Failure``; a
        ``None`` value is an absent field.

        ``now_ms`` defaults to the host's clock and ``random`` to
        ``random.random()``: the module itself has neither.

        Raises ``InputError`` for an invalid field (the message names it:
        ``attempt: must be >= 1 (got 0)``), for an unknown field name
        (``http_stauts: unknown field``) and for a failure that is not a
        mapping: the first problem in the order of the shared vectors'
        fields, after unknown names, with the message every backstop host
        gives (testdata/vectors/inputs.json).
        """
        try:
            if failure is not _NO_FAILURE:
                fields = {**failure, **fields} if fields else failure  # type: ignore[assignment]
            d = {**_DEFAULTS, **fields}
        except TypeError:  # not a mapping
            raise _not_object(failure) from None
        if len(d) != _NFIELDS:
            _merge(fields)  # raises for the unknown field
        with self._inst.lock:
            return _unpack(self._decide_locked(d, None))

    def _decide_locked(self, d: Dict[str, Any], now0: Optional[int]) -> int:
        """Decides the merged failure d; the caller holds the lock."""
        attempt, http, grpc, elapsed, now, rnd, prev, method, kind, ra, push, key, down, declined = _fields(d)
        if now is None:
            now = d["now_ms"] = int(_time() * 1000) if now0 is None else now0
        if rnd is None:
            rnd = d["random"] = _draw()
        inst = self._inst
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
            w = inst.decide(self._h, attempt, http, grpc, elapsed, now, rnd, prev, flags, ml, kl, hl)
        except _UNUSUAL:  # unusual types, ranges or strings: check and convert them
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
        calls. An invalid failure (a field, or an entry that is not a
        mapping) does not stop the batch, as in every backstop host: the
        others are decided (and counted by a stateful policy, in order),
        then ``InputError`` is raised for the first invalid one, with its
        ``index`` and the ``decisions`` (``None`` where invalid).
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
        self._at("record_success", now_ms)

    def budget_tokens(self, now_ms: Optional[int] = None) -> Optional[float]:
        """What is left of the retry budget at now_ms (default: the host's
        clock), read without changing it: a token bucket's tokens (retries
        pass while more than half of ``max_tokens`` remain), or the retries a
        window budget still allows. None when the policy has no budget.

        Raises InputError for a now_ms that is not an integer or negative."""
        if not self._stateful:
            return None
        w = self._at("budget_tokens", now_ms)
        if not w >> 48 & 1:
            return None
        return (w & 0xFFFFFFFFFFFF) / 1000

    def circuit_state(self, now_ms: Optional[int] = None) -> str:
        """The circuit breaker's state at now_ms (default: the host's clock):
        ``"closed"`` (also when the policy has no breaker), ``"open"`` or
        ``"half_open"``."""
        if not self._stateful:
            return "closed"
        return _CIRCUIT[self._at("circuit_state", now_ms)]

    def attempt_timeout(self, elapsed_ms: Union[int, float, timedelta] = 0) -> int:
        """How long the attempt starting ``elapsed_ms`` after the first one
        started may run, in ms; 0 for no limit. It is the policy's
        ``attempt_timeout``, bounded by what is left of ``max_elapsed``
        (when ``stop_when`` is ``"any"``), and at least 1 ms.
        ``Policy.retry`` asks it before each attempt.

        Raises InputError for an elapsed_ms that is not an integer (a
        timedelta or a float: fractions are dropped) or is negative
        (``elapsed_ms: must be >= 0 (got -5)``)."""
        return self._call("attempt_timeout", _int64("elapsed_ms", elapsed_ms, True))

    def _at(self, export: str, now_ms: Optional[int]) -> int:
        """Calls the module's export (acquire, record_success,
        budget_tokens, circuit_state) on this policy at now_ms (default:
        the host's clock) and returns its result (see _call)."""
        return self._call(export, _now(now_ms))

    def _call(self, export: str, arg: int) -> int:
        """Calls the module's export with this policy's handle and one i64
        and returns its result; a negative one raises its error (read
        under the lock, as every call into the module)."""
        inst = self._inst
        with inst.lock:
            r = getattr(inst, export)(self._h, arg)
            if r < 0:
                raise inst.error(export, r)
        return r

    @overload
    def retry(self, fn: F, /) -> F: ...
    @overload
    def retry(self, fn: None = None, /, *, before_sleep: Optional[BeforeSleep] = None, classify: Optional[Classify] = None,
              method: Optional[str] = None, idempotency_key: Optional[str] = None,
              metrics: Any = None, headers: Optional[MutableMapping[str, str]] = None) -> Callable[[F], F]: ...

    def retry(self, fn: Optional[Callable[..., Any]] = None, /, *, before_sleep: Optional[BeforeSleep] = None,
              classify: Optional[Classify] = None, method: Optional[str] = None,
              idempotency_key: Optional[str] = None, metrics: Any = None,
              headers: Optional[MutableMapping[str, str]] = None) -> Any:
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
        idempotency gate when the exception does not. On a policy with a
        circuit breaker, each call first asks ``acquire``: a refused call
        raises ``RetryError`` with reason ``circuit_open`` before it is made.
        ``metrics`` (from ``backstop.metrics.create_metrics``) counts
        attempts, retries, refusals, delays and the breaker's state.

        Before each attempt the loop asks ``attempt_timeout`` (the
        policy's ``attempt_timeout``, bounded by what is left of
        ``max_elapsed``); with one, the attempt runs within it: a
        coroutine as a task, cancelled at the deadline; a plain function
        in a thread of its own, abandoned at the deadline (it runs on, its
        result dropped: pass ``backstop.attempt_time_left()`` as the
        ``timeout=`` of its client calls so that it ends in time). The
        expiry is ``backstop.DeadlineExceeded``, error kind ``timeout``.

        Retry at one layer (docs/layers.md): a ``RetryError`` of a
        ``@policy.retry`` inside the function (one that made a call: not
        ``circuit_open``), or an HTTP error whose response has
        ``Backstop-No-Retry``, is a failure a layer below already retried:
        the default policy stops at once with ``retried_downstream``
        (``X-Envoy-Overloaded``: ``server_declined``). Each attempt runs with
        its number in ``backstop.current_attempt()``; ``headers`` (a mutable
        mapping, the one the function sends) gets ``backstop-attempt`` and
        ``x-envoy-attempt-count`` before each attempt, except those it had
        before the first, and loses them again when the loop ends. Inside a
        request served by ``OneLayerWSGI`` or ``OneLayerASGI``, the reason a
        loop gave up is sent back in ``Backstop-No-Retry`` on a failed
        response.
        """
        wrap = retrying(self, before_sleep=before_sleep, classify=classify, method=method,
                        idempotency_key=idempotency_key, metrics=metrics, headers=headers)
        return wrap(fn) if fn is not None else wrap

    def close(self) -> None:
        """Frees the policy in the module. Later calls raise BackstopError."""
        with self._inst.lock:
            self._h = 0  # under the lock: no call can use the handle once freed
            found = self._finalizer.detach()
            if found is not None:
                _free_locked(self._inst, found[2][1])
            _drain(self._inst)

    def __enter__(self) -> Policy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Handles of collected policies not freed yet. The garbage collector runs
# finalizers wherever Python allocates, also in a thread that holds the
# instance's lock (between two calls of a decide_many, or in a WASI
# callback during a call), so a finalizer never waits for the lock: it
# queues the handle, and whoever holds the lock next frees it.
_collected: Deque[Tuple[Instance, int]] = deque()


def _free(inst: Instance, handle: int) -> None:
    """The finalizer of a Policy: frees its handle now if the instance is
    free, else queues it for the next load or close."""
    _collected.append((inst, handle))
    if inst.lock.acquire(blocking=False):
        try:
            _drain(inst)
        finally:
            inst.lock.release()


def _drain(inst: Instance) -> None:
    """Frees the queued handles of inst; the caller holds inst.lock."""
    for _ in range(len(_collected)):
        try:
            owner, handle = _collected.popleft()
        except IndexError:
            return
        if owner is inst:
            _free_locked(inst, handle)
        else:
            _collected.append((owner, handle))


def _free_locked(inst: Instance, handle: int) -> None:
    try:
        inst.policy_free(handle)
    except BackstopError:
        pass  # the instance trapped: it holds nothing any more


# policy.MaxFileBytes (docs/policy.md, "Limits"); a test pins it to the module's.
MAX_POLICY_BYTES = 64 << 10


def load_policy(source: Union[str, bytes, bytearray, Mapping[str, Any], "os.PathLike[str]"]) -> Policy:
    """Loads a policy from a preset name (``"default"``, ``"critical"``,
    ``"batch"``, ``"fast-transient"``), JSON or YAML text (str or bytes), a
    dict (the policy object) or a ``pathlib.Path`` to a JSON or YAML file.

    Raises ``PolicyError`` naming every invalid field.
    """
    if isinstance(source, os.PathLike):
        with open(source, "rb") as f:
            data = f.read(MAX_POLICY_BYTES + 1)
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
    # The module refuses a policy over MAX_POLICY_BYTES with a PolicyError;
    # a byte more than that is all it needs to say so, whatever the size.
    data = data[:MAX_POLICY_BYTES + 1]
    with inst.lock:
        _drain(inst)
        inst.ensure_buffer(len(data))[:len(data)] = data
        h = inst.policy_load(len(data))
        if h < 0:
            raise inst.error("policy_load", h)
    return Policy(inst, h)


# -- failure fields ------------------------------------------------------------


def _merge(fields: Any) -> Dict[str, Any]:
    """The failure with every field, absent ones at their defaults."""
    try:
        d = {**_DEFAULTS, **fields}
    except TypeError:
        raise _not_object(fields) from None
    if len(d) != _NFIELDS:
        # The least unknown name in code point order, as every host reports.
        name = min(_well_formed(k if isinstance(k, str) else str(k)) for k in fields if k not in _DEFAULTS)
        raise InputError(name, "unknown field")
    return d


def _not_object(v: Any) -> InputError:
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
    attempt = _int64("attempt", d["attempt"], False)
    http = _int32("http_status", d["http_status"], "must be a 32-bit integer")
    grpc = _grpc(d["grpc_code"])
    kind = _text("error_kind", d["error_kind"])
    ra = _hint("retry_after", d["retry_after"])
    push = _hint("grpc_retry_pushback_ms", d["grpc_retry_pushback_ms"])
    method = _text("method", d["method"])
    flags = _key(d["idempotency_key"])
    elapsed = _int64("elapsed_ms", d["elapsed_ms"], True)
    now = _int64("now_ms", d["now_ms"], True)
    rnd = _random(d["random"])
    prev = _int64("prev_delay_ms", d["prev_delay_ms"], True)
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


def _now(now_ms: Any) -> int:
    return int(_time() * 1000) if now_ms is None else _int64("now_ms", now_ms, True)


def _int64(name: str, v: Any, truncate: bool) -> int:
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
            b = _well_formed(v).encode()
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


def _well_formed(s: str) -> str:
    """s with each lone surrogate as U+FFFD, as JSON readers and
    TextEncoder write them."""
    return _SURROGATE.sub("\ufffd", s)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _quote(s: str) -> str:
    """s as a JSON string, as every host's messages quote it."""
    return json.dumps(_well_formed(s), ensure_ascii=False).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
