"""backstop.idempotency's ASGI middleware and decorator against a real
redis-server: one run per key, replays marked, 422 on another body, 409 and
Retry-After while the first runs, too large never replayed, fail closed (or
open) when Redis is gone; a worker's handler keyed by the job id runs its
side effect once."""

import asyncio
import json
import uuid

import pytest
import redis
import redis.asyncio
import redis.retry
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from backstop.idempotency import (AsyncIdempotencyStore, ConflictError, IdempotencyMetrics, IdempotencyMiddleware,
                                  IdempotencyStore, InProgressError, StoredResponse, _safe_header, idempotent)
from conftest import RedisServer, until, until_async, wait_for


def _store(port, client_options=None, **kw):
    client = redis.asyncio.Redis(port=port, **(client_options or {}))
    return AsyncIdempotencyStore(client, prefix="t" + uuid.uuid4().hex, metrics=IdempotencyMetrics(), **kw)


async def _call(app, key, body=b"10", method="POST", tenant=None):
    headers = [(b"content-type", b"application/json")]
    if key is not None:
        headers.append((b"idempotency-key", key.encode()))
    if tenant is not None:
        headers.append((b"x-tenant", tenant.encode()))
    scope = {"type": "http", "method": method, "path": "/charges", "headers": headers}
    msgs = [{"type": "http.request", "body": body, "more_body": False}]
    out = []

    async def receive():
        return msgs.pop(0) if msgs else {"type": "http.disconnect"}

    async def send(m):
        out.append(m)

    await app(scope, receive, send)
    start = out[0]
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, b"".join(m.get("body", b"") for m in out[1:])


class Charges:
    def __init__(self, status=201, size=None, gate=None):
        self.runs, self.status, self.size, self.gate = 0, status, size, gate

    async def __call__(self, scope, receive, send):
        self.runs += 1
        body = (await receive())["body"]
        if self.gate:
            self.gate[0].set()
            await self.gate[1].wait()
        status = self.status(self.runs) if callable(self.status) else self.status
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"x-not-stored", b"1")]})
        await send({"type": "http.response.body", "body": b'{"charged":"' + body + b'"}' if self.size is None else b"x" * self.size})


def test_asgi_replays_conflicts_and_counts(redis_server):
    async def main():
        app = Charges()
        mw = IdempotencyMiddleware(app, _store(redis_server.port))
        a = await _call(mw, "k1")
        b = await _call(mw, "k1")
        assert a[0] == b[0] == 201 and a[2] == b[2] and app.runs == 1
        assert "idempotent-replayed" not in a[1] and b[1]["idempotent-replayed"] == "true"
        assert b[1]["content-type"] == "application/json" and "x-not-stored" not in b[1]
        assert (await _call(mw, "k1", b"99"))[0] == 422
        assert (await _call(mw, None))[0] == 201 and app.runs == 2
        assert (await _call(mw, "k" * 256))[0] == 400
        assert mw.store.metrics.requests == {"first_run": 1, "replayed": 1, "in_progress": 0, "conflict": 1, "too_large": 0}
        assert 'backstop_idempotency_requests_total{outcome="conflict"} 1\n' in mw.store.metrics.text()

    asyncio.run(main())


def test_asgi_duplicate_in_progress_gets_409(redis_server):
    async def main():
        gate = (asyncio.Event(), asyncio.Event())
        app = Charges(gate=gate)
        mw = IdempotencyMiddleware(app, _store(redis_server.port))
        first = asyncio.ensure_future(_call(mw, "k"))
        await gate[0].wait()
        dup = await _call(mw, "k")
        assert dup[0] == 409 and dup[1]["retry-after"] == "30"
        gate[1].set()
        a = await first
        assert (await _call(mw, "k"))[2] == a[2] and app.runs == 1

    asyncio.run(main())


def test_asgi_release_and_too_large(redis_server):
    async def main():
        app = Charges(status=lambda n: 503 if n == 1 else 200, size=2000)
        mw = IdempotencyMiddleware(app, _store(redis_server.port, max_body=1000))
        assert (await _call(mw, "k"))[0] == 503
        big = await _call(mw, "k")
        assert big[0] == 200 and len(big[2]) == 2000
        retry = await _call(mw, "k")
        assert retry[0] == 500 and b"too large" in retry[2] and app.runs == 2

    asyncio.run(main())


def test_asgi_redis_unreachable(tmp_path):
    down = RedisServer(tmp_path)
    port = down.port
    down.stop()

    # One try per call: the server is gone, the client's retries would only wait.
    once = {"retry": Retry(NoBackoff(), 0)}

    async def main():
        closed = IdempotencyMiddleware(Charges(), _store(port, once))
        r = await _call(closed, "k")
        assert r[0] == 503 and r[1]["retry-after"] == "1" and closed.store.metrics.store_errors["begin"] == 1
        assert (await _call(IdempotencyMiddleware(Charges(), _store(port, once), fail_open=True), "k"))[0] == 201

    asyncio.run(main())


def test_decorator_runs_a_job_once(redis_server):
    store = IdempotencyStore(redis.Redis(port=redis_server.port), prefix="t" + uuid.uuid4().hex, metrics=IdempotencyMetrics())
    effects = []

    @idempotent(store, key=lambda job_id, amount: job_id)
    def charge(job_id, amount):
        effects.append(job_id)
        return {"charged": amount}

    # A redelivered job (the worker crashed after the side effect, before its ack).
    assert charge("j1", 10) == charge("j1", 10) == {"charged": 10}
    assert effects == ["j1"]
    with pytest.raises(ConflictError):
        charge("j1", 11)

    @idempotent(store, key=lambda job_id: job_id)
    def flaky(job_id):
        effects.append("flaky")
        if effects.count("flaky") == 1:
            raise TimeoutError("upstream")
        return "ok"

    with pytest.raises(TimeoutError):
        flaky("j2")
    assert flaky("j2") == "ok" and flaky("j2") == "ok" and effects.count("flaky") == 2


def test_decorator_keeps_the_error_when_redis_goes_away(tmp_path):
    # Redis dies while the job runs: the job's own error is the one raised,
    # and the release that fails is counted, in both flavours.
    once = {"retry": Retry(NoBackoff(), 0)}
    down = RedisServer(tmp_path / "sync")
    store = IdempotencyStore(redis.Redis(port=down.port, retry=redis.retry.Retry(NoBackoff(), 0)), prefix="t" + uuid.uuid4().hex,
                             metrics=IdempotencyMetrics())

    @idempotent(store, key=lambda job_id: job_id)
    def charge(job_id):
        down.stop()
        raise TimeoutError("upstream")

    with pytest.raises(TimeoutError):
        charge("j1")
    # The first try; the release is tried again meanwhile, while the lease lasts.
    assert store.metrics.store_errors["fail"] >= 1

    adown = RedisServer(tmp_path / "async")
    astore = _store(adown.port, once)

    @idempotent(astore, key=lambda job_id: job_id)
    async def acharge(job_id):
        adown.stop()
        raise TimeoutError("upstream")

    async def main():
        with pytest.raises(TimeoutError):
            await acharge("j1")

    asyncio.run(main())
    assert astore.metrics.store_errors["fail"] >= 1


def test_decorator_async_in_progress(redis_server):
    async def main():
        store = _store(redis_server.port)
        gate, started = asyncio.Event(), asyncio.Event()

        @idempotent(store, key=lambda job_id: job_id)
        async def slow(job_id):
            started.set()
            await gate.wait()
            return 1

        first = asyncio.ensure_future(slow("j"))
        await started.wait()  # the first call owns the key
        with pytest.raises(InProgressError) as e:
            await slow("j")
        assert e.value.retry_after == 30
        gate.set()
        assert await first == 1 and await slow("j") == 1

    asyncio.run(main())


@pytest.mark.parametrize("name,value,want", [
    ("Location", "/orders/\u20ac42", "/orders/%E2%82%AC42"),
    ("Location", b"/orders/\xe2\x82\xac42", "/orders/%E2%82%AC42"),  # ASGI bytes, taken as bytes
    ("Location", "/charges/1\x01", "/charges/1%01"),
    ("Location", "/a\r\nSet-Cookie: x", "/a%0D%0ASet-Cookie: x"),
    ("Content-Type", "text/plain; charset=utf-8", "text/plain; charset=utf-8"),  # visible ASCII: unchanged
    ("X-A", "  a\tb  c \t", "a\tb%20%20c"),  # trimmed; only a single space or tab between two other bytes
    ("X-A", "100%25 \u00e9", "100%25 %C3%A9"),  # % itself is not escaped
    ("X-A", "", ""),
    ("X Odd:Name", "1", None),
    ("X-\u00e9", "1", None),
    ("", "1", None),
    ("!#$%&'*+-.^_`|~09azAZ", "1", "1"),
])
def test_safe_header(name, value, want):
    got = _safe_header(name, value)
    assert (got and got[1]) == want if want is not None else got is None
    if got:  # the rule applied twice gives the same value
        assert _safe_header(got[0], got[1]) == got


def test_store_keeps_headers_safe(redis_server, caplog):
    raw = redis.Redis(port=redis_server.port)
    store = IdempotencyStore(redis.Redis(port=redis_server.port), prefix="t" + uuid.uuid4().hex,
                             metrics=IdempotencyMetrics())
    odd = "X Odd:" + uuid.uuid4().hex  # a name no other test logged
    for key in ("a", "b"):
        claim = store.begin("", key, "r")
        store.complete("", key, claim.token, StoredResponse(201, {
            "Location": ["/charges/\u2603"], odd: ["1"], "X-Two": ["a\x01", "b"]}, b"ok"))
        assert json.loads(raw.hget(store.record_key("", key), "headers")) == {
            "Location": ["/charges/%E2%98%83"], "X-Two": ["a%01", "b"]}
    # Records other languages (or older versions) wrote are read through the rule too.
    for stored, want in [(b'{"Location":"/x\xe2\x98\x83","A":[1,"b"],"B C":["d"]}',
                          {"Location": ["/x%E2%98%83"], "A": ["b"]}),
                         (b"not json \xff", {}), (b'["a"]', {})]:
        raw.hset(store.record_key("", "a"), "headers", stored)
        assert store.begin("", "a", "r").response.headers == want
    # A dropped name is logged once, not once per response.
    assert [r.getMessage() for r in caplog.records if "RFC 9110" in r.getMessage()] == [
        "idempotency: header not stored, its name is not an RFC 9110 token: name=%r" % odd.encode()]


def test_decorator_completes_when_cancelled_after_the_handler(tmp_path):
    # A worker cancels the handler's task at its deadline (as await_within
    # and wait_for do) while the store's complete is in flight, held by a
    # CLIENT PAUSE. The complete runs in a task of its own: the record is
    # completed all the same, and the redelivered job does not run again.
    server = RedisServer(tmp_path)
    raw = redis.Redis(port=server.port)

    async def main():
        store = _store(server.port)
        runs = []

        @idempotent(store, key=lambda job_id: job_id)
        async def charge(job_id):
            runs.append(job_id)
            raw.execute_command("CLIENT", "PAUSE", 3000, "WRITE")  # the complete waits in Redis
            return "charged"

        try:
            await asyncio.wait_for(charge("j"), 0.2)  # the deadline falls during the complete
        except asyncio.TimeoutError:
            pass
        await until_async("the record to be completed",
                          lambda: raw.hget(store.record_key("", "j"), "state") == b"completed", 15)
        assert await charge("j") == "charged" and runs == ["j"]

    try:
        asyncio.run(main())
    finally:
        server.stop()


def test_decorator_completes_after_redis_restarts(tmp_path):
    # Redis stops while the job runs and comes back after it returned: the
    # sync store's complete is tried again (a thread) until it lands.
    down = RedisServer(tmp_path, "--appendonly", "yes", "--appendfsync", "always")
    store = IdempotencyStore(redis.Redis(port=down.port), prefix="t" + uuid.uuid4().hex, metrics=IdempotencyMetrics())
    runs = []

    @idempotent(store, key=lambda job_id: job_id)
    def charge(job_id):
        runs.append(job_id)
        down.stop()
        return "charged"

    try:
        assert charge("j") == "charged" and store.metrics.store_errors["complete"] >= 1
        down.start()
        raw = redis.Redis(port=down.port)
        until("the record to be completed", lambda: raw.hget(store.record_key("", "j"), "state") == b"completed", 20)
        assert charge("j") == "charged" and runs == ["j"]
    finally:
        down.stop()


def test_replay_the_server_refuses_goes_without_its_headers(redis_server):
    # After the header rule no server we know refuses a stored header; one
    # that still does gets the response without them, never an error.
    async def main():
        app = Charges()
        mw = IdempotencyMiddleware(app, _store(redis_server.port))
        await _call(mw, "k")
        out = []

        async def receive():
            return {"type": "http.request", "body": b"10", "more_body": False}

        async def refusing(m):
            if m["type"] == "http.response.start" and (b"content-type", b"application/json") in m["headers"]:
                raise ValueError("header refused")
            out.append(m)

        await mw({"type": "http", "method": "POST", "path": "/charges", "headers": [(b"idempotency-key", b"k")]},
                 receive, refusing)
        assert out[0]["status"] == 201 and out[0]["headers"] == [(b"idempotent-replayed", b"true")]
        assert out[1]["body"] == b'{"charged":"10"}' and app.runs == 1

    asyncio.run(main())


def test_a_store_outage_holds_a_few_settler_threads_not_one_per_request():
    # 200 completions whose store is down for their first three tries: a
    # thread each was the old way (a busy server ran out of threads). They
    # share the settler's few threads, and every one of them lands.
    import threading
    import time

    from backstop.idempotency import StoredResponse, _SyncSettle

    lock, tries, landed = threading.Lock(), {}, set()

    class Store(_SyncSettle):
        _transient = (ConnectionError,)

        def complete(self, scope, key, token, response):
            with lock:
                tries[key] = tries.get(key, 0) + 1
                if tries[key] < 3:
                    raise ConnectionError("store down")
                landed.add(key)

    before = threading.active_count()
    store = Store()
    for i in range(200):
        assert isinstance(store._settle("s", "k%d" % i, "t", StoredResponse(201, {}, b""), time.monotonic() + 30),
                          ConnectionError)
        assert threading.active_count() - before <= 4
    until("every completion lands", lambda: len(landed) == 200)
    assert threading.active_count() - before <= 4
    assert all(n == 3 for n in tries.values())


def _outage_store(fails: int, bug_on: int = 0):
    """A sync store whose complete fails with ConnectionError for each key's
    first fails tries (then lands), and with a bug (RuntimeError) on try
    bug_on of the keys named bug*."""
    import threading

    from backstop.idempotency import _SyncSettle

    class Store(_SyncSettle):
        _transient = (ConnectionError,)

        def __init__(self):
            self.lock, self.tries, self.landed = threading.Lock(), {}, set()

        def complete(self, scope, key, token, response):
            with self.lock:
                n = self.tries[key] = self.tries.get(key, 0) + 1
                if key.startswith("bug") and n == bug_on:
                    raise RuntimeError("a bug in the store")
                if n <= fails:
                    raise ConnectionError("store down")
                self.landed.add(key)

    return Store()


def test_a_retry_that_raises_does_not_end_the_settlers_threads():
    # A store call that raises what is not a store failure (a bug) in a
    # retry ends that key's retries, and only those: the few settler threads
    # are the whole process's, and one dying per bug would leave no thread
    # for any later outage (the count of threads is never lowered).
    import time

    from backstop.idempotency import StoredResponse

    store = _outage_store(fails=2, bug_on=2)
    lease = time.monotonic() + 30
    for i in range(8):  # more than the settler's threads
        store._settle("s", "bug%d" % i, "t", StoredResponse(201, {}, b""), lease)
    until("every buggy retry made", lambda: all(store.tries.get("bug%d" % i) == 2 for i in range(8)))
    for i in range(20):
        store._settle("s", "k%d" % i, "t", StoredResponse(201, {}, b""), lease)
    until("every later completion lands", lambda: len(store.landed) == 20)
    assert not any(k.startswith("bug") for k in store.landed)


def test_a_forked_child_settles_with_threads_of_its_own():
    # A pre-forking server forks after its settler has threads: the child
    # has none of them, and must start its own rather than count the
    # parent's (then none would ever run its retries).
    import os
    import time

    from backstop.idempotency import StoredResponse

    parent = _outage_store(fails=1)
    for i in range(8):  # enough at once for the settler to start all its threads
        parent._settle("s", "p%d" % i, "t", StoredResponse(201, {}, b""), time.monotonic() + 30)
    until("the parent's completions land", lambda: len(parent.landed) == 8)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 once its own completion landed
        code = 1
        try:
            child = _outage_store(fails=1)
            child._settle("s", "c", "t", StoredResponse(201, {}, b""), time.monotonic() + 30)
            code = 0 if wait_for(lambda: child.landed, 20) and child.landed == {"c"} else 1
        finally:
            os._exit(code)
    # Polled, and the child killed if it hangs (on a lock a parent's thread
    # held at the fork, had the settler not made its own).
    done = []
    try:
        until("the child to exit", lambda: done.append(os.waitpid(pid, os.WNOHANG)) or done[-1][0] == pid, 25)
    finally:
        if done[-1][0] != pid:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(done[-1][1]) == 0, "the child's completion did not land"


def test_a_settler_that_cannot_start_a_thread_raises_nothing_and_starts_one_later(monkeypatch):
    # A process out of threads (what the settler exists to avoid, but other
    # code may cause): a retry handed over must not raise in the request,
    # nor count a thread that never started (four of those and no retry
    # would ever run again); the next hand-over starts one, which runs both.
    import threading

    from backstop.idempotency import _Settler

    start, failing, done = threading.Thread.start, [True], []

    def flaky_start(self):
        if self.name == "backstop-idempotency-settle" and failing[0]:
            raise RuntimeError("can't start new thread")
        return start(self)

    def steps(n):
        yield 0.0
        done.append(n)

    monkeypatch.setattr(threading.Thread, "start", flaky_start)
    settler = _Settler(threads=1)
    settler.add(steps(1), lambda: None)
    failing[0] = False
    settler.add(steps(2), lambda: None)
    until("both retries run", lambda: sorted(done) == [1, 2])
