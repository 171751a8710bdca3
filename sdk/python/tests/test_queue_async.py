"""backstop.redis.AsyncQueue over redis.asyncio, against a real
redis-server and a real Redis Cluster (see conftest.py)."""

import asyncio
import json

import pytest
import redis.asyncio

import backstop
from backstop.redis import AsyncQueue, Outcome

from test_queue import FIXED, HTTPError, LogUntil, check_skip_logged


@pytest.fixture
def policy():
    with backstop.load_policy(FIXED) as p:
        yield p


def run(redis_server, body, **options):
    """Runs body(client) in a fresh event loop with a flushed server."""

    async def main():
        c = redis.asyncio.Redis(port=redis_server.port, **options)
        try:
            await c.flushall()
            return await body(c)
        finally:
            await (c.aclose() if hasattr(c, "aclose") else c.close())

    return asyncio.run(main())


async def make_due(c, q):
    members = await c.zrange(q.keys.delayed, 0, -1)
    if members:
        await c.zadd(q.keys.delayed, {m: 0 for m in members})


def test_the_whole_contract(redis_server, policy):
    async def body(c):
        q = AsyncQueue(c, "orders")
        assert await q.ensure_group() is True
        assert await q.ensure_group() is False
        eid = await q.enqueue("job-1", b"payload")
        [job] = await q.read("w1", block_ms=10)
        assert (job.entry_id, job.id, job.attempt, job.payload) == (eid, "job-1", 1, b"payload")

        out = await q.apply(job, HTTPError(503, {"Retry-After": "7"}), policy)
        assert (out.action, out.reason, out.decision.delay_ms, out.applied) == ("retry", "retry_after", 7000, True)
        [(member, score)] = await c.zrange(q.keys.delayed, 0, -1, withscores=True)
        assert score == out.due_ms and json.loads(member)["attempt"] == 2
        moved, next_due = await q.promote()
        assert moved == 0 and 0 < next_due <= 7000
        await make_due(c, q)
        assert await q.promote() == (1, None)
        [job] = await q.read("w1")
        assert (job.attempt, job.last_reason, job.last_error) == (2, "retry_after", "HTTPError: HTTP 503")

        out = await q.apply(job, HTTPError(400), policy)
        assert (out.action, out.reason, out.applied) == ("dead_letter", "permanent_error", True)
        [(dlq_id, f)] = await c.xrange(q.keys.dlq)
        assert out.dlq_id == dlq_id.decode() and f[b"reason"] == b"permanent_error" and f[b"attempt"] == b"2"
        assert await q.apply(job, HTTPError(400), policy) == Outcome("dead_letter", "permanent_error", out.decision, False)

        assert await q.replay(reason="permanent_error") == 1
        [job] = await q.read("w1")
        assert (job.attempt, job.last_reason) == (1, "permanent_error")
        assert await q.ack(job) is True
        assert await q.ack(job) is False

        await c.script_flush()  # NOSCRIPT: loaded again
        await q.enqueue("job-2")
        [job] = await q.read("w1")
        assert await q.retry(job, 0, "transient") is not None
        assert await q.retry(job, 0, "transient") is None
        await q.promote()
        [job] = await q.read("w1")
        assert await q.dead_letter(job, "not_idempotent", "e") is not None
        assert await q.dead_letter(job, "not_idempotent", "e") is None

        s = await q.stats()
        assert (s.jobs, s.pending, s.delayed, s.dlq) == (0, 0, 0, 1)
        assert s.counters == {
            "enqueued": 2, "attempts:retry": 2, "retries:retry_after": 1, "retries:transient": 1, "promoted": 2,
            "attempts:dead_letter": 2, "dead_letters:permanent_error": 1, "dead_letters:not_idempotent": 1,
            "finished:dead_letter:2": 2, "finished_sum:dead_letter": 4, "replayed": 1,
            "attempts:success": 1, "finished:success:1": 1, "finished_sum:success": 1}

    run(redis_server, body)


def test_reclaim_crash_loop_and_max_attempts(redis_server):
    async def body(c):
        q = AsyncQueue(c, "loops")
        await q.ensure_group()
        await q.enqueue("loop")
        await q.read("w1")
        assert len((await q.reclaim("w2", min_idle_ms=0, max_deliveries=2)).jobs) == 1
        assert await q.reclaim("w3", min_idle_ms=0, max_deliveries=2) == (1, [])
        [(_, f)] = await c.xrange(q.keys.dlq)
        assert f["reason"] == "crash_loop"  # decode_responses

        with backstop.load_policy({**FIXED, "max_attempts": 2}) as p:
            await q.enqueue("job")
            reasons = []
            for _ in range(2):
                await make_due(c, q)
                await q.promote()
                [job] = await q.read("w1")
                reasons.append((await q.apply(job, HTTPError(503), p)).reason)
        assert reasons == ["transient", "max_attempts_reached"]
        s = await q.stats()
        assert (s.counters["max_attempts_reached"], s.counters["dead_letters:crash_loop"], s.dlq) == (1, 1, 2)

    run(redis_server, body, decode_responses=True)


def test_work_until_stopped(redis_server):
    async def body(c):
        q = AsyncQueue(c, "async-work")
        stop = asyncio.Event()
        seen = []

        async def handler(job):
            seen.append((job.id, job.attempt))
            if job.attempt == 1:
                raise ConnectionResetError("reset")
            stop.set()

        fast = {**FIXED, "backoff": {"strategy": "constant", "base": "10ms", "cap": "10ms"}}
        with backstop.load_policy(fast) as p:
            await q.ensure_group()
            await c.xadd(q.keys.jobs, {"attempt": "1"})  # malformed: never reaches the handler
            await q.enqueue("job-1")
            await asyncio.wait_for(q.work(p, handler, consumer="w1", stop=stop, block_ms=50, promote_every=0.02), 20)
        assert seen == [("job-1", 1), ("job-1", 2)]
        s = await q.stats()
        assert (s.jobs, s.pending, s.delayed) == (0, 0, 0)
        assert (s.counters["retries:transient"], s.counters["finished:success:2"], s.counters["dead_letters:malformed"]) == (1, 1, 1)

    run(redis_server, body, protocol=3)


# Issue 15: the asyncio worker logs each crash loop the DLQ refuses, as the
# Go worker does (see test_queue.py).
def test_work_logs_each_crash_loop_the_dlq_refuses(redis_server, policy):
    async def body(c):
        q = AsyncQueue(c, "refusing")
        await q.ensure_group()
        await q.enqueue("loop")
        [loop] = await q.read("crashed")
        await c.xclaim(q.keys.jobs, q.group, "crashed", 0, [loop.entry_id])  # delivery 2
        await c.set(q.keys.dlq, "legacy")
        stop = asyncio.Event()
        ran = []

        async def handler(job):
            ran.append(job)

        with LogUntil(loop.entry_id, stop.set) as log:
            await asyncio.wait_for(q.work(policy, handler, consumer="w2", stop=stop, block_ms=20, reclaim_every=0.01,
                                          min_idle_ms=0, max_deliveries=2), 20)
        check_skip_logged(q, loop.entry_id, log.records)
        assert ran == []
        assert int(await c.hget(q.keys.stats, "reclaim_skipped")) >= 1
        [p] = await c.xpending_range(q.keys.jobs, q.group, "-", "+", 10)
        assert (p["message_id"], p["times_delivered"]) == (loop.entry_id.encode(), 2)

    run(redis_server, body)


def test_work_can_be_cancelled(redis_server, policy):
    async def body(c):
        q = AsyncQueue(c, "cancel")
        started = asyncio.Event()

        async def handler(job):
            started.set()
            await asyncio.Event().wait()  # never ends: the task is cancelled

        await q.ensure_group()
        await q.enqueue("slow")
        task = asyncio.ensure_future(q.work(policy, handler, consumer="w1", block_ms=50))
        await asyncio.wait_for(started.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        s = await q.stats()
        assert (s.jobs, s.pending) == (1, 1)  # no outcome: reclaim delivers it again

    run(redis_server, body)


def test_cluster(redis_cluster, policy):
    async def body():
        c = redis.asyncio.RedisCluster(host="127.0.0.1", port=redis_cluster[0])
        try:
            for name in ("async-alpha", "async-beta", "async-gamma"):
                q = AsyncQueue(c, name)
                await q.ensure_group()
                await q.enqueue("job-1", b"p")
                await c.script_flush()
                [job] = await q.read("w1")
                assert (await q.apply(job, HTTPError(503), policy)).applied
                await make_due(c, q)
                assert (await q.promote()).moved == 1
                [job] = await q.read("w1")
                assert job.attempt == 2
                assert (await q.apply(job, None, policy)).applied
                s = await q.stats()
                assert (s.jobs, s.pending, s.delayed, s.dlq, s.counters["attempts:success"]) == (0, 0, 0, 0, 1)
        finally:
            await (c.aclose() if hasattr(c, "aclose") else c.close())

    asyncio.run(body())
