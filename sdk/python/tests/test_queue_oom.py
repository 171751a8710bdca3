"""backstop.redis when Redis refuses writes, against a real redis-server:
under maxmemory with noeviction Redis refuses ack, retry and dead_letter
(their first write is flagged denyoom) but not XCLAIM, so reclaim could hand
out a job whose outcome a worker knows. The worker (sync and asyncio) keeps
the outcome and holds the job until Redis takes it."""

import asyncio
import logging
import re
import threading
from collections import Counter

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

import backstop
from backstop.redis import AsyncQueue, Queue
from conftest import server_time_ms, until, until_async

MIN_IDLE_MS = 400
# Batches of 4: flaky (a 503, then a success) and bad (a 400) each start a
# batch, so that an outcome of each kind is refused, with jobs of the batch
# waiting behind it.
IDS = ["flaky" if i == 0 else "bad" if i == 4 else "ok-%d" % i for i in range(16)]
EXPECTED_RUNS = Counter({"%s/1" % i: 1 for i in IDS} | {"flaky/2": 1})


class HTTPError(Exception):
    def __init__(self, status):
        super().__init__("HTTP %d" % status)
        self.status = status


@pytest.fixture
def policy():
    with backstop.load_policy({"max_attempts": 3, "backoff": {"base": "10ms", "cap": "20ms"}}) as p:
        yield p


@pytest.fixture
def r(redis_server):
    c = redis.Redis(port=redis_server.port)
    c.config_set("maxmemory", 0)
    c.flushall()
    yield c
    c.config_set("maxmemory", 0)
    c.flushall()
    c.close()


def out_of_memory(r):
    """Puts Redis in the state of a full server: a 4 MB filler, then
    maxmemory below the memory in use, with noeviction, so every command
    flagged denyoom is refused. Returns a function that lifts the limit."""
    r.set("filler", b"x" * (4 << 20))
    used = r.info("memory")["used_memory"]
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", used // 2)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.set("probe", "x")
    return lambda: r.config_set("maxmemory", 0)


def steal(r, q, stolen):
    """Reclaims as another consumer would (XAUTOCLAIM takes what reclaim
    takes: entries idle for min idle), recording what it got."""
    _, claimed, *_ = r.xautoclaim(q.keys.jobs, q.group, "other", MIN_IDLE_MS, "0-0", count=100)
    for _, f in claimed:
        stolen.append("%s/%s" % (f[b"id"].decode(), f[b"attempt"].decode()))


class Gate:
    """Handlers wait here until the test opens it."""

    def __init__(self):
        self.lock, self.open, self.waiting = threading.Lock(), threading.Event(), 0

    def pass_(self):
        with self.lock:
            self.waiting += 1
        self.open.wait(30)


def check_finished(r, q, runs, stolen, caplog):
    assert runs == EXPECTED_RUNS, "each job runs once (flaky: attempts 1 and 2)"
    c = q.stats().counters
    assert (c.get("dead_letters:crash_loop", 0), c["attempts:success"], c["dead_letters:permanent_error"],
            c["attempts:retry"]) == (0, len(IDS) - 1, 1, 1)
    assert (r.xlen(q.keys.jobs), r.xlen(q.keys.dlq), r.zcard(q.keys.delayed)) == (0, 1, 0)
    assert stolen == [], "another consumer reclaimed jobs whose outcome a worker held"
    text = caplog.text
    assert "refused, retrying" in text and re.search(r"applied after \d+ refusal", text), text[-2000:]


def test_out_of_memory_no_job_runs_twice(r, redis_server, policy, caplog):
    caplog.set_level(logging.INFO, "backstop.queue")
    q = Queue(r, "oom")
    q.ensure_group()
    for i in IDS:
        q.enqueue(i, b"p")
    runs, lock, gate = Counter(), threading.Lock(), Gate()

    def handler(job):
        with lock:
            runs["%s/%d" % (job.id, job.attempt)] += 1
        gate.pass_()
        if job.id == "bad":
            raise HTTPError(400)
        if job.id == "flaky" and job.attempt == 1:
            raise HTTPError(503)

    stop = threading.Event()
    clients = [redis.Redis(port=redis_server.port) for _ in range(2)]
    threads = [threading.Thread(target=Queue(c, "oom").work, args=(policy, handler), kwargs=dict(
        consumer=name, stop=stop, batch=4, block_ms=20, promote_every=0.02, reclaim_every=0.02,
        min_idle_ms=MIN_IDLE_MS, max_deliveries=2)) for name, c in zip(["w1", "w2"], clients)]
    for t in threads:
        t.start()
    lift = lambda: None  # noqa: E731
    try:
        # Both workers are running a job when Redis fills up; their outcomes
        # are refused. Another consumer reclaims meanwhile, for several min
        # idle periods: it must find nothing to take.
        until("two handlers to run", lambda: gate.waiting == 2)
        lift = out_of_memory(r)
        gate.open.set()
        # The probing lasts until Redis's own clock, the one idle times are
        # measured on, has moved four min idle periods past the outage.
        stolen = []
        start = server_time_ms(r)
        until("four min idle periods of reclaim attempts",
              lambda: steal(r, q, stolen) or server_time_ms(r) - start >= 4 * MIN_IDLE_MS)
        lift()
        until("every job to finish", lambda: (
            sum(q.stats().counters.get(k, 0) for k in ("attempts:success", "attempts:dead_letter")) >= len(IDS)
            and q.stats().pending == 0))
    finally:
        lift()
        gate.open.set()
        stop.set()
        for t in threads:
            t.join()
        for c in clients:
            c.close()
    check_finished(r, q, runs, stolen, caplog)


def test_out_of_memory_no_job_runs_twice_asyncio(r, redis_server, policy, caplog):
    caplog.set_level(logging.INFO, "backstop.queue")
    q = Queue(r, "oom-async")
    q.ensure_group()
    for i in IDS:
        q.enqueue(i, b"p")
    runs = Counter()
    stolen = []

    async def main():
        gate, entered = asyncio.Event(), []

        async def handler(job):
            runs["%s/%d" % (job.id, job.attempt)] += 1
            entered.append(job)
            await gate.wait()
            if job.id == "bad":
                raise HTTPError(400)
            if job.id == "flaky" and job.attempt == 1:
                raise HTTPError(503)

        stop = asyncio.Event()
        clients = [redis.asyncio.Redis(port=redis_server.port) for _ in range(2)]
        workers = [asyncio.ensure_future(AsyncQueue(c, q.name).work(
            policy, handler, consumer=name, stop=stop, batch=4, block_ms=20, promote_every=0.02,
            reclaim_every=0.02, min_idle_ms=MIN_IDLE_MS, max_deliveries=2)) for name, c in zip(["w1", "w2"], clients)]
        lift = lambda: None  # noqa: E731
        try:
            await until_async("two handlers to run", lambda: len(entered) == 2)
            lift = out_of_memory(r)
            gate.set()
            start = server_time_ms(r)
            await until_async("four min idle periods of reclaim attempts",
                              lambda: steal(r, q, stolen) or server_time_ms(r) - start >= 4 * MIN_IDLE_MS)
            lift()
            await until_async("every job to finish", lambda: (
                sum(q.stats().counters.get(k, 0) for k in ("attempts:success", "attempts:dead_letter")) >= len(IDS)
                and q.stats().pending == 0))
        finally:
            lift()
            gate.set()
            stop.set()
            await asyncio.gather(*workers)
            for c in clients:
                await (c.aclose() if hasattr(c, "aclose") else c.close())

    asyncio.run(main())
    check_finished(r, q, runs, stolen, caplog)


def test_stopped_while_refused_leaves_the_entry_pending(r, policy, caplog):
    q = Queue(r, "oom-stop")
    q.ensure_group()
    q.enqueue("j", b"p")
    gate, stop = Gate(), threading.Event()
    t = threading.Thread(target=q.work, args=(policy, lambda job: gate.pass_()), kwargs=dict(
        consumer="w1", stop=stop, batch=1, block_ms=20, promote_every=0, reclaim_every=0))
    t.start()
    lift = lambda: None  # noqa: E731
    try:
        until("the handler to run", lambda: gate.waiting == 1)
        lift = out_of_memory(r)
        gate.open.set()
        until("a refused outcome", lambda: "outcome" in caplog.text)
    finally:
        stop.set()
        gate.open.set()
        t.join()
        lift()
    assert "not applied: the worker stopped while Redis refused it" in caplog.text, caplog.text[-2000:]
    assert [p["consumer"] for p in r.xpending_range(q.keys.jobs, q.group, "-", "+", 10)] == [b"w1"]
    assert gate.waiting == 1


def test_stopped_while_refused_leaves_the_entry_pending_asyncio(r, redis_server, policy, caplog):
    q = Queue(r, "oom-stop-async")
    q.ensure_group()
    q.enqueue("j", b"p")

    async def main():
        gate, stop, entered = asyncio.Event(), asyncio.Event(), []

        async def handler(job):
            entered.append(job)
            await gate.wait()

        c = redis.asyncio.Redis(port=redis_server.port)
        w = asyncio.ensure_future(AsyncQueue(c, q.name).work(
            policy, handler, consumer="w1", stop=stop, batch=1, block_ms=20, promote_every=0, reclaim_every=0))
        lift = lambda: None  # noqa: E731
        try:
            await until_async("the handler to run", lambda: entered)
            lift = out_of_memory(r)
            gate.set()
            await until_async("a refused outcome", lambda: "outcome" in caplog.text)
        finally:
            stop.set()
            gate.set()
            await w
            lift()
            await (c.aclose() if hasattr(c, "aclose") else c.close())
        assert len(entered) == 1

    asyncio.run(main())
    assert "not applied: the worker stopped while Redis refused it" in caplog.text, caplog.text[-2000:]
    assert [p["consumer"] for p in r.xpending_range(q.keys.jobs, q.group, "-", "+", 10)] == [b"w1"]


def test_a_worker_starts_while_out_of_memory(r, redis_server, policy):
    q = Queue(r, "oom-start")
    q.ensure_group()
    q.enqueue("j", b"p")
    lift = out_of_memory(r)
    ran, stop, failed = [], threading.Event(), []

    def work():
        try:
            q.work(policy, ran.append, consumer="w1", stop=stop, block_ms=20, promote_every=0)
        except Exception as e:  # noqa: BLE001 - the test reports it
            failed.append(e)

    t = threading.Thread(target=work)
    t.start()
    try:
        until("the job to run", lambda: failed or ran)
        assert not failed, "the worker did not start: %r" % failed
        lift()
        until("the job to be acked", lambda: q.stats().counters.get("attempts:success") == 1)
    finally:
        lift()
        stop.set()
        t.join()
    assert len(ran) == 1

    async def main():
        c = redis.asyncio.Redis(port=redis_server.port)
        try:
            aq = AsyncQueue(c, "oom-start")
            out_of_memory(r)
            assert await aq.ensure_group() is False
        finally:
            lift()
            await (c.aclose() if hasattr(c, "aclose") else c.close())

    asyncio.run(main())


def test_hold(r, redis_server):
    q = Queue(r, "hold")
    q.ensure_group()
    ids = [q.enqueue("j%d" % i, b"p") for i in range(5)]
    r.xreadgroup(q.group, "c1", {q.keys.jobs: ">"}, count=5)
    r.xclaim(q.keys.jobs, q.group, "c2", 0, [ids[1]], justid=True)
    q.ack(ids[2])  # finished
    r.xdel(q.keys.jobs, ids[3])  # data gone
    lift = out_of_memory(r)
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            q.ack(ids[4])
        # Hold resets idle time: let the entries go idle first, as Redis sees it.
        def idle(i):
            e = r.xpending_range(q.keys.jobs, q.group, i, i, 1)
            return e[0]["time_since_delivered"] if e else 0
        until("the pending entries idle for 20ms", lambda: idle(ids[0]) >= 20 and idle(ids[1]) >= 20)
        assert q.hold("c1", ids) == [True, False, False, False, True]
        p = {e["message_id"].decode(): e for e in r.xpending_range(q.keys.jobs, q.group, "-", "+", 10)}
        assert (p[ids[0]]["consumer"], p[ids[0]]["times_delivered"]) == (b"c1", 1), "holding is not a delivery"
        # Both were idle for 20ms before the hold: only the held one started again.
        assert p[ids[0]]["time_since_delivered"] < p[ids[1]]["time_since_delivered"]
        assert p[ids[1]]["consumer"] == b"c2" and p[ids[1]]["time_since_delivered"] >= 20
        assert ids[3] not in p

        async def main():
            c = redis.asyncio.Redis(port=redis_server.port)
            try:
                aq = AsyncQueue(c, "hold")
                return await aq.hold("c1", ids[:2]), await aq.hold("c1", [])
            finally:
                await (c.aclose() if hasattr(c, "aclose") else c.close())

        assert asyncio.run(main()) == ([True, False], [])
        hold = r.register_script(backstop.redis.script_source("hold"))
        for bad in (["c1", "x-1"], ["c1", "5"], ["", ids[0]], ["c1"]):
            with pytest.raises(redis.exceptions.ResponseError, match="ERR backstop hold|backstop hold"):
                hold(keys=[q.keys.jobs], args=[q.group, *bad])
        with pytest.raises(ValueError, match="consumer"):
            q.hold("", ids)
        with pytest.raises(ValueError, match="entries"):
            q.hold("c1", ids[0])
        with pytest.raises(ValueError, match="entry"):
            q.hold("c1", ["x-1"])
    finally:
        lift()


def test_which_errors_are_worth_sending_again(r, redis_server):
    from backstop.redis import _write_refused

    # Without the client's own retries (redis-py retries LOADING and
    # connection errors itself).
    once = redis.Redis(port=redis_server.port, retry=Retry(NoBackoff(), 0))

    def reply(msg):
        try:
            once.eval("return redis.error_reply(ARGV[1])", 0, msg)
        except redis.RedisError as e:
            return e
        pytest.fail("no error for %s" % msg)

    def error(fn, *args):
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001
            return e
        pytest.fail("no error")

    q = Queue(r, "classify")
    q.ensure_group()
    eid = q.enqueue("j", b"p")
    r.xreadgroup(q.group, "c", {q.keys.jobs: ">"}, count=1)
    r.set(q.keys.stats, "not a hash")
    refused = redis.Redis(port=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    cases = [
        ("OOM", reply("OOM command not allowed when used memory > 'maxmemory'."), True),
        ("READONLY", reply("READONLY You can't write against a read only replica."), True),
        ("LOADING", reply("LOADING Redis is loading the dataset in memory"), True),
        ("BUSY", reply("BUSY Redis is busy running a script."), True),
        ("MASTERDOWN", reply("MASTERDOWN Link with MASTER is down"), True),
        ("MISCONF", reply("MISCONF Redis is configured to save RDB snapshots, but it is unable to persist."), True),
        ("TRYAGAIN", reply("TRYAGAIN Multiple keys request during rehashing of slot"), True),
        ("CLUSTERDOWN", reply("CLUSTERDOWN The cluster is down"), True),
        ("NOREPLICAS", reply("NOREPLICAS Not enough good replicas to write."), True),
        ("max clients", reply("ERR max number of clients reached"), True),
        ("connection refused", error(refused.ping), True),
        ("BUSYGROUP", reply("BUSYGROUP Consumer Group name already exists"), False),
        ("WRONGTYPE", error(q.ack, eid), False),
        ("bad ARGV", error(q.retry, eid, 0, "because"), False),
        ("NOPERM", reply("NOPERM this user has no permissions to run the 'evalsha' command"), False),
        ("bad argument", error(q.hold, "", [eid]), False),
    ]
    once.close()
    for what, err, want in cases:
        assert _write_refused(err) is want, "%s: %r" % (what, err)
