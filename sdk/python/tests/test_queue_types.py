"""Job types against a real redis-server (issue 16, as
queue/jobtypes_test.go in Go and test/queue-types.test.js in Node): one work
loop over a stream of three job types, one failing; each type decided by its
own policy (``policies=``), counted by type in the stats hash, replayed
alone."""

import asyncio
import threading

import pytest
import redis
import redis.asyncio

import backstop
from backstop.redis import AsyncQueue, Queue

from conftest import until

FAST = {"backoff": {"base": "5ms", "cap": "10ms"}, "jitter": {"mode": "none"}}


class Down(Exception):
    def __init__(self, status):
        super().__init__("http %d" % status)
        self.status = status


def classify(exc):
    return {"http_status": exc.status} if isinstance(exc, Down) else None


def counters(r, q):
    return {k.decode(): int(v) for k, v in r.hgetall(q.keys.stats).items()}


def test_enqueue_takes_a_job_type_and_refuses_a_bad_one(r):
    q = Queue(r, "typed")
    q.enqueue("a", b"x", job_type="send_email")
    q.enqueue("b", b"x")
    q.enqueue("c", b"x", job_type="")
    for bad in ["a:b", "t" * 65, "b\x00", "send email", "caf\u00e9"]:
        with pytest.raises(ValueError, match="job_type"):
            q.enqueue("bad", b"x", job_type=bad)
    with pytest.raises(TypeError, match="job_type"):
        q.enqueue("bad", b"x", job_type=7)
    entries = r.xrange(q.keys.jobs)
    assert [f.get(b"type") for _, f in entries] == [b"send_email", None, None]
    jobs = [backstop.redis.Job.from_entry(i, f) for i, f in entries]
    assert [j.job_type for j in jobs] == ["send_email", "", ""]
    with pytest.raises(ValueError, match="job_type"):
        q.replay(1, job_type="a:b")


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_one_loop_three_types_each_by_its_own_policy(redis_server, r, use_async):
    q = Queue(r, "mixed")
    types = ["send_email", "charge_card", "render_report"]
    for i in range(9):
        q.enqueue("%s-%d" % (types[i % 3], i), b"x", job_type=types[i % 3])
    seen = {}

    def handler(job):
        seen[job.id] = seen.get(job.id, 0) + 1
        if job.job_type == "charge_card":
            raise Down(503)
        if job.job_type == "send_email" and seen[job.id] == 1:
            raise Down(503)
        if job.id == "render_report-2":
            raise Down(503)  # until its policy's 3 attempts run out

    with backstop.load_policy(dict(max_attempts=5, **FAST)) as base, \
            backstop.load_policy(dict(max_attempts=2, **FAST)) as critical, \
            backstop.load_policy(dict(max_attempts=3, **FAST)) as batch:
        options = dict(consumer="w1", reclaim_every=0, promote_every=0.01, block_ms=20, classify=classify,
                       policies={"charge_card": critical, "render_report": batch})
        stop = threading.Event()
        if use_async:
            loops = []

            async def main():
                c = redis.asyncio.Redis(port=redis_server.port)
                ev = asyncio.Event()
                loops.append((asyncio.get_running_loop(), ev))
                try:
                    await AsyncQueue(c, "mixed").work(base, handler, stop=ev, **options)
                finally:
                    await (c.aclose() if hasattr(c, "aclose") else c.close())
            t = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        else:
            def run():
                c = redis.Redis(port=redis_server.port)
                try:
                    Queue(c, "mixed").work(base, handler, stop=stop, **options)
                finally:
                    c.close()
            t = threading.Thread(target=run, daemon=True)
        t.start()
        try:
            until("every job finished", lambda: (counters(r, q).get("attempts:success"),
                                                 counters(r, q).get("attempts:dead_letter")) == (5, 4))
        finally:
            stop.set()
            if use_async:
                until("the async worker started", lambda: loops)
                loop, ev = loops[0]
                loop.call_soon_threadsafe(ev.set)
            t.join(30)
        assert not t.is_alive()
    c = counters(r, q)
    # Each type gave up at its own policy's attempts: charge_card 2,
    # render_report 3 (work's policy allows 5).
    assert (c["t:charge_card:max_attempts_reached"], c["t:charge_card:finished:dead_letter:2"]) == (3, 3)
    assert (c["t:render_report:finished:dead_letter:3"], c["t:render_report:attempts:success"]) == (1, 2)
    assert c["t:send_email:finished:success:2"] == 3
    assert c["types"] == 3
    assert q.replay(10, job_type="send_email") == 0
    assert q.replay(10, job_type="charge_card") == 3
    assert [f[b"type"] for _, f in r.xrange(q.keys.jobs)] == [b"charge_card"] * 3
    assert [f[b"type"] for _, f in r.xrange(q.keys.dlq)] == [b"render_report"]


def test_async_enqueue_and_replay_by_type(redis_server, r):
    async def main():
        c = redis.asyncio.Redis(port=redis_server.port)
        try:
            q = AsyncQueue(c, "aio")
            await q.enqueue("a", b"x", job_type="charge_card")
            with pytest.raises(ValueError, match="job_type"):
                await q.enqueue("b", b"x", job_type="a:b")
            for dl in ({"reason": "permanent_error", "id": "a", "type": "charge_card"},
                       {"reason": "permanent_error", "id": "b", "type": "send_email"}):
                await c.xadd(q.keys.dlq, dl)
            assert await q.replay(10, job_type="send_email") == 1
            with pytest.raises(ValueError, match="job_type"):
                await q.replay(10, job_type="a b")
        finally:
            await (c.aclose() if hasattr(c, "aclose") else c.close())

    asyncio.run(main())
    types = [f.get(b"type") for _, f in r.xrange("{aio}:jobs")]
    assert types == [b"charge_card", b"send_email"]
    assert [f[b"type"] for _, f in r.xrange("{aio}:dlq")] == [b"charge_card"]


def test_work_refuses_bad_policies(r):
    q = Queue(r, "refuse")
    with backstop.load_policy("default") as p:
        with pytest.raises(ValueError, match="policies key"):
            q.work(p, lambda job: None, policies={"a:b": p})
        with pytest.raises(TypeError, match="policies"):
            q.work(p, lambda job: None, policies={"charge_card": object()})
        with pytest.raises(TypeError, match="policies"):
            q.work(p, lambda job: None, policies="charge_card")
