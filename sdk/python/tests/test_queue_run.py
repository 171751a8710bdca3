"""Queue.run and AsyncQueue.run against a real redis-server: delayed jobs
moved to the stream now, by job id or due before a bound, counted in
force_run."""
import asyncio
from datetime import datetime, timedelta, timezone

import pytest
import redis
import redis.asyncio

from backstop.redis import AsyncQueue, Queue, Ran, script_source


def delay(q, *ids):
    """Enqueues ids and retries each an hour after the one before."""
    for i, job_id in enumerate(ids):
        q.enqueue(job_id, b"p")
        [job] = q.read("c1", count=1)
        q.retry(job, timedelta(hours=i + 1), "transient", "e")


def test_run_by_id_and_due_before(r):
    q = Queue(r, "run-now")
    q.ensure_group()
    delay(q, "a", "b", "c")
    r.zadd(q.keys.delayed, {'{"id":"x","attempt":2.5}': 1})
    assert q.run("b") == Ran(1, 0)
    assert q.run("nope") == Ran(0, 0)  # unknown id: nothing moved
    assert q.run("x") == Ran(1, 0)  # malformed: moved raw
    bound = datetime.now(timezone.utc) + timedelta(hours=5)
    assert q.run(due_before=bound, limit=1) == Ran(1, 1)
    assert q.run(due_before=int(bound.timestamp() * 1000)) == Ran(1, 0)
    jobs = q.read("c2", count=10)
    assert [j.id for j in jobs] == ["b", "", "a", "c"]
    assert jobs[1].malformed
    assert q.stats().counters["force_run"] == 4


@pytest.mark.parametrize("args, kwargs, message", [
    ((), {}, "give one of job_id and due_before"),
    (("a",), {"due_before": 1}, "give one of job_id and due_before"),
    (("",), {}, "job_id must be a non-empty string"),
    ((), {"due_before": 1, "limit": 0}, "limit must be a whole number in 1..10000"),
    ((), {"due_before": 1, "limit": 10001}, "limit must be a whole number in 1..10000"),
    ((), {"due_before": -1}, "due_before must be a whole number >= 0"),
    ((), {"due_before": datetime(2026, 1, 1)}, "aware datetime"),
])
def test_run_refuses_bad_arguments_before_redis(args, kwargs, message):
    q = Queue(redis.Redis(port=1), "q")  # nothing listens: never reached
    with pytest.raises(ValueError, match=message):
        q.run(*args, **kwargs)


def test_async_run(r, redis_server):
    q = Queue(r, "run-async")
    q.ensure_group()
    delay(q, "a", "b")

    async def main():
        c = redis.asyncio.Redis(port=redis_server.port)
        try:
            aq = AsyncQueue(c, "run-async")
            return await aq.run("b"), await aq.run(due_before=datetime.now(timezone.utc) + timedelta(days=1))
        finally:
            await c.aclose()

    assert asyncio.run(main()) == (Ran(1, 0), Ran(1, 0))
    assert q.stats().counters["force_run"] == 2


def test_run_by_id_goes_on_through_a_large_set(r):
    q = Queue(r, "run-big")
    r.zadd(q.keys.delayed, {'{"id":"job-%d","attempt":2,"first_enqueued_ms":"1"}' % i: 1e13 + i for i in range(30000)})
    first = r.eval(script_source("run"), 3, q.keys.delayed, q.keys.jobs, q.keys.stats, "id", "nope", "0")
    assert first[1] != b"0"  # one call reads a bounded part
    assert q.run("job-29999") == Ran(1, 0)
    assert q.run("job-29999") == Ran(0, 0)
    assert r.zcard(q.keys.delayed) == 29999


def test_replay_and_run_record_in_the_audit_with_an_actor(r):
    """Issue 46: given an actor, replay and run record each job they move in
    the audit stream, as the Go CLI and console do (the same scripts write
    the same fields); without one nothing is recorded."""
    q = Queue(r, "aud-py")
    q.ensure_group()
    assert q.keys.audit == "{aud-py}:audit"
    delay(q, "d")  # first: the replays below put jobs in the stream
    for job_id in ("a", "b"):
        q.enqueue(job_id, b"p")
        [job] = q.read("c1", count=1)
        q.dead_letter(job, "permanent_error", "boom")
    assert q.replay(1) == 1  # no actor: not recorded
    assert r.xlen(q.keys.audit) == 0
    assert q.replay(10, "permanent_error", actor="ann@ops1") == 1
    assert q.run("d", actor="bob@ops2") == Ran(1, 0)
    recs = [{k.decode(): v.decode() for k, v in f.items()} for _, f in r.xrange(q.keys.audit)]
    assert [(x["action"], x["actor"], x["id"]) for x in recs] == [("replay", "ann@ops1", "b"), ("run", "bob@ops2", "d")]
    assert recs[0]["reason"] == "permanent_error" and recs[0]["dlq_entry"] and len(recs[0]["at_ms"]) == 13
    assert recs[1]["reason"] == "transient"
    with pytest.raises(ValueError, match="actor must be a string of at most 256 bytes"):
        q.replay(1, actor="x" * 257)


def test_async_replay_records_in_the_audit(r, redis_server):
    q = Queue(r, "aud-py-async")
    q.ensure_group()
    q.enqueue("a", b"p")
    [job] = q.read("c1", count=1)
    q.dead_letter(job, "permanent_error", "boom")

    async def main():
        c = redis.asyncio.Redis(port=redis_server.port)
        try:
            return await AsyncQueue(c, "aud-py-async").replay(10, actor="ann@ops1")
        finally:
            await c.aclose()

    assert asyncio.run(main()) == 1
    [(_, rec)] = r.xrange(q.keys.audit)
    assert rec[b"action"] == b"replay" and rec[b"actor"] == b"ann@ops1" and rec[b"id"] == b"a"
