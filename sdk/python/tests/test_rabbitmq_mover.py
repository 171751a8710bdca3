"""The delay levels' moves (queue/rabbitmq/README.md, "The moves between
levels are the workers', not the broker's"): the release time, the hold
queues' topology, and the asyncio and sync workers' movers against a real
rabbitmq-server."""

import asyncio
import time
import uuid

import aio_pika

import backstop
from backstop.rabbitmq import _core, sync

from conftest import until, until_async
from test_rabbitmq import qname, run, stop
from test_rabbitmq_sync import Worker


def key(s):
    return ".".join(format(s, "018b"))


def policy_of(delay):
    return {"max_attempts": 2, "backoff": {"strategy": "constant", "base": delay, "cap": delay},
            "jitter": {"mode": "none"}}


def now_ms():
    return int(time.time() * 1000)


# -- the pure parts -------------------------------------------------------------


def test_release_time():
    r = 1_000_000
    # Held 2^n s from its receipt, at most.
    assert _core.release_ms(3, key(8), {}, r) == r + 8000
    assert _core.release_ms(0, key(1), None, r) == r + 1000
    # Earlier when its due time says it waited in the level for a mover:
    # due less the bits below n (here 2 s of key 10 = 8 + 2, at level 3).
    assert _core.release_ms(3, key(10), {"backstop-due-ms": str(r + 5000)}, r) == r + 3000
    assert _core.release_ms(3, key(10), {"backstop-due-ms": str(r + 20000)}, r) == r + 8000
    assert _core.release_ms(0, key(1), {"backstop-due-ms": str(r - 60000)}, r) == r - 60000  # past: at once
    # The due time as digits, bytes or an AMQP integer.
    assert _core.release_ms(1, key(3), {"backstop-due-ms": b"%d" % (r + 1500)}, r) == r + 500
    assert _core.release_ms(1, key(3), {"backstop-due-ms": r + 1500}, r) == r + 500
    # No valid due time, or not backstop's routing key: by the receipt alone.
    for h in ({"backstop-due-ms": "soon"}, {"backstop-due-ms": "-5"}, {"backstop-due-ms": 1.5}, {"backstop-due-ms": ""}):
        assert _core.release_ms(2, key(4), h, r) == r + 4000, h
    for k in ("", "a.b", ".".join(["1"] * 17), ".".join(["*"] * 18)):
        assert _core.release_ms(2, k, {"backstop-due-ms": str(r)}, r) == r + 4000, k


def test_low_bits_and_next_exchange():
    assert _core.low_seconds(0, key(2047)) == 0
    assert _core.low_seconds(3, key(0b1011101)) == 0b101
    assert _core.low_seconds(10, key(2047)) == 1023
    assert _core.low_seconds(4, "1.2.3") is None
    assert _core.next_exchange(0) == "backstop.delay.deliver"
    assert _core.next_exchange(10) == "backstop.delay.L9"
    h = {"backstop-due-ms": "5", "x-delivery-count": 2, "custom": b"\xff", "x-death": [{"reason": "expired"}]}
    pub = _core.moved(4, key(16), h)
    assert pub == ("backstop.delay.L3", key(16), {"backstop-due-ms": "5", "custom": b"\xff",
                                                  "x-death": [{"reason": "expired"}]})


def test_the_cap_hops_2047_s_then_the_job_is_delayed_again():
    assert _core.routing_key(3000 * 1000) == key(2047)
    assert _core.routing_key(2047 * 1000) == key(2047)
    assert _core.routing_key(2046 * 1000 + 1) == key(2047)
    # A job due in 1 h arrives after 2047 s and is delayed again for the
    # rest, without spending an attempt: never run early.
    now = 1_000_000_000
    job = _core.job_from("q", "j", {"backstop-attempt": "2", "backstop-first-enqueued-ms": str(now),
                                    "backstop-due-ms": str(now + 3600_000)}, b"", None)
    with backstop.load_policy(policy_of("1s")) as policy:
        at = now + 2047_000
        step = _core.triage(job, policy, 5, _core.Kept(), at)
        assert step.early and step.plan is None
        pub = _core.early("q", job, at)
        assert pub.routing_key == key(3600 - 2047) and pub.headers["backstop-attempt"] == "2"
        assert pub.headers["backstop-due-ms"] == str(now + 3600_000)


def test_the_hold_queues_replace_the_ttl_levels_below_the_cap():
    t = _core.SHARED
    queues = dict(t.queues)
    bound = {(q, x, k) for q, x, k, _ in t.queue_bindings}
    for n in range(_core.HOLD_LEVELS):
        assert queues[_core.hold(n)] == {"x-queue-type": "quorum"}
        pattern = ".".join("1" if 17 - i == n else "*" for i in range(18))
        assert (_core.hold(n), _core.level(n), pattern) in bound
        assert (_core.level(n), _core.level(n), pattern) in t.queue_unbindings
        assert (_core.level(n), _core.level(n), pattern) not in bound
    for n in range(_core.LEVELS):  # the first topology's queues, as before
        assert queues[_core.level(n)]["x-message-ttl"] == (1 << n) * 1000
        assert queues[_core.level(n)]["x-dead-letter-exchange"] == _core.next_exchange(n)
    assert {q for q, _, _, _ in t.queue_bindings if q.startswith("backstop.delay.")} == {
        _core.level(n) for n in range(_core.HOLD_LEVELS, _core.LEVELS)}


# -- against a broker -----------------------------------------------------------


async def _taps(ch, levels):
    """An exclusive queue per exchange L<n>, with the pattern of its hold
    queue: a copy of every message that reaches hold.L<n>."""
    out = {}
    for n in levels:
        tap = await ch.declare_queue(exclusive=True)
        await tap.bind(_core.level(n), ".".join("1" if 17 - i == n else "*" for i in range(18)))
        out[n] = tap
    return out


async def _copies(tap, job_id):
    n = 0
    while True:
        m = await tap.get(no_ack=True, fail=False)
        if m is None:
            return n
        n += m.message_id == job_id


def _check_the_retry(seen, copies):
    """3 s (bits 1 and 0): hold.L1, then hold.L0, then the work queue, never
    before due, never through a TTL level (which would add x-death)."""
    (first, _), (again, at) = seen
    due = int(again.headers["backstop-due-ms"])
    assert (first.attempt, again.attempt) == (1, 2)
    assert at >= due, "ran %d ms early" % (due - at)
    assert "x-death" not in again.headers and again.delivery_count == 0
    assert copies == {1: 1, 0: 1}


def test_a_retry_hops_the_hold_queues_and_runs_no_earlier_than_due(rabbit):
    seen = []
    job_id = uuid.uuid4().hex

    async def body(b):
        q = b.queue(qname("m"))
        await q.declare()
        conn = await aio_pika.connect(rabbit.url)
        async with conn:
            taps = await _taps(await conn.channel(), (1, 0))
            await q.enqueue(job_id, b"")

            async def handle(job):
                seen.append((job, now_ms()))
                if job.attempt == 1:
                    raise TimeoutError("down")

            with backstop.load_policy(policy_of("3s")) as policy:
                w = asyncio.ensure_future(q.work(policy, handle))
                await until_async("the retry", lambda: len(seen) == 2, timeout=60)
                await stop(w)
            return {n: await _copies(t, job_id) for n, t in taps.items()}

    _check_the_retry(seen, run(rabbit, body))


def test_the_sync_worker_moves_a_retry_too(rabbit):
    seen = []
    job_id = uuid.uuid4().hex
    b = sync.connect(rabbit.url)

    async def tap_and_count(wait):
        conn = await aio_pika.connect(rabbit.url)
        async with conn:
            taps = await _taps(await conn.channel(), (1, 0))
            await asyncio.to_thread(wait)
            return {n: await _copies(t, job_id) for n, t in taps.items()}

    def wait():
        q = b.queue(qname("m"))
        q.enqueue(job_id, b"")

        def handle(job):
            seen.append((job, now_ms()))
            if job.attempt == 1:
                raise TimeoutError("down")

        with backstop.load_policy(policy_of("3s")) as policy:
            w = Worker(q, policy, handle)
            until("the retry", lambda: len(seen) == 2, timeout=60)
            w.stop()

    try:
        copies = asyncio.run(tap_and_count(wait))
    finally:
        b.close()
    _check_the_retry(seen, copies)


def test_a_mover_that_loses_its_channel_loses_nothing(rabbit):
    seen = []
    job_id = uuid.uuid4().hex

    async def body(b):
        q = b.queue(qname("m"))
        await q.enqueue(job_id, b"")

        async def handle(job):
            seen.append((job, now_ms()))
            if job.attempt == 1:
                raise TimeoutError("down")

        with backstop.load_policy(policy_of("4s")) as policy:
            w = asyncio.ensure_future(q.work(policy, handle))
            held = lambda: b._mover is not None and job_id in {m.message_id for m in b._mover.held.values()}
            await until_async("the mover to hold the retry", held)
            first = b._mover.channel
            await first.close()  # what it held goes back to hold.L2
            await until_async("the mover to hold it again", lambda: held() and b._mover.channel is not first)
            await until_async("the retry", lambda: len(seen) == 2, timeout=60)
            await stop(w)

    run(rabbit, body)
    (_, _), (again, at) = seen
    assert again.attempt == 2 and at >= int(again.headers["backstop-due-ms"])
    assert again.delivery_count == 0  # the hold queue's redelivery is not the work queue's
