"""Policy.retry: a decorator that retries a function as the policy decides."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import errno
import functools
import inspect
import json
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from importlib import resources
from typing import (Any, Awaitable, Callable, Dict, List, Mapping, MutableMapping, Optional, Protocol, Tuple,
                    TypeVar, Union)

from ._deadline import DeadlineExceeded, await_within, run_within
from ._host._contract import Decision, Permit
from ._errors import RetryError
from ._layers import AttemptHeaders, _attempt, record_gave_up

F = TypeVar("F", bound=Callable[..., Any])


class PolicyLike(Protocol):
    """What the retry loop asks of its policy: the part of
    ``backstop.Policy`` (_policy.py, which imports this module for
    ``Policy.retry``) that it calls."""

    @property
    def stateful(self) -> bool: ...
    def acquire(self, now_ms: Optional[int] = None) -> Permit: ...
    def decide(self, failure: Mapping[str, Any], /) -> Decision: ...
    def record_success(self, now_ms: Optional[int] = None) -> None: ...
    def record_duration(self, duration_ms: Union[int, float, timedelta], now_ms: Optional[int] = None) -> None: ...
    def budget_tokens(self, now_ms: Optional[int] = None) -> Optional[float]: ...
    def circuit_state(self, now_ms: Optional[int] = None) -> str: ...
    def attempt_timeout(self, elapsed_ms: Union[int, float, timedelta] = 0) -> int: ...


class CircuitOpenError(Exception):
    """The last exception of a RetryError("circuit_open"): the breaker
    refused the call before it was made."""


# The clock and the sleeps, looked up at call time so that tests can
# replace them (tests never sleep).
_monotonic = time.monotonic
_sleep = time.sleep
_async_sleep = asyncio.sleep


@dataclass(frozen=True)
class RetryState:
    """What ``before_sleep`` is told before each wait (like tenacity's
    RetryCallState): the ``attempt`` that just failed (1-based), the
    ``decision`` (``decision.delay`` is the upcoming wait), the
    ``exception`` it raised and the time ``elapsed`` since the first attempt
    started."""

    attempt: int
    decision: Decision
    exception: BaseException
    elapsed: timedelta


BeforeSleep = Callable[[RetryState], Union[None, Awaitable[None]]]
#: An exception type → a class name ("retryable", "permanent", "uncertain"),
#: an error kind or a dict of failure fields; or a function of the exception
#: returning one of those, or None for the built-in classification.
Classify = Union[Mapping[type, Union[str, Mapping[str, Any]]],
                 Callable[[BaseException], Union[None, str, Mapping[str, Any]]]]

# A class name is sent as the error kind of the same name: the default
# tables map the kinds "retryable", "permanent" and "uncertain" to their
# classes, so the module still makes the whole decision (limits, gate,
# budget, breaker) and a policy can remap them.


def retrying(policy: PolicyLike, *, before_sleep: Optional[BeforeSleep] = None,
             classify: Optional[Classify] = None, method: Optional[str] = None,
             idempotency_key: Optional[str] = None, metrics: Any = None,
             headers: Optional[MutableMapping[str, str]] = None, reraise: bool = False) -> Callable[[F], F]:
    """The decorator of ``Policy.retry`` (documented there), its options
    checked at once."""
    if before_sleep is not None and not callable(before_sleep):
        raise TypeError("retry: before_sleep must be callable (got %r)" % (before_sleep,))
    check_classify("retry", classify)
    for name, s in (("method", method), ("idempotency_key", idempotency_key)):
        if s is not None and not isinstance(s, str):
            raise TypeError("retry: %s must be a string (got %r)" % (name, s))
    if metrics is not None and not callable(getattr(metrics, "attempt", None)):
        raise TypeError("retry: metrics must come from backstop.metrics.create_metrics (got %r)" % (metrics,))
    if headers is not None and not isinstance(headers, MutableMapping):
        raise TypeError("retry: headers must be a mutable mapping, such as a dict (got %r)" % (headers,))
    if not isinstance(reraise, bool):
        raise TypeError("retry: reraise must be True or False (got %r)" % (reraise,))

    return lambda fn: _wrap(policy, fn, before_sleep, classify, method, idempotency_key, metrics, headers, reraise)


def check_classify(who: str, classify: Optional[Classify]) -> None:
    """Raises TypeError (prefixed with who) for an invalid classify option."""
    if classify is not None and not callable(classify) and not isinstance(classify, Mapping):
        raise TypeError("%s: classify must be a mapping of exception types or a function (got %r)" % (who, classify))
    if isinstance(classify, Mapping):
        for k, v in classify.items():
            if not (isinstance(k, type) and issubclass(k, BaseException)):
                raise TypeError("%s: classify keys must be exception types (got %r)" % (who, k))
            if not isinstance(v, (str, Mapping)):
                raise TypeError("%s: classify[%s] must be a class name, an error kind or a dict (got %r)"
                                % (who, k.__name__, v))


def classifier(classify: Optional[Classify]) -> Callable[[BaseException], Dict[str, Any]]:
    """The failure fields of an exception, by classify (checked by
    check_classify) or else by describe."""
    # Split once here: isinstance against an ABC is slow on the hot path.
    by_type: Optional[Mapping[type, Any]] = None
    by_call: Optional[Callable[[BaseException], Any]] = None
    if isinstance(classify, Mapping):
        by_type = classify
    else:
        by_call = classify
    return lambda exc: _classified(by_type, by_call, exc)


def _wrap(policy: PolicyLike, fn: F, before_sleep: Optional[BeforeSleep], classify: Optional[Classify],
          method: Optional[str], idempotency_key: Optional[str], metrics: Any = None,
          headers: Optional[MutableMapping[str, str]] = None, reraise: bool = False) -> F:
    classified = classifier(classify)
    # The breaker is asked before each call (a policy without one allows all).
    guarded = policy.stateful
    # Each call's duration feeds the breaker's slow-call rate.
    measured = guarded and hasattr(policy, "record_duration")

    def admit(attempt: int) -> None:
        p = policy.acquire()
        if metrics is not None:
            metrics.state(p.state)
        if not p.allowed:
            if metrics is not None:
                metrics.refused("circuit_open")
            refused = CircuitOpenError("the circuit breaker refused the call; it may admit one in %d ms" % p.retry_in_ms)
            record_gave_up("circuit_open")
            raise RetryError("circuit_open", attempt - 1, refused, Decision("dead_letter", 0, "circuit_open", "retryable"))

    def count(d: Optional[Decision]) -> None:
        """Counts an attempt: a success (d None) or a failure decided d."""
        if d is None:
            metrics.attempt("success")
        else:
            metrics.attempt("retry" if d.retry else "dead_letter")
            if d.retry:
                metrics.retry(d.reason, d.delay_ms)
        if guarded:
            metrics.state(policy.circuit_state())
            metrics.budget(policy.budget_tokens())

    def decide(exc: BaseException, attempt: int, start: float, prev_ms: int) -> Decision:
        fields = classified(exc)
        fields.setdefault("method", method)
        fields.setdefault("idempotency_key", idempotency_key)
        fields.update(attempt=attempt, elapsed_ms=int((_monotonic() - start) * 1000), prev_delay_ms=prev_ms)
        return policy.decide(fields)

    def state(exc: BaseException, attempt: int, start: float, d: Decision) -> RetryState:
        return RetryState(attempt, d, exc, timedelta(seconds=_monotonic() - start))

    # Each attempt runs with its number in the context (current_attempt,
    # attempt_headers, httpx_attempt_hook) and, with headers, on the
    # caller's mapping; the context has the outer loop's number again for
    # the decision, before_sleep and the wait.
    # An attempt the policy bounds (attempt_timeout, what is left of
    # max_elapsed) runs within its timeout (_deadline): a coroutine as a
    # task, cancelled at the deadline; a function in a thread, abandoned.
    def begin(attempt: int, sent: Optional[AttemptHeaders], start: float,
              failed: Optional[float]) -> Tuple[contextvars.Token[int], float]:
        """Admits attempt (the breaker) and sets its number; returns the
        token that puts the outer number back and the attempt's timeout in
        seconds (0: none). failed is when the attempt before failed (None:
        the first): the measured latency of this retry, its delay plus
        however late the sleep returned."""
        if guarded:
            admit(attempt)
        if failed is not None and metrics is not None:
            metrics.latency(round((_monotonic() - failed) * 1000))
        timeout = policy.attempt_timeout(int((_monotonic() - start) * 1000)) / 1000
        if sent is not None:
            sent.set(attempt)
        return _attempt.set(attempt), timeout

    def settle(exc: Optional[BaseException], attempt: int, start: float, prev_ms: int, took: float) -> Optional[Decision]:
        """Reports the attempt's end, after its duration (took, in seconds
        on the monotonic clock): None for a success, else the decision to
        retry; a give-up is raised as RetryError, or with reraise as the
        attempt's own exception (tenacity's reraise=True)."""
        if measured:
            policy.record_duration(max(0, int(took * 1000)))
        if exc is None:
            policy.record_success()
            if metrics is not None:
                count(None)
            return None
        d = decide(exc, attempt, start, prev_ms)
        if metrics is not None:
            count(d)
        if not d.retry:
            record_gave_up(d.reason)
            if reraise:
                raise exc
            raise RetryError(d.reason, attempt, exc, d) from exc
        return d

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            start, prev, attempt = _monotonic(), 0, 1
            failed: Optional[float] = None
            sent = AttemptHeaders(headers) if headers is not None else None
            try:
                while True:
                    token, timeout = begin(attempt, sent, start, failed)
                    called = _monotonic()
                    exc: Optional[BaseException] = None
                    try:
                        if timeout:
                            result = await await_within(fn(*args, **kwargs), timeout, "attempt")
                        else:
                            result = await fn(*args, **kwargs)
                    except Exception as e:
                        exc = e
                    finally:
                        _attempt.reset(token)
                    failed = _monotonic()
                    d = settle(exc, attempt, start, prev, failed - called)
                    if d is None:
                        return result
                    assert exc is not None  # settle decides only a failure
                    if before_sleep is not None:
                        r = before_sleep(state(exc, attempt, start, d))
                        if inspect.isawaitable(r):
                            await r
                    await _async_sleep(d.delay_seconds)
                    prev, attempt = d.delay_ms, attempt + 1
            finally:
                if sent is not None:
                    sent.restore()
        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start, prev, attempt = _monotonic(), 0, 1
        failed: Optional[float] = None
        sent = AttemptHeaders(headers) if headers is not None else None
        try:
            while True:
                token, timeout = begin(attempt, sent, start, failed)
                called = _monotonic()
                exc: Optional[BaseException] = None
                try:
                    if timeout:
                        result = run_within(functools.partial(fn, *args, **kwargs), timeout, "attempt")
                    else:
                        result = fn(*args, **kwargs)
                except Exception as e:
                    exc = e
                finally:
                    _attempt.reset(token)
                failed = _monotonic()
                d = settle(exc, attempt, start, prev, failed - called)
                if d is None:
                    return result
                assert exc is not None  # settle decides only a failure
                if before_sleep is not None:
                    before_sleep(state(exc, attempt, start, d))
                _sleep(d.delay_seconds)
                prev, attempt = d.delay_ms, attempt + 1
        finally:
            if sent is not None:
                sent.restore()
    return wrapper  # type: ignore[return-value]


def _classified(by_type: Optional[Mapping[type, Any]], by_call: Optional[Callable[[BaseException], Any]],
                exc: BaseException) -> Dict[str, Any]:
    """The failure fields of exc (classify sees a RetryError's last
    exception: see _below)."""
    if isinstance(exc, RetryError):
        return _below(exc, _classified(by_type, by_call, exc.last_exception))
    if isinstance(exc, DeadlineExceeded):
        return {"error_kind": "timeout"}  # backstop's own deadline: a timeout, whatever classify says
    v: Union[None, str, Mapping[str, Any]] = None
    if by_type is not None:
        v = next((by_type[t] for t in type(exc).__mro__ if t in by_type), None)
    elif by_call is not None:
        v = by_call(exc)
    if v is None:
        return describe(exc)
    if isinstance(v, str):
        return {"error_kind": v}
    return dict(v)


def _below(exc: RetryError, fields: Dict[str, Any]) -> Dict[str, Any]:
    """The fields of a RetryError: a @policy.retry below (a nested loop, or
    the one inside a queue job's handler) that gave up. Its last exception
    is classified (fields), and marked retried_downstream so that this layer
    gives up too (retry at one layer, docs/layers.md), unless the policy says
    retried_downstream: retry. A circuit_open one, refused by its breaker
    before it made a call, retried nothing: it stays unmarked."""
    if exc.reason != "circuit_open":
        fields["retried_downstream"] = True
    return fields


def describe(exc: BaseException) -> Dict[str, Any]:
    """The failure fields the built-in classification reads from exc.

    - A ``RetryError`` (an inner ``@policy.retry`` that gave up): the fields
      of its last exception, with ``retried_downstream`` (unless its reason
      is ``circuit_open``: no call was made).

    - HTTP status errors: ``exc.response.status_code`` or ``.status``
      (requests, httpx), ``exc.status_code``, ``exc.status`` (aiohttp),
      ``exc.code`` (urllib), with the ``Retry-After`` header; the method and
      ``Idempotency-Key`` header of ``exc.request`` when present; a
      ``Backstop-No-Retry`` header (a layer below retried and gave up) sets
      ``retried_downstream``, ``X-Envoy-Overloaded`` ``server_declined``.
    - gRPC errors (``exc.code()`` and ``grpc-retry-pushback-ms`` trailing
      metadata).
    - Network errors, found on exc or its causes: ``ConnectionRefusedError``
      → ``connection_refused``; ``ConnectionResetError``, ``BrokenPipeError``
      and any other ``ConnectionError`` → ``connection_reset`` (the request
      may have been sent, so the idempotency gate applies); ``TimeoutError``,
      ``socket.timeout``, ``asyncio.TimeoutError`` → ``timeout``; DNS
      failures → ``dns_temporary`` or ``dns_not_found``; third-party
      ``ConnectTimeout`` (requests, httpx) and ``ConnectionTimeoutError``
      (aiohttp) → ``connect_timeout``, before anything else; ``...Timeout``
      → ``timeout``, ``ConnectError`` → ``connection_reset``. The table all
      languages follow is ``contract/errorkinds.json``.
    - Anything else: no signal, so the policy's ``classify.default``
      (``uncertain`` unless the policy says otherwise) decides.
    """
    if isinstance(exc, RetryError):
        return _below(exc, describe(exc.last_exception))
    resp = _attr(exc, "response")
    status = next((s for s in (_attr(resp, "status_code"), _attr(resp, "status"), _attr(exc, "status_code"),
                               _attr(exc, "status"), _attr(exc, "code")) if _is_status(s)), None)
    if status is not None:
        fields: Dict[str, Any] = {"http_status": status}
        headers = _attr(resp, "headers") if resp is not None else _attr(exc, "headers")
        ra = _header(headers, "Retry-After")
        if ra:
            fields["retry_after"] = ra
        # The signals of a layer below; an empty value is absent, as Go's
        # Header.Get reads it.
        if _header(headers, "Backstop-No-Retry"):
            fields["retried_downstream"] = True
        if _header(headers, "X-Envoy-Overloaded"):
            fields["server_declined"] = True
        req = _attr(exc, "request") or _attr(resp, "request")
        m = _attr(req, "method")
        if isinstance(m, str):
            fields["method"] = m
        key = _header(_attr(req, "headers"), "Idempotency-Key")
        if key:
            fields["idempotency_key"] = key
        return fields
    grpc = _grpc_fields(exc)
    if grpc:
        return grpc
    kind = _kind(exc)
    return {"error_kind": kind} if kind else {}


def _attr(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    try:
        return getattr(obj, name, None)
    except Exception:  # httpx raises RuntimeError for an unset .request
        return None


def _is_status(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 100 <= v <= 599


def _header(headers: Any, name: str) -> Optional[str]:
    get = _attr(headers, "get")
    if not callable(get):
        return None
    v = get(name)
    if v is None:
        v = get(name.lower())  # a plain dict
    return str(v) if v is not None else None


def _grpc_fields(exc: BaseException) -> Optional[Dict[str, Any]]:
    code = _attr(exc, "code")
    if not callable(code):
        return None
    try:
        value = _attr(code(), "value")  # grpc.StatusCode.UNAVAILABLE.value == (14, "unavailable")
    except Exception:
        return None
    if not (isinstance(value, tuple) and value and isinstance(value[0], int) and 1 <= value[0] <= 16):
        return None
    fields: Dict[str, Any] = {"grpc_code": value[0]}
    md = _attr(exc, "trailing_metadata")
    try:
        for k, v in (md() if callable(md) else None) or ():
            if k == "grpc-retry-pushback-ms":
                fields["grpc_retry_pushback_ms"] = v if isinstance(v, str) else str(v)
    except Exception:
        pass
    return fields


_TIMEOUTS = (TimeoutError, socket.timeout, asyncio.TimeoutError, concurrent.futures.TimeoutError)
# OS error numbers → kinds: the "codes" of errorkinds.json
# (contract/errorkinds.json, copied into the package), the one table every
# language reads; test_error_kinds.py checks each row. Codes this platform's
# errno module does not name (undici's, getaddrinfo's) are not OS errors here.
_ERRNO_KINDS: Dict[int, str] = {
    getattr(errno, name): kind
    for name, kind in json.loads(resources.files(__package__).joinpath("errorkinds.json").read_text("utf-8"))["codes"].items()
    if isinstance(getattr(errno, name, None), int)
}
# requests and httpx ConnectTimeout, urllib3 ConnectTimeoutError, aiohttp
# ConnectionTimeoutError (contract/errorkinds.json).
_CONNECT_TIMEOUTS = ("ConnectTimeout", "ConnectTimeoutError", "ConnectionTimeoutError")


def _kind(exc: BaseException) -> Optional[str]:
    # Look through wrappers (requests, httpx, urllib3, urllib's URLError)
    # for the OS error underneath, then by class name for libraries whose
    # exceptions do not subclass the built-in ones.
    # A connect timeout first: the request never left, whatever timeout it
    # wraps or subclasses (aiohttp's is an asyncio.TimeoutError).
    if any(t.__name__ in _CONNECT_TIMEOUTS for t in type(exc).__mro__):
        return "connect_timeout"
    seen: List[BaseException] = []
    e: Any = exc
    while isinstance(e, BaseException) and len(seen) < 8 and e not in seen:
        seen.append(e)
        if isinstance(e, socket.gaierror):
            return "dns_temporary" if e.errno == socket.EAI_AGAIN else "dns_not_found"
        if isinstance(e, ConnectionRefusedError):
            return "connection_refused"
        code = getattr(e, "errno", None)
        if isinstance(code, int) and code in _ERRNO_KINDS:
            return _ERRNO_KINDS[code]
        if isinstance(e, ConnectionError):
            return "connection_reset"
        if isinstance(e, _TIMEOUTS):
            return "timeout"
        nxt = _attr(e, "reason")  # urllib.error.URLError, urllib3.MaxRetryError
        if not isinstance(nxt, BaseException):
            nxt = e.__cause__ or e.__context__ or next((a for a in e.args if isinstance(a, BaseException)), None)
        e = nxt
    for t in type(exc).__mro__:
        n = t.__name__
        if n.endswith(("Timeout", "TimeoutError", "TimeoutException")):
            return "timeout"
        if n in ("ConnectError", "ConnectionError"):
            return "connection_reset"
    return None
