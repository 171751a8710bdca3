"""backstop.rabbitmq (asyncio, aio-pika) against a real rabbitmq-server
(conftest.py's session broker): the moves of queue/rabbitmq/README.md,
malformed messages, crash loops, deferral, early arrivals, bounded replay,
graceful shutdown. Each test works on queues of its own."""

import asyncio
import time
import uuid

import aio_pika
import prometheus_client
import pytest

import backstop
from backstop import rabbitmq
from backstop.rabbitmq import _core

from conftest import until_async

FAST = {"max_attempts": 2, "backoff": {"strategy": "constant", "base": "1s", "cap": "1s"}, "jitter": {"mode": "none"}}


class HTTPError(Exception):
    def __init__(self, status):
        super().__init__("HTTP %d" % status)
        self.status = status


def qname(prefix="t"):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:10])


def run(rabbit, body):
    """Runs body(broker) in a fresh event loop on the session broker."""

    async def main():
        b = await rabbitmq.connect(rabbit.url)
        try:
            return await body(b)
        finally:
            await b.close()

    return asyncio.run(main())


async def stop(task):
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def raw(rabbit, queue, body=b"x", message_id=None, headers=None):
    """Publishes a message by hand, to the default exchange (with pika:
    aio-pika gives every message an id)."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(rabbit.url))
    try:
        conn.channel().basic_publish("", queue, body, pika.BasicProperties(message_id=message_id, headers=headers))
    finally:
        conn.close()


def sample(reg, name, **labels):
    return reg.get_sample_value(name, labels) or 0


def test_routing_key_rounds_up_and_caps():
    assert _core.routing_key(0) == ".".join(["0"] * 18)
    assert _core.routing_key(1) == ".".join(["0"] * 17 + ["1"])  # 1 ms: a whole second, never early
    assert _core.routing_key(5000) == ".".join(["0"] * 15 + ["1", "0", "1"])
    assert _core.routing_key(10**12) == ".".join(["0"] * 7 + ["1"] * 11)  # 2^11 - 1 s: the rest is delayed again on arrival
    t = _core.topology("emails", 5)
    assert dict(t.queues)["emails"]["x-delivery-limit"] == 7


def test_retry_then_success_then_dead_letter(rabbit):
    reg = prometheus_client.CollectorRegistry()
    seen = []

    async def body(b):
        q = b.queue(qname())
        await q.declare()
        await q.declare()  # idempotent
        await q.enqueue("ok", b"payload", job_type="send_email", content_type="application/json")
        await q.enqueue("bad", "p2")

        async def handle(job):
            seen.append(job)
            if job.id == "ok" and job.attempt == 1:
                raise HTTPError(503)
            if job.id == "bad":
                raise HTTPError(400)

        with backstop.load_policy(FAST) as policy:
            w = asyncio.ensure_future(q.work(policy, handle, registry=reg))
            await until_async("the retried job to run again", lambda: len(seen) == 3)
            await until_async("the DLQ to hold the permanent error", lambda: _dlq(q, 1))
            await stop(w)
        [dl] = await q.inspect(10)
        # A peek: the broker applies the return shortly.
        await until_async("the dead letter back in the DLQ", lambda: _dlq(q, 1))
        st = await q.stats()
        return q, dl, st

    q, dl, st = run(rabbit, body)
    ok = [j for j in seen if j.id == "ok"]
    assert [(j.attempt, j.last_reason, j.last_error) for j in ok] == [(1, "", ""), (2, "transient", "HTTPError: HTTP 503")]
    assert all(j.payload == b"payload" and j.job_type == "send_email" and j.content_type == "application/json" for j in ok)
    assert ok[1].first_enqueued_ms == ok[0].first_enqueued_ms and ok[1].prev_delay_ms == 1000
    assert (dl.id, dl.reason, dl.error, dl.attempt, dl.payload, dl.destination) == (
        "bad", "permanent_error", "HTTPError: HTTP 400", 1, b"p2", q.name)
    assert st[:3] == (0, 0, 1)  # inspect returned it
    n = q.name
    assert sample(reg, "backstop_attempts_total", queue=n, outcome="success", job_type="send_email") == 1
    assert sample(reg, "backstop_attempts_total", queue=n, outcome="retry", job_type="send_email") == 1
    assert sample(reg, "backstop_retries_total", queue=n, reason="transient", job_type="send_email") == 1
    assert sample(reg, "backstop_dead_letters_total", queue=n, reason="permanent_error", job_type="") == 1
    assert sample(reg, "backstop_job_attempts_bucket", queue=n, outcome="success", job_type="send_email", le="2.0") == 1
    assert sample(reg, "backstop_job_attempts_bucket", queue=n, outcome="success", job_type="send_email", le="1.0") == 0
    assert sample(reg, "backstop_client_attempts_total", policy="default", target=n, outcome="success") == 1


async def _dlq(q, n):
    return (await q.stats()).dlq == n


def test_max_attempts_reached(rabbit):
    reg = prometheus_client.CollectorRegistry()
    seen = []

    async def body(b):
        q = b.queue(qname())
        await q.enqueue("j", b"")

        async def handle(job):
            seen.append(job.attempt)
            raise TimeoutError("slow")

        with backstop.load_policy(FAST) as policy:
            w = asyncio.ensure_future(q.work(policy, handle, registry=reg))
            await until_async("the dead letter", lambda: _dlq(q, 1))
            await stop(w)
        return q, await q.inspect()

    q, [dl] = run(rabbit, body)
    assert seen == [1, 2]
    assert (dl.reason, dl.attempt, dl.error) == ("max_attempts_reached", 2, "TimeoutError: slow")
    assert sample(reg, "backstop_max_attempts_reached_total", queue=q.name, job_type="") == 1


def test_malformed_messages_are_dead_lettered_not_run(rabbit):
    ran = []

    async def body(b):
        q = b.queue(qname())
        await q.declare()
        now = str(int(time.time() * 1000))
        raw(rabbit, q.name, b"no id", headers={"backstop-attempt": "1", "backstop-first-enqueued-ms": now})
        raw(rabbit, q.name, b"bad attempt", message_id="a",
                  headers={"backstop-attempt": "zero", "backstop-first-enqueued-ms": now, "custom": "kept"})
        raw(rabbit, q.name, b"no first", message_id="b", headers={"backstop-first-enqueued-ms": now})
        raw(rabbit, q.name, b"no attempt", message_id="c", headers={"backstop-attempt": "1"})
        # Neither header: not malformed but a plain producer's job, run.
        raw(rabbit, q.name, b"\xff\xfe", message_id="d")
        with backstop.load_policy(FAST) as policy:
            w = asyncio.ensure_future(q.work(policy, ran.append))
            await until_async("four dead letters", lambda: _dlq(q, 4))
            await until_async("the plain job", lambda: ran)
            await stop(w)
        return await q.inspect(10)

    dls = run(rabbit, body)
    assert [(j.id, j.attempt, j.payload, j.malformed) for j in ran] == [("d", 1, b"\xff\xfe", False)]
    assert sorted(d.payload for d in dls) == sorted([b"no id", b"bad attempt", b"no first", b"no attempt"])
    assert {d.reason for d in dls} == {"malformed"}
    assert all(d.error == _core.MALFORMED for d in dls)
    [noid] = [d for d in dls if d.payload == b"no id"]
    assert noid.id == ""  # still without a job id: it stays in the DLQ for a person
    [a] = [d for d in dls if d.id == "a"]
    assert a.headers["custom"] in ("kept", b"kept")


def test_crash_loop_by_delivery_count_and_by_the_broker(rabbit):
    ran = []

    async def body(b):
        q = b.queue(qname(), max_deliveries=3)
        await q.enqueue("poison", b"p")
        # A consumer that keeps dying: the delivery comes back each time.
        conn = await aio_pika.connect(rabbit.url)
        async with conn:
            ch = await conn.channel()
            raw_q = await ch.get_queue(q.name, ensure=False)
            for _ in range(3):
                m = await until_async("a delivery", lambda: raw_q.get(fail=False))
                await m.nack(requeue=True)
        with backstop.load_policy(FAST) as policy:
            w = asyncio.ensure_future(q.work(policy, ran.append))
            await until_async("the crash loop's dead letter", lambda: _dlq(q, 1))
            await q.enqueue("fine", b"f")  # the queue is not blocked
            await until_async("the next job", lambda: len(ran) == 1)
            await stop(w)
        [dl] = await q.inspect()

        # Past x-delivery-limit (max_deliveries + 2) the broker moves it.
        await q.enqueue("dies-before-dead-lettering", b"d")
        conn = await aio_pika.connect(rabbit.url)
        async with conn:
            ch = await conn.channel()
            raw_q = await ch.get_queue(q.name, ensure=False)
            while (await q.stats()).dlq < 2:
                m = await raw_q.get(fail=False)
                if m is not None:
                    await m.nack(requeue=True)
        dls = await q.inspect()
        return dl, dls

    dl, dls = run(rabbit, body)
    assert [j.id for j in ran] == ["fine"]
    assert (dl.id, dl.reason, dl.error) == (
        "poison", "crash_loop", "crash loop: delivered 4 times without an outcome (max deliveries 3)")
    assert {(d.id, d.reason) for d in dls} == {("poison", "crash_loop"), ("dies-before-dead-lettering", "crash_loop")}


def test_open_breaker_defers_without_spending_an_attempt(rabbit):
    reg = prometheus_client.CollectorRegistry()
    seen = []
    spec = {"max_attempts": 3, "backoff": {"strategy": "constant", "base": "1s", "cap": "1s"}, "jitter": {"mode": "none"},
            "circuit_breaker": {"failure_threshold": 1, "open_for": "1s"}}

    async def body(b):
        q = b.queue(qname())
        await q.enqueue("fails", b"")

        async def handle(job):
            seen.append((job, int(time.time() * 1000)))
            if len(seen) == 1:
                raise TimeoutError("down")  # opens the breaker: this job is deferred too

        with backstop.load_policy(spec) as policy:
            w = asyncio.ensure_future(q.work(policy, handle, registry=reg))
            await until_async("the failure", lambda: len(seen) == 1)
            await q.enqueue("waits", b"")  # the breaker is open: deferred, not run
            # fails back (deferred by the breaker it opened) and waits run:
            # in either order, so wait for both.
            await until_async("fails again and waits", lambda: [j.id for j, _ in seen].count("fails") == 2
                              and any(j.id == "waits" for j, _ in seen), timeout=60)
            await stop(w)
        return q

    q = run(rabbit, body)
    (first, opened_at) = seen[0]  # the breaker opened after this
    assert (first.id, first.attempt) == ("fails", 1)
    # The job that opened the breaker was deferred by it: back once, no attempt spent.
    assert [(j.attempt, j.last_reason) for j, _ in seen[1:] if j.id == "fails"] == [(1, "circuit_open")]
    # waits ran once, on attempt 1, and not before the breaker could half-open
    # (never early). Whether it reached the worker while the breaker was open
    # (deferred: last reason circuit_open, a refusal counted) depends on how
    # soon it was delivered, which nothing bounds: both ways are right.
    [(waits, at)] = [(j, at) for j, at in seen if j.id == "waits"]
    assert waits.attempt == 1 and waits.last_reason in ("", "circuit_open")
    assert at >= opened_at + 1000, "waits ran %d ms before the breaker could half-open" % (opened_at + 1000 - at)
    assert sample(reg, "backstop_deferrals_total", queue=q.name, reason="circuit_open", job_type="") >= 1
    refused = sample(reg, "backstop_client_calls_refused_total", policy="default", target=q.name, reason="circuit_open")
    assert refused >= (1 if waits.last_reason == "circuit_open" else 0)


def test_a_job_that_arrives_early_is_delayed_again(rabbit):
    ran = []

    async def body(b):
        q = b.queue(qname())
        await q.declare()
        due = int(time.time() * 1000) + 1500
        raw(rabbit, q.name, b"", message_id="early", headers={
            "backstop-attempt": "2", "backstop-first-enqueued-ms": str(due - 5000), "backstop-due-ms": str(due)})
        with backstop.load_policy(FAST) as policy:
            w = asyncio.ensure_future(q.work(policy, lambda job: ran.append((job, int(time.time() * 1000)))))
            await until_async("the job", lambda: ran)
            await stop(w)
        return due

    due = run(rabbit, body)
    [(job, at)] = ran
    assert job.attempt == 2 and at >= due  # never early, no attempt spent


def test_replay_is_bounded_and_reaches_the_original_queue_only(rabbit):
    async def body(b):
        q = b.queue(qname())
        await q.declare()
        conn = await aio_pika.connect(rabbit.url)
        async with conn:
            ch = await conn.channel()
            # A topic exchange that fans out to q and to another consumer's queue.
            topic = await ch.declare_exchange(qname("events"), aio_pika.ExchangeType.TOPIC, auto_delete=True)
            other = await ch.declare_queue(qname("other"), auto_delete=True)
            await other.bind(topic, "#")
            await (await ch.get_queue(q.name, ensure=False)).bind(topic, "#")
            for i in range(5):
                await q.enqueue("j%d" % i, b"%d" % i)

            async def fail(job):
                raise HTTPError(404 if job.id == "j4" else 400)

            with backstop.load_policy(FAST) as policy:
                w = asyncio.ensure_future(q.work(policy, fail))
                await until_async("five dead letters", lambda: _dlq(q, 5))
                await stop(w)
            assert await q.replay(limit=2, actor="ann@ops1") == 2
            # Each recorded in Q.audit with the actor, as Go's replay (issue 46).
            audit = await ch.get_queue(q.name + ".audit", ensure=False)
            for _ in range(2):
                rec = await audit.get(no_ack=True)
                assert rec.body == b"" and rec.message_id.startswith("j")
                assert (rec.headers["backstop-audit-action"], rec.headers["backstop-audit-actor"]) == ("replay", "ann@ops1")
            assert await audit.get(no_ack=True, fail=False) is None
            st = await q.stats()
            assert (st.ready, st.dlq) == (2, 3)
            assert await q.replay(limit=10, reason="no_such_reason") == 0
            await until_async("the unmatched dead letters back", lambda: _dlq(q, 3))
            assert await q.replay(limit=10, keep_attempts=True) == 3
            assert (await other.declare()).message_count == 0
            seen = []
            with backstop.load_policy(FAST) as policy:
                w = asyncio.ensure_future(q.work(policy, seen.append))
                await until_async("the replayed jobs", lambda: len(seen) == 5)
                await stop(w)
            return seen

    seen = run(rabbit, body)
    assert {j.id for j in seen} == {"j0", "j1", "j2", "j3", "j4"}
    assert {(j.attempt, j.last_reason) for j in seen} == {(1, "permanent_error")}
    assert all(j.last_error == "" for j in seen)


def test_cancel_finishes_the_jobs_in_flight(rabbit):
    async def body(b):
        q = b.queue(qname())
        started, release, done = asyncio.Event(), asyncio.Event(), []
        await q.enqueue("slow", b"")

        async def handle(job):
            started.set()
            await release.wait()
            done.append(job.id)

        with backstop.load_policy(FAST) as policy:
            w = asyncio.ensure_future(q.work(policy, handle))
            await asyncio.wait_for(started.wait(), 30)
            w.cancel()
            # The cancellation is delivered (the worker's task wakes up to
            # it) while the job still runs.
            await asyncio.wait({w}, timeout=0.05)
            assert not w.done()
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(w, 30)
        return done, await q.stats()

    done, st = run(rabbit, body)
    assert done == ["slow"]
    assert st[:3] == (0, 0, 0)  # acked: not returned to the queue


def test_kept_outcome_is_applied_without_running_again():
    kept = _core.Kept(size=2)
    job = _core.job_from("q", "j", {"backstop-attempt": "3", "backstop-first-enqueued-ms": "1"}, b"", None)
    plan = ("dead_letter", "permanent_error", None, "E", 0)
    kept.keep(job, plan, False)
    with backstop.load_policy(FAST) as policy:
        step = _core.triage(job, policy, 5, kept, 10)
        assert step == (plan, False, False, True, False, False, 0)
        assert _core.triage(job, policy, 5, kept, 10).plan is None  # applied once
    for i in range(3):
        kept.keep(_core.job_from("q", "k%d" % i, {"backstop-attempt": "1", "backstop-first-enqueued-ms": "1"}, b"",
                                 None), plan, True)
    assert len(kept) == 2


def test_arguments_are_checked(rabbit):
    async def body(b):
        with pytest.raises(ValueError, match="queue: name"):
            b.queue("")
        with pytest.raises(ValueError, match="max_deliveries"):
            b.queue("x", max_deliveries=0)
        q = b.queue(qname())
        with pytest.raises(ValueError, match="enqueue: job_id"):
            await q.enqueue("", b"")
        with pytest.raises(TypeError, match="payload"):
            await q.enqueue("j", 5)
        with pytest.raises(ValueError, match="enqueue: job_type"):
            await q.enqueue("j", b"", job_type="no spaces")
        with pytest.raises(ValueError, match="replay: limit"):
            await q.replay(limit=0)
        with pytest.raises(ValueError, match="work: prefetch"):
            with backstop.load_policy(FAST) as policy:
                await q.work(policy, print, prefetch=0)

    run(rabbit, body)


def test_stats_counts_the_delay_levels(rabbit):
    # A retry of 3000 s, above the cap: it hops the levels for 2^11 - 1 s
    # (entering at hold.L10) and is delayed again for the rest on arrival.
    slow = {"max_attempts": 2, "backoff": {"strategy": "constant", "base": "3000s", "cap": "3000s"},
            "jitter": {"mode": "none"}}
    ran = []

    async def body(b):
        q = b.queue(qname())
        await q.enqueue("later", b"")

        async def fail(job):
            ran.append(int(time.time() * 1000))
            raise TimeoutError("down")

        with backstop.load_policy(slow) as policy:
            w = asyncio.ensure_future(q.work(policy, fail))
            await until_async("the job to run", lambda: ran)
            await stop(w)  # graceful: its retry is confirmed first
        # No mover runs now: what the levels hold is ready, and counted.
        before = (await q.stats()).delay_levels
        conn = await aio_pika.connect(rabbit.url)
        async with conn:
            ch = await conn.channel()
            hold = await ch.get_queue(_core.hold(10), ensure=False)
            others, mine = [], None
            while mine is None:
                m = await until_async("the retry in hold.L10", lambda: hold.get(fail=False))
                if m.headers.get("backstop-destination") == q.name:
                    mine = m
                else:
                    others.append(m)
            for m in others:
                await m.nack(requeue=True)
            await mine.ack()
            await until_async("the retry gone from the count", lambda: _levels_are(q, before - 1))
        return q, mine, await q.stats()

    q, mine, st = run(rabbit, body)
    assert (st.ready, st.dlq) == (0, 0)
    assert mine.routing_key == _core.routing_key(2047 * 1000) == ".".join(["0"] * 7 + ["1"] * 11)
    assert int(mine.headers["backstop-due-ms"]) >= ran[0] + 3000 * 1000


async def _levels_are(q, n):
    return (await q.stats()).delay_levels == n


def test_an_outcome_kept_across_a_lost_connection_is_applied_without_running_again(rabbit):
    ran = []

    async def body(b):
        q = b.queue(qname())
        await q.enqueue("j", b"")
        lost = asyncio.Event()

        async def handle(job):
            ran.append(job)
            await lost.wait()
            raise HTTPError(400)

        with backstop.load_policy(FAST) as policy:
            w = asyncio.ensure_future(q.work(policy, handle))
            await until_async("the job to run", lambda: ran)
            await b._conn.close()  # the connection goes while the job runs: its outcome cannot be applied
            lost.set()
            await until_async("the dead letter", lambda: _dlq(q, 1))
            await stop(w)
        return await q.inspect()

    [dl] = run(rabbit, body)
    assert len(ran) == 1  # the redelivery took the kept outcome
    assert (dl.id, dl.reason, dl.attempt) == ("j", "permanent_error", 1)


def test_policies_per_job_type(rabbit):
    # charge_card gives up after 1 attempt under its own policy; the
    # untyped job gets work's policy (2 attempts). The type's policy is
    # also the one counted (policy label = the type).
    reg = prometheus_client.CollectorRegistry()
    seen = []

    async def body(b):
        q = b.queue(qname())
        await q.enqueue("card", b"", job_type="charge_card")
        await q.enqueue("plain", b"")

        async def handle(job):
            seen.append((job.id, job.attempt))
            raise TimeoutError("slow")

        with backstop.load_policy(FAST) as policy, backstop.load_policy(dict(FAST, max_attempts=1)) as once:
            w = asyncio.ensure_future(q.work(policy, handle, registry=reg, policies={"charge_card": once}))
            await until_async("both dead letters", lambda: _dlq(q, 2))
            await stop(w)
        return q

    q = run(rabbit, body)
    assert sorted(seen) == [("card", 1), ("plain", 1), ("plain", 2)]
    assert sample(reg, "backstop_client_attempts_total", policy="charge_card", target=q.name, outcome="dead_letter") == 1
    assert sample(reg, "backstop_max_attempts_reached_total", queue=q.name, job_type="charge_card") == 1
    with pytest.raises(TypeError, match="policies"):
        run(rabbit, lambda b: b.queue(qname()).work(None, print, policies=["charge_card"]))


def test_a_stalled_mover_shows_in_the_retry_latency(rabbit):
    """What a stalled mover delivers shows in the measured retry latency
    (as Go's TestRetryLatencyShowsStalledMover): attempt 2 of a job that
    failed 5 s ago with a 10 ms delay; a job deferred since its failure
    (last reason circuit_open) is not measured."""
    reg = prometheus_client.CollectorRegistry()
    ran = []

    async def body(b):
        q = b.queue(qname())
        await q.declare()
        due = int(time.time() * 1000) - 5000
        for job_id, reason in (("deferred", "circuit_open"), ("stalled", "transient")):
            raw(rabbit, q.name, b"", message_id=job_id, headers={
                "backstop-attempt": "2", "backstop-first-enqueued-ms": str(due - 10), "backstop-due-ms": str(due),
                "backstop-prev-delay-ms": "10", "backstop-last-reason": reason, "backstop-destination": q.name})
        with backstop.load_policy(FAST) as policy:
            w = asyncio.ensure_future(q.work(policy, lambda job: ran.append(job.id), registry=reg))
            await until_async("both jobs", lambda: len(ran) == 2)
            await stop(w)
        return q.name

    name = run(rabbit, body)
    labels = dict(policy="default", target=name)
    assert sample(reg, "backstop_client_retry_latency_seconds_count", **labels) == 1
    assert sample(reg, "backstop_client_retry_latency_seconds_sum", **labels) >= 5
