"""Retry at one layer (docs/layers.md): the attempt headers a retry loop
sends, and the server middleware that answers "do not retry" when retrying
cannot help (OneLayerWSGI, OneLayerASGI). The loops find the attempt number
and the request being served through context variables, so neither the
function a loop runs nor the application changes. Imports no HTTP client
or framework."""

from __future__ import annotations

import contextvars
from typing import (Any, Awaitable, Callable, Dict, Generator, Iterable, Iterator, List, MutableMapping, Optional,
                    Sequence, Tuple)

# The headers, in lower case (docs/layers.md).
ATTEMPT_HEADER = "backstop-attempt"
ENVOY_ATTEMPT_HEADER = "x-envoy-attempt-count"
NO_RETRY_HEADER = "backstop-no-retry"
OVERLOADED_HEADER = "x-envoy-overloaded"
GRPC_PREVIOUS_ATTEMPTS = "grpc-previous-rpc-attempts"

_SHED_BODY = b"circuit breaker open: not retried here; do not retry\n"
_SHED_HEADERS = (("content-type", "text/plain; charset=utf-8"), (NO_RETRY_HEADER, "circuit_open"),
                 (OVERLOADED_HEADER, "true"))

# The attempt a @policy.retry loop is running (0 outside one). A nested
# loop sets its own and puts the outer one's back when it returns.
_attempt: contextvars.ContextVar[int] = contextvars.ContextVar("backstop.attempt", default=0)


def current_attempt() -> int:
    """The number of the attempt the enclosing ``@policy.retry`` loop is
    running (1 for the first call), 0 outside one."""
    return _attempt.get()


def _number(n: Optional[int]) -> int:
    if n is None:
        return _attempt.get()
    if n.__class__ is bool or not isinstance(n, int) or n < 1:
        raise TypeError("expected an attempt number (an integer >= 1, got %r)" % (n,))
    return n


def attempt_headers(n: Optional[int] = None) -> Dict[str, str]:
    """The HTTP headers of attempt ``n`` (default: ``current_attempt()``):
    ``{"backstop-attempt": "n", "x-envoy-attempt-count": "n"}``; empty
    outside a retry loop, so ``headers={**attempt_headers()}`` is safe
    anywhere."""
    v = _number(n)
    if v < 1:
        return {}
    s = str(v)
    return {ATTEMPT_HEADER: s, ENVOY_ATTEMPT_HEADER: s}


def grpc_attempt_metadata(n: Optional[int] = None) -> Tuple[Tuple[str, str], ...]:
    """The gRPC metadata pairs of attempt ``n`` (default:
    ``current_attempt()``), for a stub's ``metadata=``: ``backstop-attempt``,
    and ``grpc-previous-rpc-attempts`` (n - 1) on a retry, as gRPC's own
    retries send it. Empty outside a retry loop."""
    v = _number(n)
    if v < 1:
        return ()
    if v == 1:
        return ((ATTEMPT_HEADER, "1"),)
    return ((ATTEMPT_HEADER, str(v)), (GRPC_PREVIOUS_ATTEMPTS, str(v - 1)))


def _has(headers: Any, name: str) -> bool:
    """Whether a header mapping names name, in any letter case (a plain
    dict is case-sensitive; requests' and httpx's are not)."""
    if name in headers:
        return True
    return any(isinstance(k, str) and k.lower() == name for k in headers)


class AttemptHeaders:
    """Sets the attempt headers on a caller's mapping before each attempt
    of one loop, leaving alone those the caller set before the first, and
    takes the ones it added away when the loop ends: a decorator's mapping
    is reused by every call, and the next call must not mistake them for
    the caller's."""

    def __init__(self, headers: MutableMapping[str, str]) -> None:
        self.headers = headers
        self.names = [n for n in (ATTEMPT_HEADER, ENVOY_ATTEMPT_HEADER) if not _has(headers, n)]

    def set(self, n: int) -> None:
        v = str(n)
        for name in self.names:
            self.headers[name] = v

    def restore(self) -> None:
        for name in self.names:
            self.headers.pop(name, None)


class _Done:
    """An awaitable that is already done: what httpx_attempt_hook returns,
    so that one hook serves httpx.Client (which ignores it) and
    httpx.AsyncClient (which awaits it) without an unawaited coroutine."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        yield from ()


def httpx_attempt_hook(request: Any) -> Awaitable[None]:
    """An httpx request event hook (``httpx.Client`` or ``httpx.AsyncClient``,
    ``event_hooks={"request": [backstop.httpx_attempt_hook]}``): inside a
    ``@policy.retry`` loop, sets ``backstop-attempt`` and
    ``x-envoy-attempt-count`` on each request, unless the request has them;
    outside a loop it does nothing. httpx itself is not imported."""
    n = _attempt.get()
    if n > 0:
        h = request.headers
        for name in (ATTEMPT_HEADER, ENVOY_ATTEMPT_HEADER):
            if name not in h:
                h[name] = str(n)
    return _Done()


# -- the server side ----------------------------------------------------------


class _Served:
    """The request being served: the reason of the last retry loop in it
    that gave up."""

    __slots__ = ("reason",)

    def __init__(self) -> None:
        self.reason: Optional[str] = None


_served: contextvars.ContextVar[Optional[_Served]] = contextvars.ContextVar("backstop.request", default=None)


def record_gave_up(reason: str) -> None:
    """Tells the request being served, if any, that a retry loop stopped
    with reason."""
    s = _served.get()
    if s is not None:
        s.reason = reason


def _policies(who: str, policies: Any) -> Tuple[Any, ...]:
    ok = isinstance(policies, (list, tuple)) and all(callable(getattr(p, "circuit_state", None)) for p in policies)
    if not ok:
        raise TypeError("%s: policies must be a list of Policy from load_policy() (got %r)" % (who, policies))
    return tuple(policies)


def _any_open(policies: Sequence[Any]) -> bool:
    """Whether the breaker of any of policies is open. A policy without a
    breaker is never open; one that cannot answer (closed, its instance
    lost) does not shed, as Go's Middleware."""
    for p in policies:
        if getattr(p, "stateful", True) is False:
            continue
        try:
            if p.circuit_state() == "open":
                return True
        except Exception:
            pass
    return False


def _status(status: str) -> int:
    try:
        return int(status.split(" ", 1)[0])
    except (ValueError, AttributeError):
        return 0


WSGIApp = Callable[[Dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class OneLayerWSGI:
    """WSGI middleware for retry at one layer (docs/layers.md):

    - while the breaker of any of ``policies`` (those the service calls its
      dependencies with) is open, a request is answered at once with 503,
      ``Backstop-No-Retry: circuit_open`` and ``X-Envoy-Overloaded: true``,
      and the application is not run;
    - when a ``@policy.retry`` loop running inside the request gave up (any
      reason), a failed response (status 400 or more) gets
      ``Backstop-No-Retry: <reason>``, unless the application set it.

    An empty retry budget sheds nothing: a budget limits retries, never
    first calls. The application runs, and its response is iterated, in a
    copy of the caller's context that holds the request.
    """

    def __init__(self, app: WSGIApp, policies: Sequence[Any] = ()) -> None:
        if not callable(app):
            raise TypeError("OneLayerWSGI: app must be a WSGI application (got %r)" % (app,))
        self.app = app
        self.policies = _policies("OneLayerWSGI", policies)

    def __call__(self, environ: Dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if _any_open(self.policies):
            start_response("503 Service Unavailable", list(_SHED_HEADERS))
            return [_SHED_BODY]
        served = _Served()

        def marked(status: str, headers: List[Tuple[str, str]], exc_info: Any = None) -> Any:
            reason = served.reason
            if reason is not None and _status(status) >= 400 and not any(k.lower() == NO_RETRY_HEADER for k, _ in headers):
                headers = [*headers, (NO_RETRY_HEADER, reason)]
            return start_response(status, headers) if exc_info is None else start_response(status, headers, exc_info)

        ctx = contextvars.copy_context()
        ctx.run(_served.set, served)
        result = ctx.run(self.app, environ, marked)
        # A list or tuple runs no code of the application when iterated (and
        # keeps its len(), which servers use for Content-Length); a generator
        # calls start_response on its first step: iterate it in the context.
        if isinstance(result, (list, tuple)):
            return result
        return _InContext(ctx, result)


class _InContext:
    """A WSGI response iterable whose steps (and close) run in ctx."""

    def __init__(self, ctx: contextvars.Context, result: Iterable[bytes]) -> None:
        self._ctx = ctx
        self._result = result
        self._it: Optional[Iterator[bytes]] = None

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        if self._it is None:
            self._it = self._ctx.run(iter, self._result)
        return self._ctx.run(next, self._it)

    def close(self) -> None:
        close = getattr(self._result, "close", None)
        if close is not None:
            self._ctx.run(close)


ASGIApp = Callable[[Dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Dict[str, Any]], Awaitable[None]]],
                   Awaitable[None]]


class OneLayerASGI:
    """ASGI middleware for retry at one layer (docs/layers.md), the same as
    ``OneLayerWSGI`` for ``http`` requests: while a breaker of ``policies``
    is open, 503 with ``Backstop-No-Retry: circuit_open`` and
    ``X-Envoy-Overloaded: true`` without running the application; after a
    ``@policy.retry`` loop inside the request gave up, ``Backstop-No-Retry:
    <reason>`` on a failed response unless the application set it. Other
    scopes (websocket, lifespan) pass through."""

    def __init__(self, app: ASGIApp, policies: Sequence[Any] = ()) -> None:
        if not callable(app):
            raise TypeError("OneLayerASGI: app must be an ASGI application (got %r)" % (app,))
        self.app = app
        self.policies = _policies("OneLayerASGI", policies)

    async def __call__(self, scope: Dict[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Dict[str, Any]], Awaitable[None]]) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        if _any_open(self.policies):
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(k.encode(), v.encode()) for k, v in _SHED_HEADERS]})
            await send({"type": "http.response.body", "body": _SHED_BODY})
            return
        served = _Served()

        async def marked(message: Dict[str, Any]) -> None:
            reason = served.reason
            if message.get("type") == "http.response.start" and reason is not None and message.get("status", 0) >= 400:
                headers = list(message.get("headers") or ())
                if not any(bytes(k).lower() == NO_RETRY_HEADER.encode() for k, _ in headers):
                    message = {**message, "headers": [*headers, (NO_RETRY_HEADER.encode(), reason.encode("latin-1"))]}
            await send(message)

        # Tasks the application starts copy the context, and the store with it.
        token = _served.set(served)
        try:
            await self.app(scope, receive, marked)
        finally:
            _served.reset(token)
