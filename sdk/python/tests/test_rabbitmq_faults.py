"""Issue 40's RabbitMQ faults (SPEC-40.md, section B), fixed in the
sans-I/O core (backstop.rabbitmq._core) that the asyncio and the sync
worker share: the rules on their own, then each fault on a real
rabbitmq-server (conftest.py's session broker) through both workers
where they differ (their publishes, confirms and movers are their own)."""

import asyncio
import collections
import logging
import re
import subprocess
import threading
import time
from datetime import timedelta

import pika
import pytest

import backstop
from backstop.rabbitmq import _core, sync

from conftest import RABBIT_BIN, until, until_async
from test_rabbitmq import FAST, HTTPError, qname, raw, run, stop
from test_rabbitmq_sync import Worker

ONCE = {"max_attempts": 3, "backoff": {"strategy": "constant", "base": "1s", "cap": "1s"}, "jitter": {"mode": "none"}}


def key(s):
    return ".".join(format(s, "018b"))


# -- the rules --------------------------------------------------------------------


def test_an_error_is_bounded_with_a_marker_cut_on_a_character_boundary():
    assert _core.bounded_error("short") == "short"
    exact = "x" * _core.ERROR_MAX
    assert _core.bounded_error(exact) == exact
    for text in ("e" * 200_000, "€" * 70_000, "a" + "😀" * 50_000):
        full = len(text.encode())
        got = _core.bounded_error(text)
        b = got.encode()
        marker = " …[truncated: %d bytes]" % full
        assert len(b) <= _core.ERROR_MAX and got.endswith(marker)
        assert text.startswith(got[:-len(marker)])  # whole characters of the start
        assert len(b) > _core.ERROR_MAX - 4  # as much as fits
    # Every error header a worker publishes is bounded (fit: at the publish).
    job = _core.job_from("q", "j", {"backstop-attempt": "1", "backstop-first-enqueued-ms": "5",
                                    "backstop-last-error": "old " * 10_000}, b"", None)
    big = "boom " * 40_000
    retry = _core.fit(_core.move("q", job, ("retry", "transient", None, big, 1000), 10).headers)
    dead = _core.fit(_core.move("q", job, ("dead_letter", "permanent_error", None, big, 0), 10).headers)
    defer = _core.fit(_core.move("q", job, ("defer", "circuit_open", None, "", 1000), 10).headers)
    assert retry["backstop-last-error"] == _core.bounded_error(big)
    assert dead["backstop-error"] == _core.bounded_error(big)
    assert defer["backstop-last-error"] == _core.bounded_error("old " * 10_000)  # one written before the bound


def test_a_header_table_over_64_kib_drops_the_largest_foreign_headers():
    small = {"backstop-attempt": "1", "a": "x" * 100}
    assert _core.fit(small) == small
    h = {"backstop-attempt": "2", "backstop-last-error": "e" * 8000, "x-death": [{"reason": "expired"}],
         "big": "b" * 70_000, "mid": bytearray(b"m" * 40_000), "keep": "k" * 20_000, "tiny": 7}
    got = _core.fit(h)
    assert _core.table_size(got) <= _core.TABLE_MAX < _core.table_size(h)
    assert got["backstop-dropped-headers"] == "big,mid"
    assert {k: got[k] for k in h if k in got} == {k: v for k, v in h.items() if k not in ("big", "mid")}
    # Room is kept for the list at its largest: 65536 - 1054 bytes at most.
    edge = {"f%03d" % i: "v" * 650 for i in range(101)}  # 660 bytes a field, 66664 in all
    assert _core.table_size(edge) == 66664
    assert _core.fit(edge)["backstop-dropped-headers"] == "f000,f001,f002,f003"  # 2 would fit 65536
    # Ties by name; an earlier list comes first.
    tie = {"backstop-dropped-headers": "old", "y": "v" * 40_000, "x": "v" * 40_000}
    assert _core.fit(tie)["backstop-dropped-headers"] == "old,x"
    # The list keeps whole names within 1024 bytes.
    many = {"h%04d-%s" % (i, "n" * 200): "v" * 400 for i in range(200)}
    got = _core.fit(many)
    listed = got["backstop-dropped-headers"]
    assert _core.table_size(got) <= _core.TABLE_MAX and 1024 - 206 < len(listed.encode()) <= _core.DROPPED_MAX
    assert all(k in many and k not in got for k in listed.split(","))
    # The size is the encoded table's (pamqp's here), numbers at their widest.
    from pamqp import encode
    t = {"s": "é" * 10, "x": bytearray(b"12345"), "n": None, "b": True, "f": 1.5, "l": 2**40, "a": ["x", 1],
         "t": {"k": "v"}}
    assert _core.table_size(t) - len(encode.field_table(t)) == 4 + 7  # 1.5 as a float, 1 as a byte


def test_x_delivery_count_is_the_brokers_on_a_redelivery_only():
    h = {"backstop-attempt": "1", "backstop-first-enqueued-ms": "5", "x-delivery-count": 99}
    first = _core.job_from("q", "j", h, b"", None)
    again = _core.job_from("q", "j", h, b"", None, redelivered=True)
    assert (first.delivery_count, again.delivery_count) == (0, 99)
    with backstop.load_policy(FAST) as policy:
        assert _core.triage(first, policy, 5, _core.Kept(), 10) == (None, False, False, False, False, False, 0)
        assert _core.triage(again, policy, 5, _core.Kept(), 10).plan[1] == "crash_loop"
    # Nothing backstop publishes carries it, a malformed dead letter included.
    bad = _core.job_from("q", "", dict(h), b"", None, redelivered=True)
    assert bad.malformed and "x-delivery-count" not in _core.dead_letter("q", bad, "malformed", "m", 10).headers
    assert "x-delivery-count" not in _core.move("q", first, ("retry", "transient", None, "e", 1000), 10).headers


def test_a_due_time_more_than_30_days_ahead_is_malformed():
    now = 1_700_000_000_000
    h = {"backstop-attempt": "1", "backstop-first-enqueued-ms": "5", "custom": "c"}
    ok = _core.job_from("q", "j", dict(h, **{"backstop-due-ms": str(now + _core.MAX_DUE_AHEAD_MS)}), b"", None)
    far = _core.job_from("q", "j", dict(h, **{"backstop-due-ms": str(10**17), "x-death": []}), b"", None)
    plain = _core.job_from("q", "p", {"backstop-due-ms": str(10**17)}, b"", None)
    assert _core.MAX_DUE_AHEAD_MS == 2_592_000_000
    with backstop.load_policy(FAST) as policy:
        assert _core.triage(ok, policy, 5, _core.Kept(), now).early
        for job in (far, plain):
            step = _core.triage(job, policy, 5, _core.Kept(), now)
            assert step.plan[:5] == ("dead_letter", "malformed", None, _core.DUE_TOO_FAR, 0)
            assert "backstop-due-ms" in _core.DUE_TOO_FAR
    pub = _core.move("q", far, step.plan, now)
    # A dead letter as any other: the broker's headers left out, the rest kept.
    pub = _core.move("q", far, _core.triage(far, policy, 5, _core.Kept(), now).plan, now)
    assert (pub.exchange, pub.routing_key, pub.headers["backstop-error"], pub.headers["custom"]) == (
        "", "q.dlq", _core.DUE_TOO_FAR, "c")
    assert "x-death" not in pub.headers
    # enqueue's delay: at most 30 days.
    assert _core.delay_ms("enqueue", None) == 0
    assert _core.delay_ms("enqueue", 1.5) == 1500 and _core.delay_ms("enqueue", timedelta(days=30)) == 2_592_000_000
    for bad in (timedelta(days=30, milliseconds=1), 2_592_001, float("inf"), -1, float("nan"), "1s", True):
        with pytest.raises(ValueError, match="enqueue: delay"):
            _core.delay_ms("enqueue", bad)
    pub = _core.enqueued("q", "j", None, 1500, now)
    assert (pub.exchange, pub.routing_key, pub.message_id, pub.headers["backstop-due-ms"]) == (
        "q.delay", key(2), "j", str(now + 1500))


def test_a_returned_move_is_dead_lettered_and_a_refused_one_enters_the_delay_again():
    now = 1_700_000_000_000
    h = {"backstop-destination": "gone", "backstop-attempt": "2", "backstop-due-ms": "5", "x-delivery-count": 3,
         "x-death": [{"reason": "expired"}], "backstop-move-refusals": "2"}
    move = _core.moved(0, key(1), h)
    assert move.exchange == _core.DELIVER
    dl = _core.after_move(0, move, "returned", h, now)
    assert [(p.exchange, p.routing_key) for p in dl] == [("", "gone.dlq"), ("", "backstop.unroutable")]
    for p in dl:
        assert (p.headers["backstop-reason"], p.headers["backstop-error"], p.headers["backstop-dead-lettered-ms"]) == (
            "unroutable", 'no route to queue "gone": it was deleted or never declared', str(now))
        assert p.headers["backstop-attempt"] == "2" and p.headers["backstop-due-ms"] == "5"
        assert not {"x-delivery-count", "x-death", "backstop-move-refusals"} & set(p.headers)
    # Returned too: the next in turn; none left: held, tried again later.
    assert _core.after_move(0, dl[0], "returned", h, now) == []
    assert _core.after_move(0, dl[0], "refused", h, now) is None
    # No destination: the shared queue at once.
    [p] = _core.after_move(0, move, "returned", {}, now)
    assert (p.routing_key, p.headers["backstop-error"]) == (
        "backstop.unroutable", "no route for a delayed message without backstop-destination")

    [again] = _core.after_move(3, _core.moved(3, key(9), h), "refused", h, now)
    assert (again.exchange, again.routing_key) == (_core.ENTER, key(10))
    assert again.headers["backstop-due-ms"] == str(now + 10_000) and again.headers["backstop-move-refusals"] == "3"
    assert "x-delivery-count" not in again.headers
    # Due later than that: at its own due time, for the rest of it.
    later = dict(h, **{"backstop-due-ms": str(now + 25_500)})
    [again] = _core.after_move(3, _core.moved(3, key(9), later), "refused", later, now)
    assert (again.routing_key, again.headers["backstop-due-ms"]) == (key(26), str(now + 25_500))
    assert _core.after_move(3, again, "refused", h, now) is None  # the re-entry refused: held
    h29 = dict(h, **{"backstop-move-refusals": "29"})
    last = _core.after_move(0, move, "refused", h29, now)
    assert [p.routing_key for p in last] == ["gone.dlq", "backstop.unroutable"]
    assert last[0].headers["backstop-reason"] == "unroutable" and last[0].headers["backstop-error"] == (
        "the broker refused the delayed message's move 30 times (a full queue or delay level): "
        "rabbitmq: the broker rejected the message")
    assert dict(_core.SHARED.queues)["backstop.unroutable"] == {"x-queue-type": "quorum"}


# -- on a real broker ----------------------------------------------------------------
#
# Messages are published (and queues read) with pika; the worker under test
# is the asyncio one or the sync one.


@pytest.fixture
def broker(rabbit):
    b = sync.connect(rabbit.url)
    yield b
    b.close()


def work_until(rabbit, worker, name, policy, handler, what, done, during=None, timeout=60, max_deliveries=5,
               **options):
    """Runs the ``worker`` ("async" or "sync") of queue ``name`` until
    ``done()`` (polled), then stops it gracefully; ``during()``, when given,
    runs meanwhile in a thread of its own once the worker started, and
    must end (its failure is the test's) before it is stopped."""
    t, failed = None, []

    def guarded():
        try:
            during()
        except BaseException as e:  # noqa: B902 - raised by finish()
            failed.append(e)

    def start():
        nonlocal t
        if during is not None:
            t = threading.Thread(target=guarded, daemon=True)
            t.start()

    def finish():
        if t is not None:
            t.join(120)
            assert not t.is_alive()
            if failed:
                raise failed[0]

    if worker == "async":
        async def body(b):
            w = asyncio.ensure_future(b.queue(name, max_deliveries=max_deliveries).work(policy, handler, **options))
            start()
            await until_async(what, done, timeout)
            await asyncio.to_thread(finish)
            await stop(w)

        run(rabbit, body)
    else:
        b = sync.connect(rabbit.url)
        try:
            w = Worker(b.queue(name, max_deliveries=max_deliveries), policy, handler, **options)
            start()
            until(what, done, timeout)
            finish()
            w.stop()
        finally:
            b.close()


def ctl(rabbit, *args):
    subprocess.run([str(RABBIT_BIN / "rabbitmqctl"), "-n", rabbit.nodename, *args], env=rabbit.env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)


def depth(rabbit, name):
    conn = pika.BlockingConnection(pika.URLParameters(rabbit.url))
    try:
        return conn.channel().queue_declare(name, passive=True).method.message_count
    finally:
        conn.close()


def drain(rabbit, name):
    """Takes every message of queue ``name`` (acked): their headers."""
    conn = pika.BlockingConnection(pika.URLParameters(rabbit.url))
    out = []
    try:
        ch = conn.channel()
        while True:
            method, props, _ = ch.basic_get(name, auto_ack=True)
            if method is None:
                return out
            out.append(props.headers or {})
    finally:
        conn.close()


def delete_queue(rabbit, name):
    conn = pika.BlockingConnection(pika.URLParameters(rabbit.url))
    try:
        conn.channel().queue_delete(name)
    finally:
        conn.close()


WORKERS = pytest.mark.parametrize("worker", ["async", "sync"])


@WORKERS
def test_a_memory_alarm_runs_no_attempt_twice_and_loses_nothing(rabbit, broker, worker, caplog):
    # Issue 40, 3: confirms held back by a memory alarm are waited for, never
    # timed out into "not published" (Go published the retry again later).
    n = 200
    seen = []
    lock = threading.Lock()
    alarm = threading.Event()

    def handle(job):
        with lock:
            seen.append((job.id, job.attempt))
            if len(seen) == 20:
                alarm.set()
        if job.attempt == 1:
            raise TimeoutError("once")

    def alarmed():
        # From here the broker blocks the publishing connections: the
        # retries wait for their confirms.
        alarm.wait(60)
        ctl(rabbit, "set_vm_memory_high_watermark", "0.0001")
        try:
            time.sleep(8)  # the alarm's length (not a wait for a result)
        finally:
            ctl(rabbit, "set_vm_memory_high_watermark", "0.4")

    q = broker.queue(qname("alarm"))
    for i in range(n):
        q.enqueue("j%d" % i, b"")
    caplog.set_level(logging.WARNING, "backstop.rabbitmq")
    with backstop.load_policy(ONCE) as policy:
        work_until(rabbit, worker, q.name, policy, handle, "every job's second attempt",
                   lambda: sum(1 for _, a in seen if a == 2) >= n, alarmed, 120, prefetch=16)
    runs = collections.Counter(seen)
    assert {k: c for k, c in runs.items() if c > 1} == {}  # 0 attempts run twice
    assert sorted(runs) == sorted((("j%d" % i, a) for i in range(n) for a in (1, 2)))  # 0 lost
    st = q.stats()
    assert (st.ready, st.dlq) == (0, 0)
    logged = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("rabbitmq connection blocked: ") for m in logged)
    assert "rabbitmq connection unblocked" in logged


class Lost(logging.Handler):
    """Counts the workers' "connection lost" warnings."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def emit(self, record):
        if "connection lost" in record.getMessage():
            self.n += 1


@WORKERS
def test_a_200_kb_error_beside_short_jobs_closes_no_connection(rabbit, broker, worker):
    # Issue 40, 4: the error became an unbounded header; the retry's frame
    # over frame_max made the broker close the connection, and the good
    # jobs in flight came back as crash loops.
    n = 100
    seen = []
    q = broker.queue(qname("frame"))
    q.enqueue("huge", b"")
    for i in range(n):
        q.enqueue("j%d" % i, b"")

    def handle(job):
        seen.append(job.id)
        if job.id == "huge":
            raise RuntimeError("€" + "x" * 200_000)

    lost = Lost()
    logging.getLogger("backstop.rabbitmq").addHandler(lost)
    try:
        with backstop.load_policy(FAST) as policy:
            work_until(rabbit, worker, q.name, policy, handle, "the dead letter and the short jobs",
                       lambda: depth(rabbit, q.name + ".dlq") == 1 and len(set(seen)) == n + 1, prefetch=16)
    finally:
        logging.getLogger("backstop.rabbitmq").removeHandler(lost)
    assert lost.n == 0  # 0 connection losses
    st = q.stats()
    assert (st.ready, st.dlq) == (0, 1)
    [dl] = q.inspect(10)  # 0 good jobs dead-lettered
    assert (dl.id, dl.reason, dl.attempt) == ("huge", "max_attempts_reached", 2)
    assert dl.error == _core.bounded_error("RuntimeError: €" + "x" * 200_000)
    assert dl.error.endswith(" …[truncated: 200017 bytes]") and len(dl.error.encode()) <= _core.ERROR_MAX
    assert sorted(seen) == sorted(["huge", "huge"] + ["j%d" % i for i in range(n)])  # each ran once


@WORKERS
def test_a_plain_message_with_headers_near_frame_max_is_retried_without_its_largest(rabbit, broker, worker):
    # Issue 40, 4: a plain message whose own headers are just under
    # frame_max (131072 bytes): its retry, with backstop's headers and
    # the error, would not fit; the largest foreign headers go instead.
    seen = []

    def handle(job):
        seen.append(job)
        if job.attempt == 1:
            raise RuntimeError("e" * 1000)

    q = broker.queue(qname("plainbig"))
    q.declare()
    raw(rabbit, q.name, b"body", message_id="big", headers={"big-a": "a" * 80_000, "big-b": "b" * 50_500, "small": "s"})
    with backstop.load_policy(FAST) as policy:
        work_until(rabbit, worker, q.name, policy, handle, "the retry", lambda: len(seen) == 2)
    first, second = seen
    assert len(first.headers["big-a"]) == 80_000 and second.attempt == 2
    assert "big-a" not in second.headers and second.headers["backstop-dropped-headers"] == "big-a"
    assert second.headers["big-b"] == "b" * 50_500 and second.headers["small"] == "s"
    assert second.last_error == "RuntimeError: " + "e" * 1000
    st = q.stats()
    assert (st.ready, st.dlq) == (0, 0)


@WORKERS
def test_a_foreign_delivery_count_and_an_absurd_due_time(rabbit, broker, worker):
    # Issue 40, 8: x-delivery-count copied by a shovel onto a first
    # delivery is not the broker's (it runs, not a crash loop); a due time
    # of 10^17 ms cycled through the levels for ever (now malformed).
    ran = []
    q = broker.queue(qname("foreign"))
    q.declare()
    raw(rabbit, q.name, b"copied", message_id="copied", headers={"x-delivery-count": 99})
    raw(rabbit, q.name, b"far", message_id="far", headers={
        "backstop-attempt": "1", "backstop-first-enqueued-ms": str(_core.now_ms()), "backstop-due-ms": str(10**17)})
    with backstop.load_policy(FAST) as policy:
        work_until(rabbit, worker, q.name, policy, ran.append, "the job and the dead letter",
                   lambda: ran and depth(rabbit, q.name + ".dlq") == 1)
    assert [(j.id, j.attempt, j.delivery_count) for j in ran] == [("copied", 1, 0)]
    [dl] = q.inspect()
    assert (dl.id, dl.reason, dl.error) == ("far", "malformed", _core.DUE_TOO_FAR)


@WORKERS
def test_two_messages_without_an_id_and_one_body_are_two_jobs(rabbit, broker, worker):
    # Issue 40, 9: the sha256-of-body id made them one job (a Once guard by
    # job id dropped the second event).
    ran = []
    q = broker.queue(qname("noid"))
    q.declare()
    for _ in range(2):
        raw(rabbit, q.name, b'{"event": "same"}', headers={"__TypeId__": "com.example.Event"})
    with backstop.load_policy(FAST) as policy:
        work_until(rabbit, worker, q.name, policy, ran.append, "both jobs", lambda: len(ran) == 2)
    a, b = ran
    assert a.id != b.id and all(re.fullmatch(r"amqp-[0-9a-f]{32}", j.id) for j in ran)
    assert [(j.attempt, j.payload, j.headers["__TypeId__"]) for j in ran] == [
        (1, b'{"event": "same"}', "com.example.Event")] * 2
    st = q.stats()
    assert (st.ready, st.dlq) == (0, 0)


@WORKERS
def test_a_deleted_queue_does_not_stall_the_delays_of_another(rabbit, broker, worker):
    # Issue 40, 5: the moves to a deleted queue were returned and retried
    # every 10 s for ever, held in the mover's prefetch (1000): every
    # other queue's delayed jobs waited behind them.
    gone, victim = broker.queue(qname("gone")), broker.queue(qname("victim"))
    n_gone, n_victim = 1200, 50
    due, ran = {}, {}
    for i in range(n_gone):
        gone.enqueue("g%d" % i, b"", delay=1)
    delete_queue(rabbit, gone.name)
    victim.declare()

    def enqueue_victims():
        for i in range(n_victim):
            due["v%d" % i] = _core.now_ms() + 1000
            victim.enqueue("v%d" % i, b"", delay=1)

    def handle(job):
        ran[job.id] = _core.now_ms()

    with backstop.load_policy(FAST) as policy:
        work_until(rabbit, worker, victim.name, policy, handle, "the victim's jobs and the dead letters",
                   lambda: len(ran) == n_victim and depth(rabbit, gone.name + ".dlq") == n_gone, enqueue_victims)
    # On time: never early, and late by far less than the stall (for ever),
    # with slack for a loaded machine (README: at most 1 s or 5 % late).
    assert all(ran[j] >= due[j] for j in due)
    assert max(ran[j] - due[j] for j in due) < 20_000
    dls = drain(rabbit, gone.name + ".dlq")
    assert len(dls) == n_gone
    assert {(h.get("backstop-reason"), h.get("backstop-error")) for h in dls} == {
        ("unroutable", 'no route to queue "%s": it was deleted or never declared' % gone.name)}


@WORKERS
def test_a_refused_outcome_is_kept_and_handed_back_after_a_pause(rabbit, broker, worker, caplog):
    # Issue 40, 3: only a nack is a refusal: the outcome is kept (the job
    # not run again) and the delivery handed back after a pause (20 ms
    # doubling to 5 s), not held for as long as the channel lives
    # (asyncio) nor taken for a lost connection (sync: it reconnected).
    ran = []
    q = broker.queue(qname("refused"), max_deliveries=50)
    q.declare()
    for i in range(2):  # over the limit set below: the dead letter is refused
        raw(rabbit, q.name + ".dlq", b"", message_id="filler%d" % i)
    q.enqueue("j", b"")
    policy_name = q.name + "-full"
    ctl(rabbit, "set_policy", "--apply-to", "queues", policy_name, "^%s\\.dlq$" % re.escape(q.name),
        '{"max-length": 1, "overflow": "reject-publish"}')
    caplog.set_level(logging.WARNING, "backstop.rabbitmq")

    def permanent(job):
        ran.append(job)
        raise HTTPError(400)

    drained = threading.Event()

    def refused_twice():
        until("two refusals", lambda: sum("refused by the broker" in r.getMessage() for r in caplog.records) >= 2)
        assert len(drain(rabbit, q.name + ".dlq")) == 2  # room again
        drained.set()

    try:
        with backstop.load_policy(FAST) as policy:
            # Done once drained: between the drain's two takes the DLQ holds
            # one filler, which is not the dead letter.
            work_until(rabbit, worker, q.name, policy, permanent, "the dead letter",
                       lambda: drained.is_set() and depth(rabbit, q.name + ".dlq") == 1, refused_twice,
                       max_deliveries=50)
    finally:
        subprocess.run([str(RABBIT_BIN / "rabbitmqctl"), "-n", rabbit.nodename, "clear_policy", policy_name],
                       env=rabbit.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    assert [j.attempt for j in ran] == [1]  # run once, its outcome applied on a later delivery
    assert not [r for r in caplog.records if "connection lost" in r.getMessage()]  # no reconnection for it
    [dl] = q.inspect()
    assert (dl.id, dl.reason) == ("j", "permanent_error")


@WORKERS
def test_looking_at_a_dead_letter_does_not_use_it_up(rabbit, broker, worker):
    # Issue 40, 10: each look (basic.get, returned) raised the dead letters'
    # x-delivery-count; RabbitMQ 4.x quorum queues default to a delivery
    # limit of 20, which drops them (Q.dlq has no dead-letter exchange):
    # here the limit is set by a policy, as 4.x would have it.
    q = broker.queue(qname("looked"))
    q.declare()
    ids = ["look-a", "look-b", "look-c"]
    for i in ids:
        raw(rabbit, q.name + ".dlq", b"p-" + i.encode(), message_id=i, headers={
            "backstop-attempt": "2", "backstop-first-enqueued-ms": "1700000000000", "backstop-destination": q.name,
            "backstop-reason": "permanent_error", "backstop-error": "HTTP 400",
            "backstop-dead-lettered-ms": "1700000001000"})
    policy_name = q.name + "-limit"
    ctl(rabbit, "set_policy", "--apply-to", "queues", policy_name, "^%s\\.dlq$" % re.escape(q.name),
        '{"delivery-limit": 20}')
    try:
        if worker == "async":
            async def looks(b):
                aq = b.queue(q.name)
                shown = []
                for _ in range(26):
                    shown.append([(d, dict(d.headers)) for d in await aq.inspect(10)])
                    assert await aq.replay(limit=1, reason="transient") == 0  # looked at, not taken
                return shown

            shown = run(rabbit, looks)
        else:
            shown = []
            for _ in range(26):
                shown.append([(d, dict(d.headers)) for d in q.inspect(10)])
                assert q.replay(limit=1, reason="transient") == 0
    finally:
        ctl(rabbit, "clear_policy", policy_name)
    left = drain(rabbit, q.name + ".dlq")  # all there, with their headers
    assert [(h["backstop-reason"], h["backstop-error"]) for h in left] == [("permanent_error", "HTTP 400")] * 3
    assert all((h.get("x-delivery-count") or 0) <= _core.REFRESH_AT for h in left)
    first = shown[0]
    assert [d.id for d, _ in first] == ids and all("x-delivery-count" not in h for _, h in first)
    assert all(s == first for s in shown)  # 25 more looks show the same


def test_a_worker_stopped_under_a_memory_alarm_waits_for_its_confirms_a_bounded_time(rabbit, broker, caplog):
    # SPEC-40 item 3, asyncio: at shutdown the pending confirms are awaited
    # up to the apply timeout (10 s), then the channel is closed: the
    # outcomes are unknown (kept; the messages come back), never lost.
    # Before, a worker cancelled during an alarm waited as long as the alarm.
    n = 20
    seen = []
    q = broker.queue(qname("stopalarm"))
    for i in range(n):
        q.enqueue("j%d" % i, b"")
    alarm = None

    async def handle(job):
        seen.append((job.id, job.attempt))
        if job.attempt == 1:
            if alarm is not None:
                await alarm.wait()  # the retry is published during the alarm
            raise TimeoutError("once")

    caplog.set_level(logging.WARNING, "backstop.rabbitmq")

    async def body(b):
        nonlocal alarm
        alarm = asyncio.Event()
        w = asyncio.ensure_future(b.queue(q.name).work(policy, handle, prefetch=4))
        await until_async("jobs in hand", lambda: len(seen) == 4)
        await asyncio.to_thread(ctl, rabbit, "set_vm_memory_high_watermark", "0.0001")
        try:
            alarm.set()
            await until_async("the connection blocked", lambda: any(
                r.getMessage().startswith("rabbitmq connection blocked") for r in caplog.records))
            w.cancel()
            await until_async("the worker's stop, alarm or not", w.done, 60)
        finally:
            await asyncio.to_thread(ctl, rabbit, "set_vm_memory_high_watermark", "0.4")

    with backstop.load_policy(ONCE) as policy:
        run(rabbit, body)
        assert any("no confirm within 10s of the worker's stop" in r.getMessage() for r in caplog.records)
        # Nothing lost: every job reaches its second attempt.
        alarm = None
        work_until(rabbit, "async", q.name, policy, handle, "every job's second attempt",
                   lambda: {i for i, a in seen if a == 2} == {"j%d" % i for i in range(n)}, timeout=90)


@WORKERS
def test_a_refused_move_enters_the_delay_again_instead_of_holding_its_level(rabbit, broker, worker):
    # Issue 40, 5: a move the broker refuses (its work queue over its
    # max-length) is published to the delay again for 10 s, counted in
    # backstop-move-refusals, not held in the mover's prefetch. The queue
    # has no worker of its own: another queue's worker runs the mover.
    full, other = broker.queue(qname("full")), broker.queue(qname("mover"))
    full.declare()
    other.declare()
    for i in range(2):  # over the limit set below: the move is refused
        raw(rabbit, full.name, b"", message_id="filler%d" % i)
    policy_name = full.name + "-full"
    ctl(rabbit, "set_policy", "--apply-to", "queues", policy_name, "^%s$" % re.escape(full.name),
        '{"max-length": 1, "overflow": "reject-publish"}')
    full.enqueue("late", b"", delay=1)
    room = threading.Event()

    def room_after_a_refusal():
        time.sleep(3)  # the move, due in 1 s, refused meanwhile (not a wait for a result)
        assert len(drain(rabbit, full.name)) == 2
        room.set()

    try:
        with backstop.load_policy(FAST) as policy:
            work_until(rabbit, worker, other.name, policy, lambda job: None, "the delayed job in its queue",
                       lambda: room.is_set() and depth(rabbit, full.name) == 1, room_after_a_refusal)
    finally:
        ctl(rabbit, "clear_policy", policy_name)
    [h] = drain(rabbit, full.name)
    assert (h["backstop-attempt"], h["backstop-move-refusals"]) == ("1", "1")


def test_moves_of_one_message_id_do_not_take_each_others_return(rabbit, broker):
    # The asyncio mover publishes side by side on one channel, and aiormq
    # matches a return to its publish by message id: one job id delayed on
    # two queues, one of them deleted, must land in the other queue and in
    # the deleted one's DLQ, never swapped (a routable move dead-lettered,
    # a returned one acked as moved: lost).
    n = 20
    gone, alive, other = broker.queue(qname("gone")), broker.queue(qname("alive")), broker.queue(qname("mover"))
    for q in (gone, alive, other):
        q.declare()
    for i in range(n):
        gone.enqueue("same%d" % i, b"gone", delay=1)
        alive.enqueue("same%d" % i, b"alive", delay=1)
    delete_queue(rabbit, gone.name)
    with backstop.load_policy(FAST) as policy:
        work_until(rabbit, "async", other.name, policy, lambda job: None, "every move",
                   lambda: depth(rabbit, gone.name + ".dlq") + depth(rabbit, alive.name) + depth(
                       rabbit, alive.name + ".dlq") >= 2 * n)
    assert (depth(rabbit, gone.name + ".dlq"), depth(rabbit, alive.name), depth(rabbit, alive.name + ".dlq")) == (
        n, n, 0)
