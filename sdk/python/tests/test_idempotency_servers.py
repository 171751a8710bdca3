"""IdempotencyMiddleware behind real ASGI servers (uvicorn, hypercorn) and a
real redis-server: records any language stored replay with their headers
made safe (never a 500 or a closed connection), header bytes are stored as
bytes, a streamed response the client leaves is completed as truncated (its
handler runs once), and a Redis restarted between begin and complete still
gets the record completed (its handler runs once)."""

import asyncio
import base64
import http.client
import json
import socket
import threading
import uuid

import pytest
import redis
import redis.asyncio
from starlette.applications import Starlette
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from backstop.idempotency import AsyncIdempotencyStore, IdempotencyMetrics, IdempotencyMiddleware, fingerprint
from conftest import RedisServer, _free_port, until, wait_for

SERVERS = ["uvicorn", "hypercorn"]


class Served:
    """app served by uvicorn or hypercorn on a loopback port, in a thread
    with its own event loop (the one the middleware's store runs on)."""

    def __init__(self, kind: str, app) -> None:
        self.port, self._loop, self._stop = _free_port(), None, None
        if kind == "uvicorn":
            import uvicorn

            self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, lifespan="off",
                                                         log_level="warning"))
            target = self._server.run
        else:
            from hypercorn.asyncio import serve
            from hypercorn.config import Config

            config = Config()
            config.bind = ["127.0.0.1:%d" % self.port]

            async def main():
                self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
                await serve(app, config, shutdown_trigger=self._stop.wait)

            def target():
                asyncio.run(main())

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()
        until("%s to listen on %d" % (kind, self.port), self._listens, 10)

    def _listens(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def close(self) -> None:
        if self._loop is None:
            self._server.should_exit = True
        else:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def post(self, key: str, body: bytes = b"10"):
        """POST /charges with key: (status, [(name, value)], body); any
        broken response raises."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            c.request("POST", "/charges", body, {"Idempotency-Key": key, "Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, r.getheaders(), r.read()
        finally:
            c.close()


def _store(port):
    return AsyncIdempotencyStore(redis.asyncio.Redis(port=port), prefix="t" + uuid.uuid4().hex,
                                 metrics=IdempotencyMetrics(), lease=30)


def _record(raw, store, key):
    return {k.decode(): v.decode() for k, v in raw.hgetall(store.record_key("", key)).items()}


def _headers(pairs):
    return {k.lower(): v for k, v in pairs}


class Charges:
    """A plain ASGI handler: counts its runs, answers 201 with headers (bytes)."""

    def __init__(self, headers=()) -> None:
        self.runs, self.headers = 0, list(headers)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return  # hypercorn's lifespan: not supported, it goes on without
        self.runs += 1
        await receive()
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json"), *self.headers]})
        await send({"type": "http.response.body", "body": b'{"charged":true}'})


# Records as other languages (or Python before the header rule) stored them:
# the JSON object of headers, and what a replay must send instead.
HOSTILE = [
    ("go-snowman", {"Location": ["/charges/\u2603"]}, {"location": "/charges/%E2%98%83"}),
    ("node-e-acute", {"Location": ["/charges/\u00e9"]}, {"location": "/charges/%C3%A9"}),
    ("python-control", {"Location": ["/charges/1\x01"]}, {"location": "/charges/1%01"}),
    ("python-crlf", {"Location": ["/a\r\nSet-Cookie: x=1"]}, {"location": "/a%0D%0ASet-Cookie: x=1"}),
    ("store-api-odd-name", {"X Odd:Name": ["1"], "Location": ["/charges/2"]}, {"location": "/charges/2"}),
]


@pytest.mark.parametrize("kind", SERVERS)
def test_hostile_records_replay_with_safe_headers(redis_server, kind):
    raw = redis.Redis(port=redis_server.port)
    app = Charges()
    mw = IdempotencyMiddleware(app, _store(redis_server.port))
    served = Served(kind, mw)
    wrong = {}  # every record's outcome, not only the first one wrong
    try:
        for name, stored, want in HOSTILE:
            raw.hset(mw.store.record_key("", name), mapping={
                "state": "completed", "request": fingerprint("POST", "/charges", b"10"), "status": "201",
                "headers": json.dumps(dict(stored, **{"Content-Type": ["application/json"]}), ensure_ascii=False),
                "body": base64.b64encode(b'{"charged":true}').decode(), "too_large": "0"})
            for _ in range(2):  # every replay, not only the first
                try:
                    status, headers, body = served.post(name)
                except (OSError, http.client.HTTPException) as e:
                    wrong[name] = repr(e)
                    continue
                h = _headers(headers)
                got = {"status": status, "body": body, "replayed": h.get("idempotent-replayed"),
                       **{k: h.get(k) for k in want}, "odd names": [k for k in h if " " in k or ":" in k]}
                if got != {"status": 201, "body": b'{"charged":true}', "replayed": "true", **want, "odd names": []}:
                    wrong[name] = got
        assert wrong == {} and app.runs == 0
    finally:
        served.close()


@pytest.mark.parametrize("kind", SERVERS)
def test_header_bytes_are_stored_as_bytes(redis_server, kind):
    raw = redis.Redis(port=redis_server.port)
    app = Charges([(b"location", "/orders/\u20ac42".encode())])
    mw = IdempotencyMiddleware(app, _store(redis_server.port))
    served = Served(kind, mw)
    try:
        first = served.post("k")
        assert first[0] == 201
        assert json.loads(_record(raw, mw.store, "k")["headers"]) == {
            "Content-Type": ["application/json"], "Location": ["/orders/%E2%82%AC42"]}
        status, headers, _ = served.post("k")
        assert status == 201 and _headers(headers)["location"] == "/orders/%E2%82%AC42" and app.runs == 1
    finally:
        served.close()


class Stream:
    """A Starlette app whose response streams: one part, then it waits for
    more that never comes (a slow upstream); its side effect counted."""

    def __init__(self) -> None:
        self.runs, self.streamed = 0, threading.Event()
        self.app = Starlette(routes=[Route("/charges", self.charges, methods=["POST"])])

    async def charges(self, request):
        self.runs += 1

        async def parts():
            yield b"part1"
            self.streamed.set()
            await asyncio.Event().wait()
            yield b"never"

        return StreamingResponse(parts(), status_code=201, headers={"Location": "/charges/7"},
                                 media_type="text/plain")


@pytest.mark.parametrize("kind", SERVERS)
def test_stream_the_client_leaves_is_completed_truncated(redis_server, kind):
    raw = redis.Redis(port=redis_server.port)
    app = Stream()
    mw = IdempotencyMiddleware(app.app, _store(redis_server.port))
    served = Served(kind, mw)
    try:
        s = socket.create_connection(("127.0.0.1", served.port), timeout=10)
        s.sendall(b"POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: s\r\nContent-Length: 2\r\n\r\n10")
        until("the handler to stream its first part", app.streamed.is_set, 10)
        s.close()  # the client gives up: the handler's side effect has run
        rec = until("the record to be completed", lambda: _record(raw, mw.store, "s").get("state") == "completed"
                    and _record(raw, mw.store, "s"), 15)
        assert rec["truncated"] == "1" and base64.b64decode(rec["body"]) == b"part1" and rec["status"] == "201"
        status, headers, body = served.post("s")
        h = _headers(headers)
        assert (status, body, h["location"], h["idempotent-replayed"]) == (201, b"part1", "/charges/7", "true")
        assert app.runs == 1
    finally:
        served.close()


@pytest.mark.parametrize("kind", SERVERS)
def test_redis_restarted_between_begin_and_complete(tmp_path, kind):
    # redis.asyncio with its defaults; the record survives the restart (AOF).
    down = RedisServer(tmp_path, "--appendonly", "yes", "--appendfsync", "always")
    raw = redis.Redis(port=down.port)
    stopped = threading.Event()

    class StopsRedis(Charges):
        async def __call__(self, scope, receive, send):
            if scope["type"] == "http" and self.runs == 0:
                down.stop()  # Redis goes away while the handler runs
                stopped.set()
            await super().__call__(scope, receive, send)

    app = StopsRedis()
    mw = IdempotencyMiddleware(app, _store(down.port))
    served = Served(kind, mw)
    try:
        # The client is answered after the first try of complete (failed).
        assert served.post("r")[0] == 201 and stopped.is_set()
        down.start()
        until("the record to be completed", lambda: _record(raw, mw.store, "r").get("state") == "completed", 20)
        status, headers, body = served.post("r")
        assert (status, body, _headers(headers)["idempotent-replayed"]) == (201, b'{"charged":true}', "true")
        assert app.runs == 1 and mw.store.metrics.store_errors["complete"] >= 1
    finally:
        served.close()
        down.stop()
