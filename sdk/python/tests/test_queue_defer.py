"""A queue worker and an open circuit breaker, against a real redis-server
(issue 11's Done-when, as queue/defer_test.go in Go and
test/queue-defer.test.js in Node): the breaker refuses a job before its
handler runs, the job is deferred without spending an attempt, the worker
stops reading, and an outage ends with no dead letter."""

import asyncio
import threading
import time

import pytest
import redis
import redis.asyncio

import backstop
from backstop.redis import AsyncQueue, Queue

from conftest import until

STOP_READING = {"max_attempts": 3, "backoff": {"base": "10ms", "cap": "20ms"}, "jitter": {"mode": "none"},
                "circuit_breaker": {"failure_threshold": 1, "open_for": "1h"}}
JOBS = 12


def outage(on_open):
    return {"max_attempts": 3, "backoff": {"base": "10ms", "cap": "20ms"}, "jitter": {"mode": "none"},
            "circuit_breaker": {"failure_threshold": 2, "open_for": "200ms"}, "on_open": on_open}


def counters(r, q):
    return {k.decode(): int(v) for k, v in r.hgetall(q.keys.stats).items()}


def command_calls(r, cmd):
    return int(r.info("commandstats").get("cmdstat_" + cmd, {}).get("calls", 0))


class Worker:
    """Runs Queue.work (on a client of its own) or AsyncQueue.work (in a
    loop of its own) in a thread until stop(), which checks it returns even
    while it waits for the breaker."""

    def __init__(self, port, name, policy, handler, use_async, **options):
        options = dict(consumer="w1", reclaim_every=0, promote_every=0.01, **options)
        self.thread = threading.Thread(target=self._run_async if use_async else self._run_sync,
                                       args=(port, name, policy, handler, options), daemon=True)
        self.stop_sync = threading.Event()
        self.loop = None
        self.stop_async = None
        self.thread.start()

    def _run_sync(self, port, name, policy, handler, options):
        c = redis.Redis(port=port)
        try:
            Queue(c, name).work(policy, handler, stop=self.stop_sync, **options)
        finally:
            c.close()

    def _run_async(self, port, name, policy, handler, options):
        async def main():
            self.stop_async = asyncio.Event()
            self.loop = asyncio.get_running_loop()
            c = redis.asyncio.Redis(port=port)
            try:
                await AsyncQueue(c, name).work(policy, handler, stop=self.stop_async, **options)
            finally:
                await (c.aclose() if hasattr(c, "aclose") else c.close())

        asyncio.run(main())

    def stop(self):
        self.stop_sync.set()
        until("the async worker to start", lambda: self.loop is not None or not self.thread.is_alive())
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.stop_async.set)
        self.thread.join(30)
        assert not self.thread.is_alive(), "the worker did not stop"


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_open_breaker_refuses_before_the_handler_and_stops_reading(redis_server, r, use_async):
    q = Queue(r, "stop")
    for i in range(10):
        q.enqueue("job-%d" % i, b"")
    calls, while_open = [0], [0]
    with backstop.load_policy(STOP_READING) as p:
        def handler(job):
            calls[0] += 1
            if p.circuit_state() == "open":
                while_open[0] += 1
            raise ConnectionRefusedError("connection refused")

        w = Worker(redis_server.port, "stop", p, handler, use_async, batch=1, block_ms=20)
        try:
            until("the first job deferred", lambda: counters(r, q).get("deferred:circuit_open") == 1)
            reads = command_calls(r, "xreadgroup")
            promotes = command_calls(r, "evalsha")
            # The promote loop runs on, 10 ms apart: a worker that kept
            # reading would have read the next job (20 ms blocks) long before.
            until("the promote loop to run on", lambda: command_calls(r, "evalsha") >= promotes + 20)
            assert command_calls(r, "xreadgroup") == reads, "the worker read while the breaker was open"
            assert (calls[0], while_open[0]) == (1, 0)
            c = counters(r, q)
            assert (c.get("attempts:deferred"), c.get("attempts:retry"), c.get("attempts:dead_letter")) == (1, None, None)
            [member] = r.zrange(q.keys.delayed, 0, -1)
            assert b'"attempt":1,' in member and b'"last_reason":"circuit_open"' in member
        finally:
            w.stop()


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_budget_refusal_defers_by_the_backoff(redis_server, r, use_async):
    """A job the retry budget refuses waits its own backoff, which the
    budget_exhausted decision carries in delay_ms (not a poll interval)."""
    q = Queue(r, "budget")
    before = int(time.time() * 1000)
    q.enqueue("job-0", b"")
    src = {"max_attempts": 5, "backoff": {"strategy": "constant", "base": "1h", "cap": "1h"}, "jitter": {"mode": "none"},
           "retry_budget": {"max_tokens": 1, "token_ratio": 0.1}}
    with backstop.load_policy(src) as p:
        def handler(job):
            raise ConnectionRefusedError("connection refused")

        w = Worker(redis_server.port, "budget", p, handler, use_async, batch=1, block_ms=20)
        try:
            until("the job deferred", lambda: counters(r, q).get("deferred:budget_exhausted") == 1)
            [(_, score)] = r.zrange(q.keys.delayed, 0, -1, withscores=True)
            assert score >= before + 3_600_000, "deferred until %d ms after enqueue, want the 1h backoff" % (score - before)
        finally:
            w.stop()


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("on_open", ["defer", "dead_letter"])
def test_outage_with_a_breaker(redis_server, r, on_open, use_async):
    q = Queue(r, "outage")
    for i in range(JOBS):
        q.enqueue("job-%d" % i, b"")
    down, down_calls, while_open = [True], [0], [0]
    with backstop.load_policy(outage(on_open)) as p:
        assert p.on_open == on_open

        def handler(job):
            if p.circuit_state() == "open":
                while_open[0] += 1
            if down[0]:
                down_calls[0] += 1
                raise ConnectionRefusedError("connection refused")

        w = Worker(redis_server.port, "outage", p, handler, use_async, batch=4, block_ms=20)
        try:
            if on_open == "dead_letter":
                # The old behaviour, kept on request: jobs are dead-lettered.
                until("dead letters", lambda: counters(r, q).get("attempts:dead_letter", 0) > 0)
                return
            # The outage lasts until the breaker has opened, half-opened and
            # reopened on a failed trial, and jobs have waited it out.
            until("deferrals across a reopened breaker",
                  lambda: counters(r, q).get("deferred:circuit_open", 0) >= JOBS and down_calls[0] >= 4)
            down[0] = False
            c = until("every job done", lambda: (lambda c: c.get("attempts:success") == JOBS and c)(counters(r, q)))
            assert r.xlen(q.keys.dlq) == 0 and "attempts:dead_letter" not in c, c
            assert while_open[0] == 0, "the handler ran while the breaker was open"
            assert c["attempts:deferred"] >= JOBS, c
        finally:
            w.stop()
