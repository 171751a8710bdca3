"""The handler deadline of the Redis workers (Queue.work, AsyncQueue.work)
against a real redis-server: a job whose handler runs past min idle is held
(not reclaimed by a second worker), and a handler past handler_timeout fails
as a timeout, once."""

import asyncio
import json
import threading
import time

import pytest
import redis
import redis.asyncio

import backstop
from backstop.redis import AsyncQueue, Queue

from conftest import until
from test_queue import FIXED

MIN_IDLE_MS = 1000


@pytest.fixture
def release():
    e = threading.Event()
    yield e
    e.set()  # the hanging handlers (and an abandoned thread) end


class Workers:
    """Queue.work or AsyncQueue.work (its own event loop) in threads, each
    with its own client, until stop()."""

    def __init__(self, redis_server, mode):
        self.port, self.mode, self.threads, self.stops = redis_server.port, mode, [], []

    def start(self, policy, handler, **options):
        if self.mode == "sync":
            stop = threading.Event()
            q = Queue(redis.Redis(port=self.port), "orders")
            t = threading.Thread(target=q.work, args=(policy, handler), kwargs=dict(stop=stop, **options), daemon=True)
            self.stops.append(stop.set)
        else:
            ready = threading.Event()

            async def main():
                stop = asyncio.Event()
                loop = asyncio.get_running_loop()
                self.stops.append(lambda: loop.call_soon_threadsafe(stop.set))
                ready.set()
                c = redis.asyncio.Redis(port=self.port)
                await AsyncQueue(c, "orders").work(policy, handler, stop=stop, **options)
                await c.aclose()

            t = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        t.start()
        if self.mode != "sync":
            until("the worker's loop", ready.is_set)
        self.threads.append(t)

    def stop(self):
        for s in self.stops:
            s()
        for t in self.threads:
            t.join(30)
            assert not t.is_alive(), "a worker did not stop"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_job_past_min_idle_is_held_not_reclaimed(redis_server, r, mode):
    q = Queue(r, "orders")
    q.ensure_group()
    q.enqueue("long", b"x")
    ran, claimed = [], []

    def work(job):
        ran.append(job.id)
        time.sleep(3 * MIN_IDLE_MS / 1000)  # the job's work: three times min idle

    async def awork(job):
        ran.append(job.id)
        await asyncio.sleep(3 * MIN_IDLE_MS / 1000)

    w = Workers(redis_server, mode)
    with backstop.load_policy(FIXED) as p:
        w.start(p, work if mode == "sync" else awork, consumer="w1", min_idle_ms=MIN_IDLE_MS, reclaim_every=0,
                block_ms=50)
        until("the handler to start", lambda: ran)
        # A second worker reclaiming every ~150 ms what has been idle for min idle.
        w.start(p, lambda job: claimed.append(job.id), consumer="w2", min_idle_ms=MIN_IDLE_MS, reclaim_every=0.15,
                block_ms=50)
        until("the job to be acked", lambda: q.stats().counters.get("attempts:success") == 1)
        w.stop()
    s = q.stats()
    assert ran == ["long"] and claimed == []
    assert (s.jobs, s.pending, s.delayed, s.dlq) == (0, 0, 0, 0)
    assert "reclaimed" not in s.counters


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_hanging_handler_fails_once_as_a_timeout(redis_server, r, release, mode):
    q = Queue(r, "orders")
    q.ensure_group()
    q.enqueue("hangs", b"x")
    ran = []

    def hang(job):
        ran.append(job.attempt)
        release.wait()

    async def ahang(job):
        ran.append(job.attempt)
        await asyncio.Event().wait()

    w = Workers(redis_server, mode)
    with backstop.load_policy(FIXED) as p:
        # promote_every=0: the retry stays in the delayed set, to be looked at.
        w.start(p, hang if mode == "sync" else ahang, consumer="w1", handler_timeout=0.3, promote_every=0,
                block_ms=50)
        until("the job in the delayed set", lambda: q.stats().delayed == 1)
        w.stop()
    [member] = r.zrange(q.keys.delayed, 0, -1)
    m = json.loads(member)
    assert ran == [1]
    assert (m["attempt"], m["last_reason"]) == (2, "transient")
    assert m["last_error"] == "DeadlineExceeded: handler deadline exceeded after 300ms"
    c = q.stats().counters
    assert (c["attempts:retry"], c["retries:transient"], q.stats().pending) == (1, 1, 0)


@pytest.mark.parametrize("bad", [0, -1, float("inf"), "1", True])
def test_handler_timeout_is_checked(r, bad):
    q = Queue(r, "orders")
    with pytest.raises(ValueError, match=r"^work: handler_timeout must be a number of seconds > 0"):
        q.work(backstop.load_policy(FIXED), print, handler_timeout=bad)
