"""The server side of idempotency keys: a Redis store that answers a retried
request with the first one's response instead of running it twice.

Every call is one run of the contract's script ``scripts/idempotency.lua``
(``queue/redisqueue/README.md`` in the backstop repository, "Idempotency keys"), the
one the Go and Node.js adapters run too; ``testdata/idempotency`` pins what
it answers. ``IdempotencyStore`` takes a ``redis.Redis`` or
``redis.RedisCluster``, ``AsyncIdempotencyStore`` their ``redis.asyncio``
counterparts; ``IdempotencyMiddleware`` is ASGI middleware (FastAPI,
Starlette) over the asyncio stores, ``IdempotencyWSGI`` WSGI middleware
(Flask, Django) over the sync ones, both deciding through ``_Guard``, and
``idempotent`` a decorator for plain functions (a queue worker's handler,
keyed by the job id).

Whatever happens to the request or the handler's task, the middleware and
the decorator complete (or release) the key: the store call runs in a task
(the sync store: the process's few settler threads), tried again with
backoff while the key's lease lasts. Headers are stored and replayed through one rule, the one
every language applies (``_safe_header``), so that a record any language
stored replays in any other.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import heapq
import inspect
import io
import json
import logging
import os
import random
import re
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import resources
from typing import Any, Callable, Dict, Generator, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union
from urllib.parse import unquote_to_bytes

try:
    import redis
except ImportError:  # the PostgreSQL store (backstop.idempotency_postgres) needs no Redis client
    redis = None  # type: ignore[assignment]

__all__ = [
    "AsyncIdempotencyStore",
    "Claim",
    "ConflictError",
    "IdempotencyMiddleware",
    "IdempotencyWSGI",
    "IdempotencyMetrics",
    "IdempotencyStore",
    "InProgressError",
    "LeaseLostError",
    "MAX_KEY_LENGTH",
    "REPLAYED_HEADER",
    "StoredResponse",
    "TooLargeError",
    "check_key",
    "default_metrics",
    "default_release",
    "fingerprint",
    "request_hash",
    "idempotent",
]

log = logging.getLogger("backstop.idempotency")

MAX_KEY_LENGTH = 255
REPLAYED_HEADER = "Idempotent-Replayed"
_PRINTABLE = re.compile(r"[\x20-\x7e]+\Z")
_OUTCOMES = ("first_run", "replayed", "in_progress", "conflict", "too_large")
_OPERATIONS = ("begin", "complete", "fail")
_source: Optional[str] = None

Duration = Union[timedelta, float, int]


def _script_source() -> str:
    global _source
    if _source is None:
        scripts = resources.files("backstop") / "scripts"
        _source = (scripts / "lib.lua").read_text("utf-8") + "\n" + (scripts / "idempotency.lua").read_text("utf-8")
    return _source


class LeaseLostError(Exception):
    """The caller no longer owns its key: its lease ran out and another
    request took the key over, or the record expired. Nothing was written."""


class InProgressError(Exception):
    """``idempotent``: another call holds the key; retry after ``retry_after`` seconds."""

    def __init__(self, key: str, retry_after: int) -> None:
        super().__init__("idempotency key %r is in progress; retry after %ds" % (key, retry_after))
        self.retry_after = retry_after


class ConflictError(Exception):
    """``idempotent``: the key was used with different arguments."""


class IdempotencyMetrics:
    """Counters with the names the Go and Node.js adapters use; ``text()``
    renders them in the Prometheus text format."""

    def __init__(self) -> None:
        self.requests: Dict[str, int] = {o: 0 for o in _OUTCOMES}
        self.lease_expiries = 0
        self.lease_lost = 0
        self.store_errors: Dict[str, int] = {o: 0 for o in _OPERATIONS}

    def text(self) -> str:
        out = [
            "# HELP backstop_idempotency_requests_total Requests carrying an idempotency key, by outcome: "
            "first_run, replayed, in_progress, conflict, too_large.",
            "# TYPE backstop_idempotency_requests_total counter",
            *('backstop_idempotency_requests_total{outcome="%s"} %d' % (o, self.requests[o]) for o in _OUTCOMES),
            "# HELP backstop_idempotency_lease_expiries_total Keys taken over because their owner's lease ran out "
            "(a crashed or slow request).",
            "# TYPE backstop_idempotency_lease_expiries_total counter",
            "backstop_idempotency_lease_expiries_total %d" % self.lease_expiries,
            "# HELP backstop_idempotency_lease_lost_total Complete or fail refused because the caller no longer "
            "owned its key.",
            "# TYPE backstop_idempotency_lease_lost_total counter",
            "backstop_idempotency_lease_lost_total %d" % self.lease_lost,
            "# HELP backstop_idempotency_store_errors_total Calls to the idempotency store that failed, by "
            "operation: begin, complete, fail.",
            "# TYPE backstop_idempotency_store_errors_total counter",
            *('backstop_idempotency_store_errors_total{operation="%s"} %d' % (o, self.store_errors[o])
              for o in _OPERATIONS),
        ]
        return "\n".join(out) + "\n"


default_metrics = IdempotencyMetrics()


def check_key(key: Any) -> None:
    """Raises ValueError unless key is 1..255 printable ASCII characters."""
    if not isinstance(key, str) or key == "":
        raise ValueError("idempotency key must be a non-empty string, got %r" % (key,))
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError("idempotency key must be at most %d bytes, got %d" % (MAX_KEY_LENGTH, len(key)))
    if not _PRINTABLE.match(key):
        raise ValueError("idempotency key must be printable ASCII, got %r" % (key,))


def fingerprint(method: str, path: Union[str, bytes], body: bytes) -> str:
    """SHA-256 (hex) of method, "\\n", path, "\\n", body: the request hash every adapter stores."""
    h = hashlib.sha256(("%s\n" % method).encode())
    h.update(path if isinstance(path, bytes) else path.encode())
    h.update(b"\n")
    h.update(body)
    return h.hexdigest()


def request_hash(request: Mapping[str, Any], body: bytes) -> str:
    """The request hash of an ASGI scope or a WSGI environ: its path with
    every %XX escape decoded to its byte, as Go's ``r.URL.Path``, so every
    adapter hashes a request alike (testdata/idempotency/requests.json).

    ASGI: from ``raw_path`` when the server gives it (``path`` is already
    decoded, as UTF-8). WSGI: from the raw target when the server gives it
    (``RAW_URI``, gunicorn; ``REQUEST_URI``, waitress and uWSGI), else from
    ``SCRIPT_NAME`` + ``PATH_INFO``, which the server decoded (wsgiref
    decodes every escape, ``%2F`` included, as Go does; a server that keeps
    ``%2F`` there hashes ``/a%2Fb`` apart from the other languages)."""
    if "REQUEST_METHOD" in request:
        raw = request.get("RAW_URI") or request.get("REQUEST_URI")
        if raw:
            target = raw.split("?", 1)[0]
            if not target.startswith("/") and "://" in target:  # absolute-form: its path
                target = "/" + target.split("://", 1)[1].partition("/")[2]
            path = unquote_to_bytes(_wsgi_bytes(target))
        else:
            path = _wsgi_bytes(request.get("SCRIPT_NAME", "") + request.get("PATH_INFO", ""))
        return fingerprint(request["REQUEST_METHOD"], path, body)
    raw = request.get("raw_path")
    if raw:
        path = unquote_to_bytes(bytes(raw).split(b"?", 1)[0])
    else:
        path = request["path"].encode("utf-8", "surrogateescape")
    return fingerprint(request["method"], path, body)


def default_release(status: int) -> bool:
    """The policy's retryable statuses (408, 429, 502, 503, 504): such a
    response releases the key instead of being stored."""
    return status in (408, 429, 502, 503, 504)


# An RFC 9110 token: what a header name may be.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
# Names already logged as dropped (bounded: hostile names must not grow it).
_dropped: Set[bytes] = set()
_DROPPED_LOGGED = 1000


_BLANK = (0x20, 0x09)


def _safe_header(name: Union[str, bytes], value: Union[str, bytes]) -> Optional[Tuple[str, str]]:
    """The one header rule every store and replayer applies (Go
    ``idempotency.SafeHeader``, Node ``safeHeader``): None when name is not
    an RFC 9110 token (the header is dropped), else (name, value) with value
    ASCII only. The value's bytes (a str is UTF-8-encoded; bytes, as ASGI
    gives them, are taken as they are) are trimmed of leading and trailing
    spaces and tabs; then each byte outside 0x21..0x7E is written ``%XX``
    (uppercase hex), except a single space or tab (between two bytes that
    are neither, as Go's rule has it): ``/orders/€42`` becomes ``/orders/%E2%82%AC42``, CR LF ``%0D%0A``.
    A visible ASCII value is unchanged (``%`` is not escaped), so applying
    the rule twice gives the same value."""
    n = _utf8(name)
    if not _TOKEN.match(n):
        return None
    v = _utf8(value).strip(b" \t")
    last = len(v) - 1
    out = "".join(
        chr(b) if 0x21 <= b <= 0x7E
        or (b in _BLANK and 0 < i < last and v[i - 1] not in _BLANK and v[i + 1] not in _BLANK)
        else "%%%02X" % b
        for i, b in enumerate(v))
    return n.decode("ascii"), out


def _utf8(s: Union[str, bytes]) -> bytes:
    """s as bytes: a str UTF-8-encoded, a lone surrogate (JSON allows one)
    as U+FFFD, as Go's and JavaScript's decoders give it."""
    if not isinstance(s, str):
        return bytes(s)
    try:
        return s.encode()
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in s).encode()


def _stored_pairs(headers: Any) -> Iterable[Tuple[str, str]]:
    """The (name, value) pairs of a record's headers as any language stored
    them (an object of lists of strings); anything else in it is skipped."""
    if not isinstance(headers, dict):
        return
    for k, vs in headers.items():
        for v in vs if isinstance(vs, list) else [vs]:
            if isinstance(v, str):
                yield k, v


def _safe_headers(headers: Iterable[Tuple[Union[str, bytes], Union[str, bytes]]], canonical: bool = False,
                  logged: bool = False) -> Dict[str, List[str]]:
    """(name, value) pairs through ``_safe_header``, grouped by name (in Go's
    canonical form when canonical); a dropped name is logged once when logged."""
    out: Dict[str, List[str]] = {}
    for k, v in headers:
        h = _safe_header(k, v)
        if h is None:
            raw = _utf8(k)
            if logged and raw not in _dropped and len(_dropped) < _DROPPED_LOGGED:
                _dropped.add(raw)
                log.warning("idempotency: header not stored, its name is not an RFC 9110 token: name=%r", raw)
            continue
        out.setdefault(_canonical(h[0]) if canonical else h[0], []).append(h[1])
    return out


@dataclass(frozen=True)
class StoredResponse:
    """A response as the store keeps it: status, headers (name to values;
    stored and replayed through ``_safe_header``), body, ``too_large`` (over
    ``max_body``: not kept, never replayed) and ``truncated`` (the client
    left before the response ended: body is what was captured; replayed
    like any other, never run again)."""

    status: int
    headers: Dict[str, List[str]] = field(default_factory=dict)
    body: bytes = b""
    too_large: bool = False
    truncated: bool = False


@dataclass(frozen=True)
class Claim:
    """What ``begin`` found: state is ``started`` (token, taken_over),
    ``in_progress`` (retry_after, seconds), ``conflict`` or ``completed``
    (response)."""

    state: str
    token: str = ""
    taken_over: bool = False
    retry_after: int = 0
    response: Optional[StoredResponse] = None


def _ms(name: str, v: Duration) -> int:
    ms = int(v.total_seconds() * 1000) if isinstance(v, timedelta) else int(v * 1000)
    if ms < 1:
        raise ValueError("%s must be at least 1 ms, got %r" % (name, v))
    return ms


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class _Options:
    """What every store (Redis, PostgreSQL) is built with: the lease, the
    retention, the largest body kept, the counters. ``_transient`` are the
    errors of its client: a store call that raises one after the handler ran
    is tried again while the lease lasts."""

    _transient: Tuple[type, ...] = ()

    def __init__(self, *, lease: Duration = 30, retention: Duration = timedelta(days=1), max_body: int = 1 << 20,
                 metrics: Optional[IdempotencyMetrics] = None) -> None:
        self._lease, self._retention = _ms("lease", lease), _ms("retention", retention)
        if self._retention < self._lease:
            raise ValueError("retention must be at least the lease (%d ms), got %d ms" % (self._lease, self._retention))
        if not isinstance(max_body, int) or max_body < 0:
            raise ValueError("max_body must be a whole number >= 0, got %r" % (max_body,))
        self.max_body = max_body
        self.metrics = metrics if metrics is not None else default_metrics

    def _lease_end(self) -> float:
        """When a lease taken now ends, on the monotonic clock: the bound of
        the retries of complete and fail."""
        return time.monotonic() + self._lease / 1000


class _Base(_Options):
    _transient = (redis.RedisError,) if redis is not None else ()

    def __init__(self, client: Any, *, prefix: str = "idem", **options: Any) -> None:
        if not isinstance(prefix, str) or prefix == "" or "{" in prefix or "}" in prefix:
            raise ValueError("prefix must be a non-empty string without braces, got %r" % (prefix,))
        super().__init__(**options)
        self.client, self.prefix = client, prefix
        self._script = client.register_script(_script_source())

    def record_key(self, scope: str, key: str) -> str:
        """The Redis key of key within scope: ``<prefix>:{<scope>:<key>}``, one hash tag."""
        return "%s:{%s:%s}" % (self.prefix, scope, key)

    def _begin_args(self, key: str, request: str):
        check_key(key)
        token = secrets.token_hex(16)
        return token, ["begin", token, request, str(self._lease), str(self._retention)]

    def _claim(self, key: str, token: str, r: Any) -> Claim:
        state = _text(r[0])
        if state == "started":
            if int(r[1]) == 1:
                self.metrics.lease_expiries += 1
            return Claim("started", token=token, taken_over=int(r[1]) == 1)
        if state == "in_progress":
            return Claim("in_progress", retry_after=int(r[1]))
        if state == "conflict":
            return Claim("conflict")
        if state == "completed":
            h = r[2].decode("utf-8", "replace") if isinstance(r[2], bytes) else str(r[2])
            try:
                headers = json.loads(h) if h else {}
            except ValueError:
                headers = None
                log.warning("idempotency: the stored headers of key %r are not JSON, replayed without them", key)
            # Stored by any language, maybe before the header rule: applied again.
            return Claim("completed", response=StoredResponse(
                status=int(_text(r[1])), headers=_safe_headers(_stored_pairs(headers)),
                body=base64.b64decode(_text(r[3])), too_large=int(r[4]) == 1, truncated=len(r) > 5 and int(r[5]) == 1))
        self.metrics.store_errors["begin"] += 1
        raise redis.RedisError("idempotency: begin %r: unexpected reply %r" % (key, r))

    def _complete_args(self, token: str, response: StoredResponse) -> List[str]:
        large = response.too_large or len(response.body) > self.max_body
        headers = _safe_headers(((k, v) for k, vs in (response.headers or {}).items() for v in vs), logged=True)
        return ["complete", token, str(response.status),
                "" if large else json.dumps(headers, separators=(",", ":")),
                "" if large else base64.b64encode(response.body).decode(), "1" if large else "0", str(self._retention),
                "1" if response.truncated else "0"]

    def _error(self, op: str, key: str, e: Exception) -> Exception:
        if "backstop idempotency: lease lost" in str(e):
            self.metrics.lease_lost += 1
            return LeaseLostError("idempotency: %s %r: %s" % (op, key, e))
        self.metrics.store_errors[op] += 1
        return e


class _SyncSettle:
    """The sync stores' completion after a handler: a first try here, then
    the process's settler threads while the store fails."""

    _transient: Tuple[type, ...]
    complete: Callable[..., None]
    fail: Callable[..., None]

    def _settle(self, scope: str, key: str, token: str, response: Optional[StoredResponse],
                lease_end: float) -> Optional[Exception]:
        """complete (response) or fail (None), tried once here; if the store
        failed, tried again by the process's settler while the lease lasts.
        Returns the first try's error (None when it was done)."""
        call = functools.partial(self.complete, scope, key, token, response) if response is not None else \
            functools.partial(self.fail, scope, key, token)
        op = "fail" if response is None else "complete"
        try:
            call()
            return None
        except LeaseLostError as e:
            return e
        except self._transient as e:
            _retry_sync(op, key, call, lease_end, e, self._transient)
            return e


class IdempotencyStore(_SyncSettle, _Base):
    """The store over a synchronous ``redis.Redis`` or ``redis.RedisCluster``.
    ``lease`` and ``retention`` are a ``timedelta`` or seconds (defaults 30 s
    and one day); a body over ``max_body`` bytes (1 MiB) is recorded as too
    large to replay."""

    def _run(self, op: str, key: str, args: List[str]) -> Any:
        rk = key
        try:
            return self._script(keys=[rk], args=args)
        except redis.RedisError as e:
            raise self._error(op, rk, e) from e

    def begin(self, scope: str, key: str, request: str) -> Claim:
        """Claims key within scope for a request whose hash is request."""
        token, args = self._begin_args(key, request)
        return self._claim(key, token, self._run("begin", self.record_key(scope, key), args))

    def complete(self, scope: str, key: str, token: str, response: StoredResponse) -> None:
        """Stores response as the key's; only the owner may (else LeaseLostError)."""
        self._run("complete", self.record_key(scope, key), self._complete_args(token, response))

    def fail(self, scope: str, key: str, token: str) -> None:
        """Releases the key so that a retry may run; only the owner may (else LeaseLostError)."""
        self._run("fail", self.record_key(scope, key), ["fail", token])


class _AsyncSettle:
    """The asyncio stores' completion after a handler: a task of its own,
    tried again while the store fails; ``drain`` waits for those tasks."""

    _transient: Tuple[type, ...]
    _pending: Set["asyncio.Future[None]"]
    complete: Callable[..., Any]
    fail: Callable[..., Any]

    def _settle(self, scope: str, key: str, token: str, response: Optional[StoredResponse],
                lease_end: float) -> "asyncio.Future[Optional[Exception]]":
        """complete (response) or fail (None) in a task of its own, never the
        caller's: a request or handler task cancelled meanwhile does not
        cancel the store call. The future returned resolves after the first
        try, to its error (None when it was done); while the store fails, the
        task tries again until the lease ends (``drain`` awaits it)."""
        first: "asyncio.Future[Optional[Exception]]" = asyncio.get_running_loop().create_future()
        op = "fail" if response is None else "complete"

        def call() -> Any:
            return self.complete(scope, key, token, response) if response is not None else self.fail(scope, key, token)

        def answer(e: Optional[Exception]) -> None:
            if not first.done():
                first.set_result(e)

        async def attempt() -> Optional[Exception]:
            try:
                await call()
                return None
            except (LeaseLostError,) + self._transient as e:
                return e

        async def run() -> None:
            e = await attempt()
            answer(e)
            if e is not None and not isinstance(e, LeaseLostError):
                steps = _retries(op, key, lease_end, e)
                try:
                    pause = next(steps)
                    while True:
                        await asyncio.sleep(pause)
                        pause = steps.send(await attempt())
                except StopIteration:
                    pass

        task = asyncio.ensure_future(run())
        self._pending.add(task)

        def done(t: "asyncio.Future[None]") -> None:
            self._pending.discard(t)
            if not t.cancelled() and t.exception() is not None:
                answer(t.exception())  # a bug, not the store: said, never lost
                log.error("idempotency: %s of key %r failed: %r", op, key, t.exception())

        task.add_done_callback(done)
        return first

    async def drain(self) -> None:
        """Waits for the store calls the middleware and ``idempotent`` still
        try again in the background (each ends with its key's lease at the
        latest): call it at shutdown, after the server stopped."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)


class AsyncIdempotencyStore(_AsyncSettle, _Base):
    """``IdempotencyStore`` for asyncio, over ``redis.asyncio``: the same methods, as coroutines."""

    def __init__(self, client: Any, **options: Any) -> None:
        super().__init__(client, **options)
        self._pending: Set["asyncio.Future[None]"] = set()

    async def _run(self, op: str, key: str, args: List[str]) -> Any:
        try:
            return await self._script(keys=[key], args=args)
        except redis.RedisError as e:
            raise self._error(op, key, e) from e

    async def begin(self, scope: str, key: str, request: str) -> Claim:
        token, args = self._begin_args(key, request)
        return self._claim(key, token, await self._run("begin", self.record_key(scope, key), args))

    async def complete(self, scope: str, key: str, token: str, response: StoredResponse) -> None:
        await self._run("complete", self.record_key(scope, key), self._complete_args(token, response))

    async def fail(self, scope: str, key: str, token: str) -> None:
        await self._run("fail", self.record_key(scope, key), ["fail", token])

# The retries of complete and fail: 10 ms doubling, jittered, at most a
# second apart, never past the lease.
_FIRST_PAUSE, _MAX_PAUSE = 0.01, 1.0


def _pauses(lease_end: float) -> Iterable[float]:
    """The pauses before each retry of a store call, until lease_end (on the
    monotonic clock): 10 ms doubling, each drawn in [d/2, d], at most a
    second; the last one ends at lease_end."""
    d = _FIRST_PAUSE
    while True:
        left = lease_end - time.monotonic()
        if left <= 0:
            return
        yield min(d / 2 + random.random() * d / 2, left)
        d = min(d * 2, _MAX_PAUSE)


def _retries(op: str, key: str, lease_end: float, last: Exception) -> Generator[float, Optional[Exception], None]:
    """The retries of a store call whose first try failed with last, as
    steps (the sync and asyncio drivers sleep and try): yields each pause,
    is sent each try's error (None when it was done), and logs the outcome."""
    log.warning("idempotency: %s of key %r failed, trying again while its lease lasts: %s", op, key, last)
    for pause in _pauses(lease_end):
        e = yield pause
        if e is None:
            log.info("idempotency: %s of key %r done after the store failed", op, key)
            return
        if isinstance(e, LeaseLostError):
            # That try may have landed (its reply was lost), or the lease ran
            # out and another request took the key over.
            log.warning("idempotency: %s of key %r refused after the store failed (an earlier try may have "
                        "landed): %s", op, key, e)
            return
        last = e
    # The documented outcome when the store stays down for the whole lease:
    # the key is still in progress, and a retry after the lease runs again.
    log.error("idempotency: %s of key %r not stored, the key may run again once its lease ends: %s", op, key, last)


def _retry_sync(op: str, key: str, call: Callable[[], None], lease_end: float, first: Exception,
                transient: Tuple[type, ...]) -> None:
    """Hands a sync store call whose first try failed to the process's
    settler, which drives its ``_retries``."""
    def attempt() -> Optional[Exception]:
        try:
            call()
            return None
        except (LeaseLostError,) + transient as e:
            return e

    _SETTLER.add(_retries(op, key, lease_end, first), attempt)


class _Settler:
    """The retries of the sync stores' complete and fail, for the whole
    process: a few daemon threads over one schedule. A store outage under
    load then holds at most ``threads`` threads, not one per request (a
    thread each ran out of threads, and the next one raised in the request
    that started it)."""

    def __init__(self, threads: int = 4) -> None:
        self._max = threads
        self._reset()
        if hasattr(os, "register_at_fork"):
            # A forked child (a pre-forking server) has none of the parent's
            # threads: it starts its own.
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._due: List[Tuple[float, int, Generator[float, Optional[Exception], None], Callable[[], Optional[Exception]]]] = []
        self._seq = 0
        self._threads = 0

    def add(self, steps: Generator[float, Optional[Exception], None], attempt: Callable[[], Optional[Exception]]) -> None:
        """Schedules steps (a ``_retries``), each try made by attempt."""
        try:
            pause = next(steps)
        except StopIteration:
            return
        self._push(pause, steps, attempt)

    def _push(self, pause: float, steps: Generator[float, Optional[Exception], None],
              attempt: Callable[[], Optional[Exception]]) -> None:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._due, (time.monotonic() + pause, self._seq, steps, attempt))
            if self._threads < self._max:
                try:
                    threading.Thread(target=self._run, name="backstop-idempotency-settle", daemon=True).start()
                    self._threads += 1
                except RuntimeError as e:
                    # Out of threads: not the request's error, and not counted
                    # (a thread already running, or a later push's, takes it).
                    log.warning("idempotency: no thread for the store's retries yet: %s", e)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._cond.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, steps, attempt = heapq.heappop(self._due)
            try:
                pause = steps.send(attempt())
            except StopIteration:
                continue
            except Exception:  # noqa: BLE001 - a call's own bug must not end the thread the others share
                log.exception("idempotency: a store call's retry raised")
                continue
            self._push(pause, steps, attempt)


_SETTLER = _Settler()


class TooLargeError(Exception):
    """``idempotent``: the first call's result was over ``max_body`` and was
    not kept; it cannot be replayed."""


@dataclass(frozen=True)
class _Answer:
    """A response the middleware gives itself, never the app's: headers as
    (name, value) text; fallback, the headers to send instead should the
    server refuse them (a replay: the marker alone)."""

    status: int
    headers: Tuple[Tuple[str, str], ...]
    body: bytes
    fallback: Optional[Tuple[Tuple[str, str], ...]] = None


_REPLAYED = (REPLAYED_HEADER.lower(), "true")


def _plain(status: int, text: str, *extra: Tuple[str, str]) -> _Answer:
    return _Answer(status, (("content-type", "text/plain; charset=utf-8"), *extra), text.encode())


def _latin1(s: Union[str, bytes]) -> str:
    return s.decode("latin-1") if isinstance(s, (bytes, bytearray)) else s


class _Guard:
    """What both idempotency middlewares (ASGI ``IdempotencyMiddleware``,
    WSGI ``IdempotencyWSGI``) decide, apart from their I/O: which requests
    they guard, the answers they give themselves (counted in the store's
    metrics as Go's middleware counts them) and the response they store."""

    def __init__(self, store: Any, header: str, scope: Optional[Callable[[Any], str]], methods: Sequence[str],
                 stored_headers: Sequence[str], fail_open: bool, release: Callable[[int], bool],
                 max_request_body: int) -> None:
        if not isinstance(max_request_body, int) or max_request_body < 0:
            raise ValueError("max_request_body must be a whole number >= 0, got %r" % (max_request_body,))
        self.store, self.header = store, header
        self._scope = scope or (lambda s: "")
        self.methods, self.fail_open, self.release, self.max_request_body = tuple(methods), fail_open, release, max_request_body
        self._stored = {h.lower() for h in stored_headers}

    def refused_key(self, key: str) -> Optional[_Answer]:
        """400 when key is not a valid idempotency key."""
        try:
            check_key(key)
        except ValueError as e:
            return _plain(400, "%s: %s\n" % (self.header, e))
        return None

    def body_too_large(self) -> _Answer:
        return _plain(413, "idempotency: request body over %d bytes\n" % self.max_request_body)

    def unavailable(self) -> _Answer:
        """The store failed at begin and the middleware fails closed."""
        return _plain(503, "idempotency store unavailable\n", ("retry-after", "1"))

    def answer(self, claim: Claim) -> Optional[_Answer]:
        """The answer to a claim the request did not take (None when it did:
        the app runs), counted."""
        m = self.store.metrics
        if claim.state == "started":
            m.requests["first_run"] += 1
            return None
        if claim.state == "conflict":
            m.requests["conflict"] += 1
            return _plain(422, "%s was used with a different request\n" % self.header)
        if claim.state == "in_progress":
            m.requests["in_progress"] += 1
            return _plain(409, "a request with this %s is in progress\n" % self.header,
                          ("retry-after", str(claim.retry_after)))
        r = claim.response
        assert r is not None
        if r.too_large:
            m.requests["too_large"] += 1
            return _plain(500, "idempotency: the first response to this key was too large to store; "
                               "it cannot be replayed\n", _REPLAYED)
        m.requests["replayed"] += 1
        # Went through the header rule (_claim): ASCII.
        headers = tuple((k.lower(), v) for k, vs in r.headers.items() for v in vs)
        return _Answer(r.status, headers + (_REPLAYED,), r.body, fallback=(_REPLAYED,))

    def stored(self, status: int, headers: Iterable[Tuple[Union[str, bytes], Union[str, bytes]]], body: bytes,
               truncated: bool = False) -> StoredResponse:
        """The response as it is stored: the stored headers only (header
        values as bytes, the header rule applied)."""
        kept = _safe_headers(((k, v) for k, v in headers if _latin1(k).lower() in self._stored),
                             canonical=True, logged=True)
        return StoredResponse(status, kept, body, truncated=truncated)


def _asgi_answer(a: _Answer, headers: Optional[Tuple[Tuple[str, str], ...]] = None) -> Dict[str, Any]:
    return {"type": "http.response.start", "status": a.status,
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (a.headers if headers is None else headers)]}


class IdempotencyMiddleware:
    """ASGI middleware (FastAPI, Starlette: ``app.add_middleware(
    IdempotencyMiddleware, store=store)``) over an ``AsyncIdempotencyStore``:
    a request with an ``Idempotency-Key`` runs once; a retry with the same
    key and request gets the first response (marked ``Idempotent-Replayed:
    true``), the same key with another request 422, a duplicate while the
    first runs 409 and ``Retry-After``. ``scope`` (a function of the ASGI
    scope) sets the scope of keys (per user, per route); Redis unreachable
    gives 503 unless ``fail_open``.

    The response is held until the store has it; the store call runs in a
    task of its own, tried again while the key's lease lasts (the client is
    answered after the first try). A client that leaves mid-response leaves
    the record completed with what was captured, marked truncated: a retry
    replays it and the app never runs twice. Stored and replayed headers go
    through ``_safe_header``; a replay the server still refuses is sent
    without them. ``IdempotencyWSGI`` is the same for WSGI."""

    def __init__(self, app: Any, store: AsyncIdempotencyStore, *, header: str = "Idempotency-Key",
                 scope: Optional[Callable[[Dict[str, Any]], str]] = None, methods: Sequence[str] = ("POST", "PATCH"),
                 stored_headers: Sequence[str] = ("content-type", "location"), fail_open: bool = False,
                 release: Callable[[int], bool] = default_release, max_request_body: int = 1 << 20) -> None:
        if not isinstance(store, _AsyncSettle):
            raise TypeError("IdempotencyMiddleware needs an asyncio store: AsyncIdempotencyStore (redis.asyncio) or "
                            "AsyncPostgresIdempotencyStore (IdempotencyWSGI takes the sync stores)")
        self.app, self.store = app, store
        self._guard = _Guard(store, header, scope, methods, stored_headers, fail_open, release, max_request_body)
        self._name = header.lower().encode()

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        g = self._guard
        if scope["type"] != "http" or scope["method"] not in g.methods:
            return await self.app(scope, receive, send)
        raw = [v for k, v in scope["headers"] if k.lower() == self._name]
        if not raw:
            return await self.app(scope, receive, send)
        key = raw[0].decode("latin-1")

        async def reply(a: _Answer) -> None:
            try:
                await send(_asgi_answer(a))
            except Exception as e:  # noqa: BLE001 - whatever the server raised for a header it refuses
                if a.fallback is None:
                    raise
                log.warning("idempotency: the server refused the stored headers, replayed without them: %r", e)
                await send(_asgi_answer(a, a.fallback))
            await send({"type": "http.response.body", "body": a.body})

        refused = g.refused_key(key)
        if refused is not None:
            return await reply(refused)
        chunks, more = [], True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
            if sum(map(len, chunks)) > g.max_request_body:
                return await reply(g.body_too_large())
        body = b"".join(chunks)
        sent, gone = False, False

        async def replay_receive() -> Dict[str, Any]:
            nonlocal sent, gone
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            msg = await receive()
            gone = gone or msg["type"] == "http.disconnect"
            return msg

        sc = g._scope(scope)
        lease_end = self.store._lease_end()
        try:
            claim = await self.store.begin(sc, key, request_hash(scope, body))
        except self.store._transient:
            if g.fail_open:
                return await self.app(scope, replay_receive, send)
            return await reply(g.unavailable())
        answer = g.answer(claim)
        if answer is not None:
            return await reply(answer)
        start: Dict[str, Any] = {}
        out: List[bytes] = []
        settled = False

        async def settle(response: Optional[StoredResponse]) -> None:
            # Its own task: the request's cancellation does not reach it. The
            # client (if still there) is answered after the first try; errors
            # are logged and counted by the store.
            nonlocal settled
            settled = True
            await asyncio.shield(self.store._settle(sc, key, claim.token, response, lease_end))

        def captured(truncated: bool = False) -> StoredResponse:
            return g.stored(start["status"], start.get("headers", []), b"".join(out), truncated)

        # Hold the response until the store has it.
        async def capture(msg: Dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                start.update(msg)
                return
            out.append(msg.get("body", b""))
            if msg.get("more_body", False) or settled:
                return
            await settle(None if g.release(start["status"]) else captured())
            await send(start)
            await send({"type": "http.response.body", "body": b"".join(out)})

        try:
            await self.app(scope, replay_receive, capture)
        except BaseException as e:
            if not settled:
                if start and (gone or isinstance(e, asyncio.CancelledError)):
                    # The client left mid-response (a stream cancelled): the
                    # handler's side effect ran, so what was captured is kept.
                    await settle(captured(truncated=True))
                else:
                    # The app failed before its response was stored: a retry may run.
                    await settle(None)
            raise
        if not settled:
            # The app returned before its response ended: a stream stopped by
            # the client's disconnect (Starlette's StreamingResponse), or no
            # response at all (released: the server answers 500).
            await settle(captured(truncated=True) if start else None)
            if start and not gone:
                await send(start)
                await send({"type": "http.response.body", "body": b"".join(out)})


class IdempotencyWSGI:
    """WSGI middleware (Flask: ``app.wsgi_app = IdempotencyWSGI(app.wsgi_app,
    store)``; Django: wrap ``get_wsgi_application()``; any WSGI app) over a
    sync store, ``IdempotencyStore`` (Redis) or ``PostgresIdempotencyStore``:
    the answers of ``IdempotencyMiddleware`` (ASGI) and Go's middleware, with
    the same options. A request with an ``Idempotency-Key`` runs once; a
    retry with the same key and request gets the first response (marked
    ``Idempotent-Replayed: true``), another request under the key 422, a
    duplicate while the first runs 409 and ``Retry-After``; a release status
    or an app that raises releases the key. ``scope`` is a function of the
    WSGI environ.

    The request body is read first (at most ``max_request_body`` bytes,
    else 413) and handed to the app as ``wsgi.input``. The whole response is
    held until the store has it: the app runs to its end and its record is
    completed (the first try here, then the store's retries while the lease
    lasts) before a byte reaches the client, so a client that went away
    never makes the app run twice. The request hash is the one every
    language computes from the raw target when the server gives it
    (``RAW_URI``, gunicorn; ``REQUEST_URI``, waitress and uWSGI), else from
    ``SCRIPT_NAME`` + ``PATH_INFO`` (see ``request_hash``)."""

    def __init__(self, app: Callable[..., Iterable[bytes]], store: Any, *, header: str = "Idempotency-Key",
                 scope: Optional[Callable[[Dict[str, Any]], str]] = None, methods: Sequence[str] = ("POST", "PATCH"),
                 stored_headers: Sequence[str] = ("content-type", "location"), fail_open: bool = False,
                 release: Callable[[int], bool] = default_release, max_request_body: int = 1 << 20) -> None:
        if not isinstance(store, _SyncSettle):
            raise TypeError("IdempotencyWSGI needs a sync store: IdempotencyStore (redis.Redis) or "
                            "PostgresIdempotencyStore (IdempotencyMiddleware takes the asyncio ones)")
        if not callable(app):
            raise TypeError("IdempotencyWSGI: app must be a WSGI application (got %r)" % (app,))
        self.app, self.store = app, store
        self._guard = _Guard(store, header, scope, methods, stored_headers, fail_open, release, max_request_body)
        self._environ_key = "HTTP_" + header.upper().replace("-", "_")

    def __call__(self, environ: Dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        g = self._guard
        key = environ.get(self._environ_key)
        if environ.get("REQUEST_METHOD") not in g.methods or key is None:
            return self.app(environ, start_response)

        def reply(a: _Answer) -> List[bytes]:
            line = "%d %s" % (a.status, _REASONS.get(a.status, "Unknown"))
            try:
                start_response(line, list(a.headers))
            except Exception:  # noqa: BLE001 - whatever the server raised for a header it refuses
                if a.fallback is None:
                    raise
                log.warning("idempotency: the server refused the stored headers, replayed without them",
                            exc_info=True)
                start_response(line, list(a.fallback), sys.exc_info())
            return [a.body]

        refused = g.refused_key(key)
        if refused is not None:
            return reply(refused)
        body, short = _read_body(environ, g.max_request_body)
        if body is None:
            return reply(g.body_too_large())
        if short:
            # The client left mid-body: never run the app on part of a request.
            return reply(_plain(400, "idempotency: the request body ended before its Content-Length\n"))
        # The app reads the body the middleware read.
        environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
        environ["wsgi.input_terminated"] = True
        sc = g._scope(environ)
        lease_end = self.store._lease_end()
        try:
            claim = self.store.begin(sc, key, request_hash(environ, body))
        except self.store._transient:
            if g.fail_open:
                return self.app(environ, start_response)
            return reply(g.unavailable())
        answer = g.answer(claim)
        if answer is not None:
            return reply(answer)

        started: List[Any] = []
        out: List[bytes] = []

        def capture(status: str, headers: List[Tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
            # Nothing is sent before the store has the response: a later call
            # (with exc_info, PEP 3333's error page) replaces the first.
            started[:] = [status, list(headers)]
            return out.append

        try:
            result = self.app(environ, capture)
            try:
                out.extend(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
            if not started:
                raise RuntimeError("IdempotencyWSGI: the application returned without calling start_response")
        except BaseException:
            # The app failed before its response was stored: a retry may run.
            self.store._settle(sc, key, claim.token, None, lease_end)
            raise
        status, headers = started
        code, data = int(status.split(None, 1)[0]), b"".join(out)
        # Header values are latin-1 text standing for bytes (PEP 3333).
        stored = None if g.release(code) else g.stored(code, ((k, _wsgi_bytes(v)) for k, v in headers), data)
        self.store._settle(sc, key, claim.token, stored, lease_end)
        start_response(status, headers)
        return [data]


_REASONS = {400: "Bad Request", 409: "Conflict", 413: "Content Too Large", 422: "Unprocessable Content",
            500: "Internal Server Error", 503: "Service Unavailable"}


def _wsgi_bytes(s: str) -> bytes:
    """A WSGI string's bytes: latin-1, as PEP 3333 has it (a character
    beyond it, which a server would refuse, as UTF-8)."""
    try:
        return s.encode("latin-1")
    except UnicodeEncodeError:
        return _utf8(s)


def _read_body(environ: Dict[str, Any], limit: int) -> Tuple[Optional[bytes], bool]:
    """The request body from wsgi.input: CONTENT_LENGTH bytes, or (chunked,
    when the server says its input ends: wsgi.input_terminated) up to its
    end; and whether it ended before its CONTENT_LENGTH (the client left).
    None when over limit bytes."""
    stream = environ.get("wsgi.input")
    try:
        length: Optional[int] = int(environ.get("CONTENT_LENGTH") or "")
    except ValueError:
        length = None
    if length is None and not environ.get("wsgi.input_terminated"):
        length = 0  # PEP 3333: without a length, reading is not defined
    if length is not None and length > limit:
        return None, False
    want = limit + 1 if length is None else length
    chunks, got = [], 0
    while stream is not None and got < want:
        chunk = stream.read(min(want - got, 65536))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    if got > limit:
        return None, False
    return b"".join(chunks), length is not None and got < length


def _canonical(name: str) -> str:
    """Content-Type, as Go's http.CanonicalHeaderKey writes it."""
    return "-".join(p[:1].upper() + p[1:].lower() for p in name.split("-"))


def _once_answer(m: IdempotencyMetrics, key: str, claim: Claim, what: str = "request") -> bytes:
    """What ``idempotent`` and ``once_tx`` give for a claim they did not
    take: the first call's stored result, or InProgressError, ConflictError
    or TooLargeError; counted in m."""
    if claim.state == "conflict":
        m.requests["conflict"] += 1
        raise ConflictError("idempotency key %r was used with different %s" % (key, what))
    if claim.state == "in_progress":
        m.requests["in_progress"] += 1
        raise InProgressError(key, claim.retry_after)
    assert claim.response is not None
    if claim.response.too_large:
        m.requests["too_large"] += 1
        raise TooLargeError("the first result for idempotency key %r was too large to store" % key)
    m.requests["replayed"] += 1
    return claim.response.body


def idempotent(store: Union[_SyncSettle, _AsyncSettle], key: Callable[..., str], *, scope: str = ""):
    """A decorator for plain functions (a queue worker's handler keyed by the
    job id: a job redelivered after a crash returns its recorded result
    instead of running its side effect again)::

        @idempotent(store, key=lambda job: job.id)
        def charge(job): ...

    The result must be JSON-serialisable; it is stored and returned to every
    later call with the same key and arguments. A call while the first runs
    raises InProgressError, the same key with other arguments ConflictError,
    a stored result over ``max_body`` TooLargeError. An exception releases
    the key (a retry runs again) and propagates. An ``AsyncIdempotencyStore``
    wants a coroutine function.

    The result is stored, or the key released, by a store call of its own (a
    task; the sync store: the settler's threads after a first try here), so a call
    cancelled at a handler deadline still completes or releases its key. A
    store error there is logged and counted, and the call tried again while
    the key's lease lasts; the result is returned after the first try. If
    the store is down for the whole lease, the key may run again (at least
    once). LeaseLostError when fn outlived its lease and another call took
    the key over (its result is not stored)."""

    def request_of(fn: Callable, args: tuple, kwargs: dict) -> str:
        body = json.dumps([args, kwargs], default=repr, sort_keys=True).encode()
        return fingerprint("CALL", fn.__module__ + "." + fn.__qualname__, body)

    def outcome(k: str, claim: Claim) -> Any:
        return json.loads(_once_answer(store.metrics, k, claim, "arguments"))

    def done(result: Any, error: Optional[Exception]) -> Any:
        # A store error is logged, counted and tried again in the background.
        if isinstance(error, LeaseLostError):
            raise error
        return result

    def wrap(fn: Callable) -> Callable:
        if isinstance(store, _AsyncSettle):
            if not inspect.iscoroutinefunction(fn):
                raise TypeError("an asyncio store (AsyncIdempotencyStore) wants a coroutine function")

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                k = key(*args, **kwargs)
                lease_end = store._lease_end()
                claim = await store.begin(scope, k, request_of(fn, args, kwargs))
                if claim.state != "started":
                    return outcome(k, claim)
                store.metrics.requests["first_run"] += 1
                try:
                    result = await fn(*args, **kwargs)
                except BaseException:
                    # fn's error (a cancellation at the deadline included) is
                    # the one callers handle; the release runs in its own
                    # task, tried again while the lease lasts.
                    await asyncio.shield(store._settle(scope, k, claim.token, None, lease_end))
                    raise
                stored = StoredResponse(200, {}, json.dumps(result).encode())
                return done(result, await asyncio.shield(store._settle(scope, k, claim.token, stored, lease_end)))

            return run_async

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            k = key(*args, **kwargs)
            lease_end = store._lease_end()
            claim = store.begin(scope, k, request_of(fn, args, kwargs))
            if claim.state != "started":
                return outcome(k, claim)
            store.metrics.requests["first_run"] += 1
            try:
                result = fn(*args, **kwargs)
            except BaseException:
                store._settle(scope, k, claim.token, None, lease_end)  # as above: fn's error is the one raised
                raise
            stored = StoredResponse(200, {}, json.dumps(result).encode())
            return done(result, store._settle(scope, k, claim.token, stored, lease_end))

        return run

    return wrap
