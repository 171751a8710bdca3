"""backstop.rabbitmq.sync (pika) against a real rabbitmq-server, and both
workers across a broker restart."""

import asyncio
import threading

import pika
import prometheus_client
import pytest

import backstop
from backstop import rabbitmq
from backstop.rabbitmq import sync

from conftest import until
from test_rabbitmq import FAST, HTTPError, qname, raw, sample


class Worker:
    """Queue.work in a thread until stop()."""

    def __init__(self, q, policy, handler, **options):
        self.stop_event = threading.Event()
        self.error = None

        def target():
            try:
                q.work(policy, handler, stop=self.stop_event, **options)
            except BaseException as e:  # noqa: B902 - reported by stop()
                self.error = e

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def stop(self, timeout=30):
        self.stop_event.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker did not stop"
        assert self.error is None, self.error


@pytest.fixture
def broker(rabbit):
    b = sync.connect(rabbit.url)
    yield b
    b.close()


@pytest.fixture
def policy():
    with backstop.load_policy(FAST) as p:
        yield p


def test_moves(rabbit, broker, policy):
    reg = prometheus_client.CollectorRegistry()
    q = broker.queue(qname("s"))
    q.declare()
    q.declare()
    q.enqueue("ok", b"payload", job_type="send_email")
    q.enqueue("bad", b"p2")
    seen = []

    def handle(job):
        seen.append(job)
        if job.id == "ok" and job.attempt == 1:
            raise HTTPError(503)
        if job.id == "bad":
            raise HTTPError(400)

    w = Worker(q, policy, handle, registry=reg)
    until("the retried job to succeed", lambda: len(seen) == 3 and q.stats().dlq == 1)
    w.stop()
    ok = [(j.attempt, j.last_reason, j.job_type, j.payload) for j in seen if j.id == "ok"]
    assert ok == [(1, "", "send_email", b"payload"), (2, "transient", "send_email", b"payload")]
    [dl] = q.inspect()
    assert (dl.id, dl.reason, dl.error, dl.attempt) == ("bad", "permanent_error", "HTTPError: HTTP 400", 1)
    until("the peeked dead letter back in the DLQ", lambda: q.stats()[:3] == (0, 0, 1))  # returns apply shortly
    assert sample(reg, "backstop_attempts_total", queue=q.name, outcome="success", job_type="send_email") == 1
    assert sample(reg, "backstop_dead_letters_total", queue=q.name, reason="permanent_error", job_type="") == 1

    assert q.replay(limit=1, reason="transient") == 0
    until("the dead letter back in the DLQ", lambda: q.stats().dlq == 1)
    assert q.replay(limit=1, actor="ann@ops1") == 1
    # Recorded in Q.audit with the actor, as Go's replay (issue 46).
    conn = pika.BlockingConnection(pika.URLParameters(rabbit.url))
    method, props, body = conn.channel().basic_get(q.name + ".audit", auto_ack=True)
    conn.close()
    assert method is not None and props.message_id == "bad" and body == b""
    h = props.headers
    assert (h["backstop-audit-action"], h["backstop-audit-actor"], h["backstop-reason"]) == ("replay", "ann@ops1", "permanent_error")
    assert len(str(h["backstop-audit-at-ms"])) == 13
    again = []
    w = Worker(q, policy, again.append)
    until("the replayed job", lambda: again)
    w.stop()
    assert [(j.id, j.attempt, j.last_reason) for j in again] == [("bad", 1, "permanent_error")]
    assert q.stats()[:3] == (0, 0, 0)


def test_malformed_and_crash_loop(rabbit, broker, policy):
    q = broker.queue(qname("s"), max_deliveries=2)
    q.declare()
    q.enqueue("poison", b"p")
    conn = pika.BlockingConnection(pika.URLParameters(rabbit.url))
    ch = conn.channel()
    for _ in range(2):  # a consumer that dies twice on it
        method = until("a delivery", lambda: ch.basic_get(q.name)[0])
        ch.basic_nack(method.delivery_tag, requeue=True)
    conn.close()
    raw(rabbit, q.name, b"no id", headers={"backstop-attempt": "1", "backstop-first-enqueued-ms": "1"})
    ran = []
    w = Worker(q, policy, ran.append)
    until("two dead letters", lambda: q.stats().dlq == 2)
    w.stop()
    assert ran == []
    dls = {d.payload: d for d in q.inspect()}
    assert (dls[b"no id"].id, dls[b"no id"].reason) == ("", "malformed")
    assert (dls[b"p"].id, dls[b"p"].reason) == ("poison", "crash_loop")
    assert q.replay(limit=10, reason="malformed") == 0  # no job id: it stays for a person


def test_stop_finishes_the_job_in_hand(broker, policy):
    q = broker.queue(qname("s"))
    q.enqueue("slow")
    started, release, done = threading.Event(), threading.Event(), []

    def handle(job):
        started.set()
        release.wait(30)
        done.append(job.id)

    w = Worker(q, policy, handle, prefetch=1)
    assert started.wait(30)
    w.stop_event.set()
    assert w.thread.is_alive()
    release.set()
    w.stop()
    assert done == ["slow"]
    assert q.stats()[:3] == (0, 0, 0)


def test_both_workers_reconnect_after_a_broker_restart(rabbit, broker, policy):
    """A broker restart mid-run: the asyncio and the sync worker connect
    again with backoff, and every job, enqueued before and after, ends."""
    qa, qs = qname("ra"), qname("rs")
    broker.queue(qa).declare()
    broker.queue(qs).declare()
    seen = {qa: set(), qs: set()}
    loop_ready = threading.Event()
    state = {}

    def run_async():
        async def main():
            b = await rabbitmq.connect(rabbit.url)
            state["loop"], state["task"] = asyncio.get_running_loop(), asyncio.current_task()
            loop_ready.set()
            try:
                await b.queue(qa).work(policy, lambda job: seen[qa].add(job.id))
            finally:
                await b.close()

        try:
            asyncio.run(main())
        except asyncio.CancelledError:
            pass

    t = threading.Thread(target=run_async, daemon=True)
    t.start()
    assert loop_ready.wait(30)
    w = Worker(broker.queue(qs), policy, lambda job: seen[qs].add(job.id))
    for name in (qa, qs):
        broker.queue(name).enqueue("before")
    until("the jobs before the restart", lambda: all("before" in s for s in seen.values()))

    rabbit.restart()
    for name in (qa, qs):
        broker.queue(name).enqueue("after")  # the broker's own connection is opened again
    until("the jobs after the restart", lambda: all("after" in s for s in seen.values()), timeout=60)

    w.stop()
    state["loop"].call_soon_threadsafe(state["task"].cancel)
    t.join(30)
    assert not t.is_alive()
    assert seen == {qa: {"before", "after"}, qs: {"before", "after"}}


def test_a_refused_topology_raises_instead_of_reconnecting(rabbit, broker, policy):
    name = qname("s")
    broker.queue(name, max_deliveries=5).declare()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="PRECONDITION_FAILED"):
        broker.queue(name, max_deliveries=3).work(policy, print, stop=threading.Event())

    async def body():
        b = await rabbitmq.connect(rabbit.url)
        try:
            with pytest.raises(Exception, match="PRECONDITION_FAILED"):
                await asyncio.wait_for(b.queue(name, max_deliveries=3).work(policy, print), 30)
        finally:
            await b.close()

    asyncio.run(body())


def test_policies_per_job_type(broker, policy):
    q = broker.queue(qname("s"))
    q.enqueue("card", b"", job_type="charge_card")
    q.enqueue("plain", b"")
    seen = []

    def handle(job):
        seen.append((job.id, job.attempt))
        raise TimeoutError("slow")

    with backstop.load_policy(dict(FAST, max_attempts=1)) as once:
        w = Worker(q, policy, handle, policies={"charge_card": once})
        until("both dead letters", lambda: q.stats().dlq == 2)
        w.stop()
    assert sorted(seen) == [("card", 1), ("plain", 1), ("plain", 2)]
