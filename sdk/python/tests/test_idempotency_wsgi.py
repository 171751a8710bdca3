"""IdempotencyWSGI behind real WSGI servers (wsgiref, threaded; waitress) on
loopback, over a real redis-server and the private PostgreSQL: first run,
replay, 422, 409 with Retry-After, released keys (release statuses, an app
that raises), a too-large response, 413, fail closed or open, a client that
went away (the app runs once), a Redis restarted before complete (retried
while the lease lasts), records other languages stored, the request hash of
every target in testdata/idempotency/requests.json (gunicorn too: its
RAW_URI), the metrics, and the password never shown."""

import asyncio
import base64
import http.client
import json
import logging
import os
import pathlib
import socket
import socketserver
import subprocess
import sys
import threading
import uuid
from urllib.parse import unquote_to_bytes
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import psycopg_pool
import pytest
import redis

from backstop.idempotency import (IdempotencyMetrics, IdempotencyMiddleware, IdempotencyStore, IdempotencyWSGI,
                                  fingerprint, request_hash)
from backstop.idempotency_postgres import PostgresIdempotencyStore
from conftest import RedisServer, _free_port, until
from pgserver import PASSWORD
from test_idempotency import Charges as AsgiCharges, _call, _store as _async_store
from test_idempotency_postgres import pg  # noqa: F401 - the module's private postgres
from test_idempotency_requests import CASES, wrong_hashes
from test_idempotency_servers import HOSTILE

SERVERS = ["wsgiref", "waitress"]


class _Threading(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class Served:
    """app served by wsgiref (a thread per request) or waitress on a
    loopback port, in a thread."""

    def __init__(self, kind, app):
        if kind == "wsgiref":
            self._server = make_server("127.0.0.1", 0, app, server_class=_Threading, handler_class=_Quiet)
            self.port = self._server.server_port
            target = self._server.serve_forever
        else:
            import waitress

            self._server = waitress.create_server(app, host="127.0.0.1", port=0, threads=4)
            self.port = self._server.effective_port
            target = self._server.run
        self.kind = kind
        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    def close(self):
        if self.kind == "wsgiref":
            self._server.shutdown()
            self._server.server_close()
        else:
            self._server.close()
        self._thread.join(10)

    def request(self, key, body=b"10", method="POST", target="/charges", **extra):
        """(status, {lowercased name: value}, body); a broken response raises."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            headers = {"Content-Type": "application/json", **extra}
            if key is not None:
                headers["Idempotency-Key"] = key
            c.request(method, target, body, headers)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()


@pytest.fixture(params=SERVERS)
def serve(request):
    """serve(app) -> Served, closed after the test."""
    served = []

    def start(app):
        served.append(Served(request.param, app))
        return served[-1]

    yield start
    for s in served:
        s.close()


def _store(port, **kw):
    return IdempotencyStore(redis.Redis(port=port), prefix="w" + uuid.uuid4().hex, metrics=IdempotencyMetrics(), **kw)


def _guarded(serve, app, port, **store_options):
    """app behind IdempotencyWSGI over a Redis store of its own, served: (middleware, Served)."""
    mw = IdempotencyWSGI(app, _store(port, **store_options))
    return mw, serve(mw)


def _record(raw, store, key):
    return {k.decode(): v.decode() for k, v in raw.hgetall(store.record_key("", key)).items()}


class Charges:
    """A plain WSGI app: counts its runs; answers 201 (or status(run)) with
    the body it was sent, a stored header, one not stored and Location."""

    def __init__(self, status=201, size=None, location="/charges/1"):
        self.runs, self.status, self.size, self.location = 0, status, size, location
        self.started, self.gate = threading.Event(), None

    def __call__(self, environ, start_response):
        self.runs += 1
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        self.started.set()
        if self.gate is not None:
            self.gate.wait(30)
        status = self.status(self.runs) if callable(self.status) else self.status
        out = b'{"charged":"' + body + b'"}' if self.size is None else b"x" * self.size
        start_response("%d Whatever" % status, [("Content-Type", "application/json"), ("X-Not-Stored", "1"),
                                                ("Location", self.location)])
        return [out]


def test_replay_conflict_bad_key_and_counts(redis_server, serve):
    app = Charges()
    mw, s = _guarded(serve, app, redis_server.port)
    a, b = s.request("k1"), s.request("k1")
    assert (a[0], b[0], a[2], b[2], app.runs) == (201, 201, b'{"charged":"10"}', b'{"charged":"10"}', 1)
    assert "idempotent-replayed" not in a[1] and b[1]["idempotent-replayed"] == "true"
    assert (b[1]["content-type"], b[1]["location"], "x-not-stored" in b[1]) == ("application/json", "/charges/1", False)
    assert s.request("k1", b"99")[0] == 422
    assert s.request("k1", method="PATCH")[0] == 422  # the method is part of the request
    assert s.request(None)[0] == 201 and app.runs == 2
    assert s.request("k1", method="PUT")[0] == 201 and app.runs == 3  # not a guarded method
    assert s.request("k" * 256)[0] == 400 and app.runs == 3
    assert mw.store.metrics.requests == {"first_run": 1, "replayed": 1, "in_progress": 0, "conflict": 2, "too_large": 0}
    assert 'backstop_idempotency_requests_total{outcome="replayed"} 1\n' in mw.store.metrics.text()


def test_in_progress_is_409_with_retry_after(redis_server, serve):
    app = Charges()
    app.gate = threading.Event()
    mw, s = _guarded(serve, app, redis_server.port, lease=20)
    first = []
    t = threading.Thread(target=lambda: first.append(s.request("k2")))
    t.start()
    try:
        until("the first request to run", app.started.is_set, 10)
        status, headers, _ = s.request("k2")
        assert status == 409 and 1 <= int(headers["retry-after"]) <= 20
    finally:
        app.gate.set()
        t.join(30)
    assert first[0][0] == 201 and s.request("k2")[1]["idempotent-replayed"] == "true" and app.runs == 1
    assert mw.store.metrics.requests["in_progress"] == 1


def test_release_statuses_and_an_app_that_raises_release_the_key(redis_server, serve):
    raw = redis.Redis(port=redis_server.port)
    app = Charges(status=lambda run: 503 if run == 1 else 201)
    mw, s = _guarded(serve, app, redis_server.port)
    assert s.request("k3")[0] == 503 and _record(raw, mw.store, "k3") == {}
    assert s.request("k3")[0] == 201 and app.runs == 2
    assert s.request("k3")[1]["idempotent-replayed"] == "true" and app.runs == 2

    runs = []

    def raises(environ, start_response):
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("card declined")
        start_response("201 Created", [("Content-Type", "text/plain")])
        return [b"charged"]

    custom = IdempotencyWSGI(raises, _store(redis_server.port), release=lambda status: status == 201)
    s2 = serve(custom)
    assert s2.request("k4")[0] == 500 and _record(raw, custom.store, "k4") == {}  # the server's error page
    assert s2.request("k4")[0] == 201 and s2.request("k4")[0] == 201 and len(runs) == 3  # 201 released here


def test_too_large_response_and_request(redis_server, serve):
    app = Charges(size=2000)
    mw = IdempotencyWSGI(app, _store(redis_server.port, max_body=1000), max_request_body=10)
    s = serve(mw)
    first = s.request("k5")
    assert (first[0], len(first[2])) == (201, 2000)
    again = s.request("k5")
    assert (again[0], again[1]["idempotent-replayed"], app.runs) == (500, "true", 1)
    assert mw.store.metrics.requests["too_large"] == 1
    assert s.request("k6", b"x" * 11)[0] == 413 and app.runs == 1


def test_store_down_at_begin_fails_closed_or_open(tmp_path, serve):
    down = RedisServer(tmp_path)
    port = down.port
    down.stop()
    app = Charges()
    status, headers, _ = serve(IdempotencyWSGI(app, _store(port))).request("k7")
    assert (status, headers["retry-after"], app.runs) == (503, "1", 0)
    assert serve(IdempotencyWSGI(app, _store(port), fail_open=True)).request("k7")[0] == 201 and app.runs == 1


def test_a_client_that_went_away_does_not_run_the_app_twice(redis_server, serve):
    raw = redis.Redis(port=redis_server.port)
    app = Charges()
    app.gate = threading.Event()
    mw, s = _guarded(serve, app, redis_server.port)
    c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    c.sendall(b"POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: gone\r\nContent-Length: 2\r\n\r\n10")
    until("the app to run", app.started.is_set, 10)
    c.close()  # the client timed out: the charge is under way
    app.gate.set()
    until("the record to be completed", lambda: _record(raw, mw.store, "gone").get("state") == "completed", 15)
    status, headers, body = s.request("gone")
    assert (status, body, headers["idempotent-replayed"], app.runs) == (201, b'{"charged":"10"}', "true", 1)


def test_redis_restarted_before_complete_is_retried_while_the_lease_lasts(tmp_path, serve):
    down = RedisServer(tmp_path, "--appendonly", "yes", "--appendfsync", "always")
    raw = redis.Redis(port=down.port)

    class StopsRedis(Charges):
        def __call__(self, environ, start_response):
            if self.runs == 0:
                down.stop()  # Redis goes away while the app runs
            return super().__call__(environ, start_response)

    app = StopsRedis()
    mw = IdempotencyWSGI(app, _store(down.port))
    s = serve(mw)
    try:
        assert s.request("r")[0] == 201  # answered after the first try of complete (failed)
        down.start()
        until("the record to be completed", lambda: _record(raw, mw.store, "r").get("state") == "completed", 20)
        status, headers, body = s.request("r")
        assert (status, body, headers["idempotent-replayed"], app.runs) == (201, b'{"charged":"10"}', "true", 1)
        assert mw.store.metrics.store_errors["complete"] >= 1
    finally:
        down.stop()


def test_records_other_languages_stored_replay_with_safe_headers(redis_server, serve):
    raw = redis.Redis(port=redis_server.port)
    app = Charges()
    mw, s = _guarded(serve, app, redis_server.port)
    wrong = {}
    for name, stored, want in HOSTILE:
        raw.hset(mw.store.record_key("", name), mapping={
            "state": "completed", "request": fingerprint("POST", "/charges", b"10"), "status": "201",
            "headers": json.dumps(dict(stored, **{"Content-Type": ["application/json"]}), ensure_ascii=False),
            "body": base64.b64encode(b'{"charged":true}').decode(), "too_large": "0"})
        try:
            status, h, body = s.request(name)
        except (OSError, http.client.HTTPException) as e:
            wrong[name] = repr(e)
            continue
        got = {"status": status, "body": body, "replayed": h.get("idempotent-replayed"), **{k: h.get(k) for k in want}}
        if got != {"status": 201, "body": b'{"charged":true}', "replayed": "true", **want}:
            wrong[name] = got
    assert wrong == {} and app.runs == 0


def test_header_bytes_are_stored_as_bytes(redis_server, serve):
    raw = redis.Redis(port=redis_server.port)
    # A WSGI header value is latin-1 text standing for its bytes (PEP 3333).
    app = Charges(location="/orders/\u20ac42".encode().decode("latin-1"))
    mw, s = _guarded(serve, app, redis_server.port)
    assert s.request("b")[0] == 201
    assert json.loads(_record(raw, mw.store, "b")["headers"]) == {
        "Content-Type": ["application/json"], "Location": ["/orders/%E2%82%AC42"]}
    assert s.request("b")[1]["location"] == "/orders/%E2%82%AC42" and app.runs == 1


@pytest.mark.parametrize("c", CASES, ids=lambda c: c["target"])
def test_request_hash_from_environ(c):
    body = base64.b64decode(c["body_b64"])
    path, _, query = c["target"].partition("?")
    for raw in ("RAW_URI", "REQUEST_URI"):
        env = {"REQUEST_METHOD": c["method"], "PATH_INFO": "ignored", raw: c["target"]}
        assert request_hash(env, body) == c["request"], raw
    absolute = {"REQUEST_METHOD": c["method"], "REQUEST_URI": "http://example.test:8080" + c["target"]}
    assert request_hash(absolute, body) == c["request"]
    # No raw target: PATH_INFO as a server decoded it (latin-1 text), under a SCRIPT_NAME.
    decoded = unquote_to_bytes(path).decode("latin-1")
    env = {"REQUEST_METHOD": c["method"], "SCRIPT_NAME": decoded[:1], "PATH_INFO": decoded[1:], "QUERY_STRING": query}
    assert request_hash(env, body) == c["request"]


def test_the_middleware_stores_each_targets_hash(redis_server, serve):
    mw = IdempotencyWSGI(Charges(), _store(redis_server.port))
    assert wrong_hashes(serve(mw).port, redis.Redis(port=redis_server.port), mw.store) == {}


def test_postgres_store(pg, serve, caplog):  # noqa: F811 - the fixture imported above
    """Over PostgresIdempotencyStore: replay, 422, 409; a store it cannot
    reach (a wrong password) gives 503 and never shows the password."""
    caplog.set_level(logging.DEBUG)
    with psycopg_pool.ConnectionPool(pg.url, min_size=1, max_size=4, open=True) as pool:
        app = Charges()
        mw = IdempotencyWSGI(app, PostgresIdempotencyStore(pool, metrics=IdempotencyMetrics()),
                             scope=lambda environ: environ.get("HTTP_X_TENANT", ""))
        s = serve(mw)
        key = "pg-" + uuid.uuid4().hex
        a, b = s.request(key), s.request(key)
        assert (a[0], b[0], b[1]["idempotent-replayed"], b[2], app.runs) == (201, 201, "true", a[2], 1)
        assert s.request(key, b"99")[0] == 422
        app.gate = threading.Event()
        first = []
        t = threading.Thread(target=lambda: first.append(s.request(key + "-slow")))
        app.started.clear()
        t.start()
        try:
            until("the first request to run", app.started.is_set, 10)
            assert s.request(key + "-slow")[:1] == (409,)
        finally:
            app.gate.set()
            t.join(30)
        assert first[0][0] == 201 and app.runs == 2
    wrong = pg.url.replace(PASSWORD, "wrong")
    with psycopg_pool.ConnectionPool(wrong, min_size=0, max_size=1, open=True, timeout=0.5) as bad:
        mw = IdempotencyWSGI(app, PostgresIdempotencyStore(bad, metrics=IdempotencyMetrics()))
        status, headers, body = serve(mw).request("pw")
    assert (status, headers["retry-after"], app.runs) == (503, "1", 2)
    assert PASSWORD.encode() not in body and PASSWORD not in caplog.text


def test_a_streamed_response_is_stored_whole_and_closed(redis_server, serve):
    """A generator app that also uses write(): its parts are held, stored and
    replayed whole; its close() runs. A chunked request body (waitress says
    its input ends: wsgi.input_terminated) is read to its end."""
    runs, closed = [], []

    def streams(environ, start_response):
        runs.append(environ["wsgi.input"].read())
        write = start_response("201 Created", [("Content-Type", "text/plain")])
        write(b"part1,")

        def parts():
            try:
                yield b"part2,"
                yield b"part3"
            finally:
                closed.append(1)
        return parts()

    mw, s = _guarded(serve, streams, redis_server.port)
    a, b = s.request("st"), s.request("st")
    assert (a[0], a[2], b[2], b[1]["idempotent-replayed"], len(runs), closed) == (
        201, b"part1,part2,part3", b"part1,part2,part3", "true", 1, [1])
    if s.kind == "waitress":
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        c.request("POST", "/charges", iter([b"chunk1", b"chunk2"]), {"Idempotency-Key": "chunked"},
                  encode_chunked=True)
        assert c.getresponse().status == 201 and runs[-1] == b"chunk1chunk2"
        c.close()


def test_a_client_that_left_mid_body_does_not_run_the_app(redis_server, serve):
    raw = redis.Redis(port=redis_server.port)
    app = Charges()
    mw, s = _guarded(serve, app, redis_server.port)
    c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    c.sendall(b"POST /charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: half\r\nContent-Length: 10\r\n\r\n10")
    c.shutdown(socket.SHUT_WR)  # the rest of the body never comes
    answer = c.makefile("rb").read()
    c.close()
    if s.kind == "wsgiref":  # waitress reads the whole body itself: it never calls the app
        assert answer.split(b" ", 2)[1] == b"400", answer
    assert app.runs == 0 and _record(raw, mw.store, "half") == {}
    assert s.request("half")[0] == 201 and app.runs == 1  # the whole request runs


def test_behind_gunicorn_the_raw_target_is_hashed(redis_server):
    """gunicorn (its own process, as it runs) gives RAW_URI: every target of
    requests.json is stored with the hash Go computed, and a retry replays."""
    port, prefix = _free_port(), "g" + uuid.uuid4().hex
    env = dict(os.environ, BACKSTOP_REDIS_PORT=str(redis_server.port), BACKSTOP_PREFIX=prefix)
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "--bind", "127.0.0.1:%d" % port, "--workers", "1",
                             "--log-level", "warning", "--pythonpath", str(pathlib.Path(__file__).parent),
                             "wsgi_gunicorn_app:app"], env=env)
    try:
        until("gunicorn to listen on %d" % port, lambda: _listens(port) or proc.poll() is not None, 30)
        assert proc.poll() is None, "gunicorn exited with %s" % proc.returncode
        store = IdempotencyStore(redis.Redis(port=redis_server.port), prefix=prefix)  # its record keys
        assert wrong_hashes(port, redis.Redis(port=redis_server.port), store) == {}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", CASES[0]["target"], base64.b64decode(CASES[0]["body_b64"]), {"Idempotency-Key": "request-0"})
        r = conn.getresponse()
        assert (r.status, r.getheader("Idempotent-Replayed"), r.read()) == (201, "true", CASES[0]["target"].encode())
        conn.close()
    finally:
        proc.terminate()
        proc.wait(10)


def _listens(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_asgi_and_wsgi_answer_and_count_alike(redis_server, serve):
    """The same requests through IdempotencyMiddleware (ASGI) and
    IdempotencyWSGI: the same statuses and the same metrics; keys scoped
    by a function of the request (a tenant's header) stay apart."""
    wsgi_app = Charges(size=2000)
    wsgi = IdempotencyWSGI(wsgi_app, _store(redis_server.port, max_body=1000),
                           scope=lambda environ: environ.get("HTTP_X_TENANT", ""))
    s = serve(wsgi)
    asgi_app = AsgiCharges(size=2000)
    asgi = IdempotencyMiddleware(asgi_app, _async_store(redis_server.port, max_body=1000),
                                 scope=lambda scope: dict(scope["headers"]).get(b"x-tenant", b"").decode())
    steps = [("k1", b"10", "a"), ("k1", b"10", "a"), ("k1", b"99", "a"), ("k1", b"10", "b"), ("k" * 256, b"10", "a")]

    async def through_asgi():
        out = []
        for key, body, tenant in steps:
            out.append((await _call(asgi, key, body, tenant=tenant))[0])
        return out

    got_wsgi = [s.request(key, body, **{"X-Tenant": tenant})[0] for key, body, tenant in steps]
    assert got_wsgi == asyncio.run(through_asgi()) == [201, 500, 422, 201, 400]
    assert (wsgi_app.runs, asgi_app.runs) == (2, 2)
    assert wsgi.store.metrics.text() == asgi.store.metrics.text()
    assert wsgi.store.metrics.requests == {"first_run": 2, "replayed": 0, "in_progress": 0, "conflict": 1,
                                           "too_large": 1}
