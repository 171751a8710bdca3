"""Issue 45: the Python workers' movers answer a run's commands (the
backstop.run exchange: Go's Queue.Run, ``backstop queue run --amqp.url``,
Node's ``run()``; queue/rabbitmq/README.md, "Run a delayed job now"),
against a real rabbitmq-server: the held delayed jobs a command selects are
counted, then taken (at most its limit, earliest due first), published to
their work queue with their attempt kept and no due time, and run."""

import asyncio
import threading
import time

import pika
import pytest

import backstop
from backstop import rabbitmq
from backstop.rabbitmq import _core, sync

from conftest import until, until_async
from test_rabbitmq import FAST, qname

HOUR_MS = 3_600_000


def run_held(url, queue, before_ms, limit):
    """What Go's Queue.Run asks the movers (runHeld), with pika: every
    mover counts, then those with matches take in turn. Returns (moved,
    left, answers)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        movers = ch.queue_declare("backstop.hold.L0", passive=True).method.consumer_count
        replies = []
        ch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, b: replies.append(p), auto_ack=True)
        base = {"backstop-run-queue": queue, "backstop-run-due-before-ms": str(before_ms)}

        def ask(exchange, key, op, corr, n):
            ch.basic_publish(exchange, key, b"", pika.BasicProperties(
                reply_to="amq.rabbitmq.reply-to", correlation_id=corr,
                headers=dict(base, **{"backstop-run-op": op, "backstop-run-limit": str(n)})))

        def wait(n):
            deadline = time.monotonic() + 5
            while len(replies) < n and time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.05)

        ask("backstop.run", "", "count", "count", 0)
        wait(movers)
        counted = [(p.headers["backstop-run-mover"], int(p.headers["backstop-run-matched"])) for p in replies]
        assert len(counted) == movers, "%d of %d movers answered" % (len(counted), movers)
        moved = left = 0
        for mover, matched in counted:
            if matched == 0:
                continue
            if moved >= limit:
                left += matched
                continue
            replies.clear()
            ask("", mover, "take", "take", limit - moved)
            wait(1)
            h = replies[0].headers
            moved += int(h["backstop-run-moved"])
            left += int(h["backstop-run-matched"]) - int(h["backstop-run-moved"])
        return moved, left, len(counted)
    finally:
        conn.close()


def held_by_mover(url):
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return conn.channel().queue_declare("backstop.hold.L10", passive=True).method.message_count == 0
    finally:
        conn.close()


@pytest.fixture
def policy():
    with backstop.load_policy(FAST) as p:
        yield p


def test_sync_mover_answers_a_run(rabbit, policy):
    b = sync.connect(rabbit.url)
    try:
        q = b.queue(qname("run"))
        for i in ("a", "b", "c"):
            q.enqueue(i, i.encode(), delay=3600)
        ran, stop = [], threading.Event()
        t = threading.Thread(target=q.work, args=(policy, ran.append), kwargs=dict(stop=stop), daemon=True)
        t.start()
        until("the delayed jobs held by the mover", lambda: held_by_mover(rabbit.url))
        now = int(time.time() * 1000)
        assert run_held(rabbit.url, q.name, now, 10)[:2] == (0, 0)  # none due yet
        assert run_held(rabbit.url, q.name, now + 2 * HOUR_MS, 2)[:2] == (2, 1)
        until("two ran", lambda: len(ran) == 2)
        assert run_held(rabbit.url, q.name, now + 2 * HOUR_MS, 10)[:2] == (1, 0)
        until("three ran", lambda: len(ran) == 3)
        stop.set()
        t.join(30)
        assert sorted((j.id, j.attempt, bytes(j.payload)) for j in ran) == [("a", 1, b"a"), ("b", 1, b"b"), ("c", 1, b"c")]
    finally:
        b.close()


def test_asyncio_mover_answers_a_run(rabbit, policy):
    async def main():
        b = await rabbitmq.connect(rabbit.url)
        try:
            q = b.queue(qname("run"))
            for i in ("a", "b", "c"):
                await q.enqueue(i, i.encode(), delay=3600)
            ran = []
            task = asyncio.ensure_future(q.work(policy, ran.append))
            loop = asyncio.get_running_loop()
            await until_async("the delayed jobs held by the mover",
                              lambda: loop.run_in_executor(None, held_by_mover, rabbit.url))
            now = int(time.time() * 1000)
            got = await loop.run_in_executor(None, run_held, rabbit.url, q.name, now + 2 * HOUR_MS, 2)
            assert got[:2] == (2, 1)
            await until_async("two ran", lambda: len(ran) == 2)
            got = await loop.run_in_executor(None, run_held, rabbit.url, q.name, now + 2 * HOUR_MS, 10)
            assert got[:2] == (1, 0)
            await until_async("three ran", lambda: len(ran) == 3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert sorted((j.id, j.attempt, bytes(j.payload)) for j in ran) == [("a", 1, b"a"), ("b", 1, b"b"), ("c", 1, b"c")]
        finally:
            await b.close()

    asyncio.run(main())


def test_sync_run_from_the_levels_and_a_mover(rabbit, policy):
    b = sync.connect(rabbit.url)
    try:
        q, other = b.queue(qname("run")), b.queue(qname("run-other"))
        for i in ("a", "b", "c", "d"):
            q.enqueue(i, i.encode(), delay=3600)
        other.enqueue("a", b"other", delay=3600)
        # No worker: ready in hold.L10.
        assert q.run("a") == (1, 0)
        assert q.run("zz") == (0, 0)
        ran, stop = [], threading.Event()
        t = threading.Thread(target=q.work, args=(policy, ran.append), kwargs=dict(stop=stop), daemon=True)
        t.start()
        until("a ran", lambda: len(ran) == 1)
        until("the delayed jobs held by the mover", lambda: held_by_mover(rabbit.url))
        now = int(time.time() * 1000)
        assert q.run(due_before=now + 2 * HOUR_MS, limit=2) == (2, 1)
        until("two more ran", lambda: len(ran) == 3)
        assert q.run(due_before=now + 2 * HOUR_MS) == (1, 0)
        until("four ran", lambda: len(ran) == 4)
        stop.set()
        t.join(30)
        assert sorted((j.id, j.attempt, bytes(j.payload)) for j in ran) == [
            ("a", 1, b"a"), ("b", 1, b"b"), ("c", 1, b"c"), ("d", 1, b"d")]
        assert other.run("a") == (1, 0)  # the other queue's stayed
        with pytest.raises(ValueError, match="give one of job_id and due_before"):
            q.run()
        with pytest.raises(ValueError, match="limit must be a whole number in 1..10000"):
            q.run(due_before=now, limit=0)
    finally:
        b.close()


def test_asyncio_run(rabbit, policy):
    async def main():
        b = await rabbitmq.connect(rabbit.url)
        try:
            q = b.queue(qname("run"))
            for i in ("a", "b", "c"):
                await q.enqueue(i, i.encode(), delay=3600)
            assert await q.run("b") == (1, 0)  # from the level
            ran = []
            task = asyncio.ensure_future(q.work(policy, ran.append))
            loop = asyncio.get_running_loop()
            await until_async("b ran and the others are held by the mover", lambda: len(ran) == 1 and loop.run_in_executor(
                None, held_by_mover, rabbit.url))
            now = int(time.time() * 1000)
            assert await q.run(due_before=now + 2 * HOUR_MS, limit=5) == (2, 0)  # from the mover
            await until_async("all three ran", lambda: len(ran) >= 3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert sorted((j.id, j.attempt) for j in ran) == [("a", 1), ("b", 1), ("c", 1)]
        finally:
            await b.close()

    asyncio.run(main())


def _answer(mover, matched, moved):
    return {"backstop-run-mover": mover, "backstop-run-matched": str(matched), "backstop-run-moved": str(moved)}


def test_run_movers_asks_the_most_matched_first_within_the_limit():
    # The levels moved 1 of a limit of 5; three movers answered "count"
    # (one with nothing), a fourth did not.
    takes = _core.run_movers([_answer("a", 2, 0), _answer("b", 9, 0), _answer("c", 0, 0)], 4, 5, _core.Ran(1, 0))
    assert next(takes) == ("b", 4)  # the most matched first, asked for what the limit leaves
    assert takes.send(_answer("b", 9, 3)) == ("a", 1)  # b moved 3 of the 4 and kept 6
    with pytest.raises(_core.SilentMovers) as e:
        takes.send(None)  # a did not answer its take
    assert e.value.silent == 2 and e.value.ran == _core.Ran(4, 6)


def test_run_movers_counts_past_the_limit_without_asking():
    takes = _core.run_movers([_answer("a", 3, 0)], 1, 2, _core.Ran(2, 1))
    with pytest.raises(StopIteration) as done:
        next(takes)
    assert done.value.value == _core.Ran(2, 4)
