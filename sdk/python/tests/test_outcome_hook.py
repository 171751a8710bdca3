"""Issue 45: work(on_outcome=...) in every Python worker (Redis sync and
asyncio, RabbitMQ asyncio and threads), against real servers: one event per
applied outcome, with the fields of Go's queue.OutcomeEvent and Node's
onOutcome; what the hook raises is logged and the worker goes on."""

import asyncio
import threading

import pytest
import redis.asyncio

import backstop
from backstop import rabbitmq
from backstop.queue import OutcomeEvent
from backstop.rabbitmq import sync
from backstop.redis import AsyncQueue, Queue

from conftest import until, until_async
from test_rabbitmq import FAST, HTTPError, qname


def handler_for(seen):
    """ok succeeds; bad fails for good (400); flaky fails once (503)."""

    def handle(job):
        seen.append(job.id)
        body = bytes(job.payload) if not isinstance(job.payload, str) else job.payload.encode()
        if body == b"bad":
            raise HTTPError(400)
        if body == b"flaky" and seen.count(job.id) == 1:
            raise HTTPError(503)

    return handle


def check(events, name):
    got = sorted((e.job.id, e.action, e.reason, e.klass, e.job.attempt, e.delay_ms, e.queue, bool(e.error))
                 for e in events)
    assert got == [
        ("bad", "dead_letter", "permanent_error", "permanent", 1, 0, name, True),
        ("boom", "ack", "success", "", 1, 0, name, False),
        ("flaky", "ack", "success", "", 2, 0, name, False),
        ("flaky", "retry", "transient", "retryable", 1, 1000, name, True),
        ("ok", "ack", "success", "", 1, 0, name, False),
    ]
    assert all(isinstance(e, OutcomeEvent) for e in events)
    bad = [e for e in events if e.job.id == "bad"][0]
    assert "400" in bad.error and bad.job.job_type == "charge_card"


def hook_into(events):
    def on_outcome(e):
        events.append(e)
        if e.job.id == "boom":
            raise RuntimeError("the pager is down")  # logged; the worker goes on

    return on_outcome


JOBS = (("ok", b"ok", None), ("bad", b"bad", "charge_card"), ("flaky", b"flaky", None), ("boom", b"ok", None))


@pytest.fixture
def policy():
    with backstop.load_policy(FAST) as p:
        yield p


def test_redis_sync(r, policy, caplog):
    q = Queue(r, qname("hook"))
    q.ensure_group()
    for id_, body, t in JOBS:
        q.enqueue(id_, body, job_type=t)
    events, seen, stop = [], [], threading.Event()
    t = threading.Thread(target=q.work, args=(policy, handler_for(seen)),
                         kwargs=dict(stop=stop, promote_every=0.05, on_outcome=hook_into(events)), daemon=True)
    t.start()
    until("5 outcomes told", lambda: len(events) >= 5)
    stop.set()
    t.join(10)
    check(events, q.name)
    assert "on_outcome raised for job boom" in caplog.text


def test_redis_asyncio(redis_server, policy):
    async def main():
        c = redis.asyncio.Redis(port=redis_server.port)
        try:
            q = AsyncQueue(c, qname("hook"))
            await q.ensure_group()
            for id_, body, t in JOBS:
                await q.enqueue(id_, body, job_type=t)
            events, seen, stop = [], [], asyncio.Event()
            sync_handle = handler_for(seen)

            async def handle(job):
                sync_handle(job)

            async def on_outcome(e):  # an awaitable: awaited
                await asyncio.sleep(0)
                hook_into(events)(e)

            task = asyncio.ensure_future(q.work(policy, handle, stop=stop, promote_every=0.05, on_outcome=on_outcome))
            await until_async("5 outcomes told", lambda: len(events) >= 5)
            stop.set()
            await asyncio.wait_for(task, 10)
            check(events, q.name)
        finally:
            await c.aclose()

    asyncio.run(main())


def test_rabbitmq_asyncio(rabbit, policy):
    async def main():
        b = await rabbitmq.connect(rabbit.url)
        try:
            q = b.queue(qname("hook"))
            for id_, body, t in JOBS:
                await q.enqueue(id_, body, job_type=t)
            events, seen = [], []
            task = asyncio.ensure_future(q.work(policy, handler_for(seen), on_outcome=hook_into(events)))
            await until_async("5 outcomes told", lambda: len(events) >= 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            check(events, q.name)
        finally:
            await b.close()

    asyncio.run(main())


def test_rabbitmq_sync(rabbit, policy):
    b = sync.connect(rabbit.url)
    try:
        q = b.queue(qname("hook"))
        for id_, body, t in JOBS:
            q.enqueue(id_, body, job_type=t)
        events, seen, stop = [], [], threading.Event()
        t = threading.Thread(target=q.work, args=(policy, handler_for(seen)),
                             kwargs=dict(stop=stop, on_outcome=hook_into(events)), daemon=True)
        t.start()
        until("5 outcomes told", lambda: len(events) >= 5)
        stop.set()
        t.join(30)
        check(events, q.name)
    finally:
        b.close()


def test_on_outcome_must_be_callable(r, policy):
    with pytest.raises(TypeError, match="on_outcome must be callable"):
        Queue(r, "x").work(policy, lambda job: None, stop=threading.Event(), on_outcome="page me")
