"""The handler deadline of the RabbitMQ workers (asyncio and threads) against
a real rabbitmq-server: a handler longer than the connection's heartbeat
timeout runs once and is acked (the worker keeps the heartbeats going), and
a handler past handler_timeout is retried through the delays as a timeout,
once."""

import asyncio
import logging
import threading
import time

import prometheus_client
import pytest

import backstop
from backstop import rabbitmq
from backstop.rabbitmq import sync

from conftest import until, until_async
from test_rabbitmq import FAST, qname, sample
from test_rabbitmq_sync import Worker

HEARTBEAT_S = 1  # negotiated: the broker drops a connection silent for about two of them


class Warnings(logging.Handler):
    """The backstop.rabbitmq records at WARNING and above while installed."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())

    def __enter__(self):
        logging.getLogger("backstop.rabbitmq").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("backstop.rabbitmq").removeHandler(self)


def run_worker(rabbit, mode, q_name, handler, done, **options):
    """The worker of mode on queue q_name, with a HEARTBEAT_S heartbeat,
    until done(queue, registry) holds; returns the registry."""
    url = rabbit.url + "?heartbeat=%d" % HEARTBEAT_S
    reg = prometheus_client.CollectorRegistry()
    with backstop.load_policy(FAST) as p:
        if mode == "sync":
            b = sync.connect(url)
            try:
                q = b.queue(q_name)
                q.enqueue("job-1", b"x")
                w = Worker(q, p, handler, registry=reg, **options)
                until("the job's outcome", lambda: done(q, reg), timeout=60)
                w.stop()
            finally:
                b.close()
            return reg

        async def main():
            b = await rabbitmq.connect(url)
            try:
                q = b.queue(q_name)
                await q.enqueue("job-1", b"x")
                w = asyncio.ensure_future(q.work(p, handler, registry=reg, **options))

                async def check():
                    return done(q, reg)

                await until_async("the job's outcome", check, timeout=60)
                w.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await w
            finally:
                await b.close()

        asyncio.run(main())
        return reg


def acked(q, reg):
    return sample(reg, "backstop_attempts_total", queue=q.name, outcome="success", job_type="") == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_handler_past_the_heartbeat_timeout_runs_once(rabbit, mode):
    ran = []

    def work(job):
        ran.append(job.attempt)
        time.sleep(4 * HEARTBEAT_S)  # the job's work: past the heartbeat timeout

    async def awork(job):
        ran.append(job.attempt)
        await asyncio.sleep(4 * HEARTBEAT_S)

    with Warnings() as w:
        run_worker(rabbit, mode, qname("hb"), work if mode == "sync" else awork, acked)
    assert ran == [1]
    assert w.records == []  # no connection lost, no outcome kept for a redelivery


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_handler_past_its_deadline_is_retried_once_as_a_timeout(rabbit, mode):
    seen = []
    release = threading.Event()

    def hang(job):
        seen.append((job.attempt, job.last_reason, job.last_error))
        if job.attempt == 1:
            release.wait()

    async def ahang(job):
        seen.append((job.attempt, job.last_reason, job.last_error))
        if job.attempt == 1:
            await asyncio.Event().wait()

    try:
        with Warnings() as w:
            run_worker(rabbit, mode, qname("dl"), hang if mode == "sync" else ahang, acked, handler_timeout=0.3)
    finally:
        release.set()
    assert seen == [(1, "", ""), (2, "transient", "DeadlineExceeded: handler deadline exceeded after 300ms")]
    [warning] = w.records
    assert "handler deadline exceeded after 300ms, failed as a timeout" in warning
