"""backstop.redis against a real redis-server (see conftest.py): each
script's semantics, apply with a real policy, the worker loop, client
flavours (decode_responses, RESP3) and a real Redis Cluster."""

import json
import logging
import threading
import time
from datetime import timedelta
from importlib import resources
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis
import redis.asyncio

import backstop
from backstop import RetryError
from backstop.redis import AsyncQueue, Job, Keys, Outcome, Queue, script_source

# Deterministic delays: 250 ms, no jitter, three attempts.
FIXED = {"max_attempts": 3, "backoff": {"strategy": "constant", "base": "250ms", "cap": "1s"}, "jitter": {"mode": "none"}}
CONTRACT = Path(__file__).resolve().parents[3] / "contract" / "scripts"
SCRIPTS = ("ack", "dead_letter", "defer", "discard", "enqueue", "hold", "promote", "reclaim", "replay", "retry", "run")


class HTTPError(Exception):
    """An HTTP status error shaped like requests' and httpx's."""

    def __init__(self, status, headers=None, method=None):
        super().__init__("HTTP %d" % status)
        self.response = SimpleNamespace(status_code=status, headers=headers or {})
        if method:
            self.request = SimpleNamespace(method=method, headers={})


@pytest.fixture
def q(r):
    q = Queue(r, "orders")
    assert q.ensure_group() is True
    assert q.ensure_group() is False
    return q


@pytest.fixture
def policy():
    with backstop.load_policy(FIXED) as p:
        yield p


def server_ms(r):
    s, us = r.time()
    return s * 1000 + us // 1000


def dlq(r, q):
    return [(eid.decode(), {k.decode(): v.decode() for k, v in f.items()}) for eid, f in r.xrange(q.keys.dlq)]


def make_due(r, q):
    """Makes every delayed retry due now: tests never sleep."""
    members = r.zrange(q.keys.delayed, 0, -1)
    if members:
        r.zadd(q.keys.delayed, {m: 0 for m in members})


def counters(q):
    return q.stats().counters


def test_scripts_ship_identical_to_the_contract():
    shipped = resources.files("backstop") / "scripts"
    lib = (shipped / "lib.lua").read_text("utf-8")
    assert lib.startswith("-- lib: ")
    for name in SCRIPTS:
        # Each script is sent after lib.lua, the helpers they share.
        assert script_source(name) == lib + "\n" + (shipped / (name + ".lua")).read_text("utf-8"), name
        assert (shipped / (name + ".lua")).read_text("utf-8").startswith("-- " + name)
    with pytest.raises(ValueError):
        script_source("lib")
    if not CONTRACT.is_dir():
        pytest.skip("contract/scripts not found beside the package (an installed copy)")
    # idempotency.lua ships beside them (backstop.idempotency loads it).
    assert sorted(p.stem for p in CONTRACT.glob("*.lua")) == sorted(SCRIPTS + ("lib", "idempotency"))
    for name in SCRIPTS + ("lib", "idempotency"):
        assert (shipped / (name + ".lua")).read_text("utf-8") == (CONTRACT / (name + ".lua")).read_text(), name
    # and idempotency.sql (backstop.idempotency_postgres runs it).
    assert (shipped / "idempotency.sql").read_text("utf-8") == (CONTRACT / "idempotency.sql").read_text("utf-8")


def test_keys():
    assert Keys.for_queue("orders") == Keys("{orders}:jobs", "{orders}:delayed", "{orders}:dlq", "{orders}:stats")
    k = Keys("jobs:main", "delayed:retries", "jobs:dlq", "jobs:stats")
    assert Queue(redis.Redis(), "main", keys=k).keys is k


@pytest.mark.parametrize("attempt, first, malformed", [
    # the scripts' rule: digits only, attempt in 1..1e14
    ("1", "1700000000000", False), ("99999999999999", "0", False), ("+2", "0", True),
    ("01", "1", True), ("100000000000000", "1", True), ("9223372036854775807", "1", True),
    ("0", "1", True), ("-1", "1", True), ("2.0", "1", True), ("1e3", "1", True), ("inf", "1", True),
    ("9223372036854775808", "1", True), (" 1", "1", True), ("1", "", True), ("1", "x", True), (None, "1", True),
])
def test_job_from_entry(attempt, first, malformed):
    fields = {b"id": b"j", b"payload": b"\xff"}
    if attempt is not None:
        fields[b"attempt"] = attempt.encode()
    fields[b"first_enqueued_ms"] = first.encode()
    job = Job.from_entry(b"1-0", fields)
    assert (job.entry_id, job.id, job.payload, job.malformed) == ("1-0", "j", b"\xff", malformed)
    if not malformed:
        assert job.attempt == int(attempt) and job.first_enqueued_ms == int(first)
    assert Job.from_entry("1-0", {"attempt": "1", "first_enqueued_ms": "1"}).malformed  # no id


def test_enqueue_read_retry_promote_comes_back_as_attempt_2(r, q):
    before = server_ms(r)
    eid = q.enqueue("job-1", b"payload")
    [job] = q.read("w1")
    assert (job.entry_id, job.id, job.attempt, job.payload, job.malformed) == (eid, "job-1", 1, b"payload", False)
    assert before <= job.first_enqueued_ms <= server_ms(r)
    assert (job.last_error, job.last_reason) == ("", "")
    assert q.read("w1") == []
    assert q.stats().pending == 1

    due = q.retry(job, 0, "transient", "HTTPError: HTTP 503")
    assert due is not None and before <= due <= server_ms(r)
    s = q.stats()
    assert (s.jobs, s.pending, s.delayed, s.dlq) == (0, 0, 1, 0)
    assert s.counters == {"enqueued": 1, "attempts:retry": 1, "retries:transient": 1}

    assert q.promote(10) == (1, None)
    [again] = q.read("w1")
    assert again.entry_id != eid
    assert (again.id, again.attempt, again.payload, again.first_enqueued_ms) == ("job-1", 2, b"payload", job.first_enqueued_ms)
    assert (again.last_error, again.last_reason) == ("HTTPError: HTTP 503", "transient")

    assert q.ack(again) is True
    assert q.ack(again.entry_id) is False  # a second ack changes nothing
    s = q.stats()
    assert (s.jobs, s.pending, s.delayed, s.dlq) == (0, 0, 0, 0)
    assert s.counters == {"enqueued": 1, "attempts:retry": 1, "retries:transient": 1, "promoted": 1,
                          "attempts:success": 1, "finished:success:2": 1, "finished_sum:success": 2}


def test_retry_member_and_due_time(r, q):
    eid = q.enqueue("job-1", "text payload")
    [job] = q.read("w1")
    before = server_ms(r)
    due = q.retry(eid, timedelta(minutes=1), "retry_after", "later")
    assert before + 60000 <= due <= server_ms(r) + 60000
    [(member, score)] = r.zrange(q.keys.delayed, 0, -1, withscores=True)
    assert score == due
    assert json.loads(member) == {"id": "job-1", "attempt": 2, "first_enqueued_ms": str(job.first_enqueued_ms),
                                  "payload": "text payload", "last_error": "later", "last_reason": "retry_after",
                                  "source": eid, "prev_delay_ms": 60000}
    moved, next_due = q.promote()
    assert moved == 0 and 59000 <= next_due <= 60000
    assert q.retry(eid, 0, "transient") is None  # no longer pending


def test_promote_is_bounded(r, q):
    for i in range(5):
        q.enqueue("job-%d" % i)
    for job in q.read("w1", count=10):
        q.retry(job, 0, "transient")
    assert q.promote(2) == (2, 0)
    assert q.promote(10) == (3, None)
    assert sorted(j.id for j in q.read("w1", count=10)) == ["job-%d" % i for i in range(5)]
    assert counters(q)["promoted"] == 5


def test_binary_payload_survives_a_retry(r, q):
    payload = bytes(range(256)) * 2
    q.enqueue("bin", payload)
    [job] = q.read("w1")
    assert job.payload == payload
    q.retry(job, 0, "transient", "err \"quoted\" \x00 é")
    q.promote()
    [again] = q.read("w1")
    assert again.payload == payload
    assert again.last_error == "err \"quoted\" \x00 é"


def test_dead_letter_fields_and_counters(r, q):
    eid = q.enqueue("job-1", b"p")
    [job] = q.read("w1")
    q.retry(job, 0, "uncertain", "first")
    q.promote()
    [job2] = q.read("w1")
    before = server_ms(r)
    dlq_id = q.dead_letter(job2, "max_attempts_reached", "HTTPError: HTTP 503")
    assert dlq_id is not None
    [(got_id, f)] = dlq(r, q)
    assert got_id == dlq_id
    assert before <= int(f.pop("dead_lettered_ms")) <= server_ms(r)
    assert f == {"reason": "max_attempts_reached", "error": "HTTPError: HTTP 503", "attempt": "2", "id": "job-1",
                 "source_id": job2.entry_id, "first_enqueued_ms": str(job.first_enqueued_ms), "payload": "p",
                 # the entry's other fields, kept under a prefix
                 "entry.last_error": "first", "entry.last_reason": "uncertain", "entry.prev_delay_ms": "0",
                 # its due time, as promote wrote it
                 "entry.due_ms": str(job2.due_ms)}
    assert job2.due_ms > 0
    assert eid != job2.entry_id
    s = q.stats()
    assert (s.jobs, s.pending, s.delayed, s.dlq) == (0, 0, 0, 1)
    assert s.counters == {"enqueued": 1, "attempts:retry": 1, "retries:uncertain": 1, "promoted": 1,
                          "attempts:dead_letter": 1, "dead_letters:max_attempts_reached": 1, "max_attempts_reached": 1,
                          "finished:dead_letter:2": 1, "finished_sum:dead_letter": 2}
    assert q.dead_letter(job2, "max_attempts_reached", "again") is None
    assert q.stats().counters == s.counters


def test_replay_by_reason_in_bounded_batches(r, q):
    for i in range(35):
        q.enqueue("job-%d" % i, b"p%d" % i)
    for job in q.read("w1", count=100):
        n = int(job.id.split("-")[1])
        q.dead_letter(job, "permanent_error" if n < 30 else "not_idempotent", "e%d" % n)
    # The first batch (limit 3, scan 30) sees only permanent errors: the
    # cursor carries the replay on.
    assert q.replay(3, reason="not_idempotent") == 3
    assert q.replay(reason="not_idempotent") == 2
    assert q.replay(reason="nope") == 0
    jobs = q.read("w1", count=100)
    assert [j.id for j in jobs] == ["job-%d" % i for i in range(30, 35)]
    for j in jobs:
        assert (j.attempt, j.last_reason, j.payload, j.malformed) == (1, "not_idempotent", b"p" + j.id[4:].encode(), False)
        assert j.fields["replayed_from"]
    assert [f["reason"] for _, f in dlq(r, q)] == ["permanent_error"] * 30
    assert q.replay(25) == 25
    assert q.replay() == 5
    assert q.stats().dlq == 0 and counters(q)["replayed"] == 35


def test_reclaim_a_crash_loop(r, q):
    q.enqueue("loop", b"x")
    [job] = q.read("w1")  # delivery 1; w1 crashes
    assert q.reclaim("w2", min_idle_ms=60000) == (0, [])  # not idle long enough
    dead, jobs = q.reclaim("w2", min_idle_ms=0, max_deliveries=3)  # delivery 2
    assert dead == 0 and [(j.entry_id, j.id, j.attempt) for j in jobs] == [(job.entry_id, "loop", 1)]
    dead, jobs = q.reclaim("w3", min_idle_ms=0, max_deliveries=3)  # delivery 3
    assert dead == 0 and len(jobs) == 1
    dead, jobs = q.reclaim("w4", min_idle_ms=0, max_deliveries=3)
    assert (dead, jobs) == (1, [])
    [(_, f)] = dlq(r, q)
    assert (f["reason"], f["error"], f["id"], f["source_id"], f["attempt"]) == (
        "crash_loop", "delivered 3 times without an outcome", "loop", job.entry_id, "1")
    s = q.stats()
    assert (s.jobs, s.pending) == (0, 0)
    assert s.counters == {"enqueued": 1, "reclaimed": 2, "attempts:dead_letter": 1, "dead_letters:crash_loop": 1,
                          "finished:dead_letter:1": 1, "finished_sum:dead_letter": 1}


def test_reclaim_acks_entries_whose_data_is_gone(r, q):
    q.enqueue("gone")
    [job] = q.read("w1")
    r.xdel(q.keys.jobs, job.entry_id)
    assert q.stats().pending == 1
    assert q.reclaim("w2", min_idle_ms=0) == (0, [])
    assert q.stats().pending == 0


def test_reclaim_skips_a_crash_loop_the_dlq_refuses(r, q):
    q.enqueue("loop")
    [loop] = q.read("w1")
    r.xclaim(q.keys.jobs, q.group, "w1", 0, [loop.entry_id])  # delivery 2
    q.enqueue("crashed")
    [crashed] = q.read("w1")  # delivery 1
    r.set(q.keys.dlq, "legacy")
    got = q.reclaim("w2", min_idle_ms=0, max_deliveries=2)
    dead, jobs = got  # still a pair
    assert dead == 0 and [j.entry_id for j in jobs] == [crashed.entry_id]
    [(eid, why)] = got.skipped
    assert eid == loop.entry_id and "is a string, not a stream" in why
    c = r.hgetall(q.keys.stats)  # stats() reads the dlq too
    assert (c[b"reclaim_skipped"], c[b"reclaimed"]) == (b"1", b"1")
    r.delete(q.keys.dlq)
    got = q.reclaim("w3", min_idle_ms=0, max_deliveries=2)
    assert (got.dead_lettered, got.skipped) == (2, [])


@pytest.mark.parametrize("entry_id", ["5000", "+", "-", "(1-0", "01-0", "1-0 ", "18446744073709551616-0", b"5000"])
def test_an_entry_id_that_is_not_a_full_stream_id_is_refused(q, entry_id):
    for call in (lambda: q.ack(entry_id), lambda: q.retry(entry_id, 0, "transient"),
                 lambda: q.dead_letter(entry_id, "permanent_error")):
        with pytest.raises(ValueError, match=r"entry must be a stream entry id \(<ms>-<seq>\)"):
            call()


def test_a_late_outcome_changes_nothing(r, q, policy):
    q.enqueue("job-1")
    [job] = q.read("w1")  # w1 stalls; w2 takes the entry over and finishes it
    [taken] = q.reclaim("w2", min_idle_ms=0).jobs
    assert q.retry(taken, 0, "transient", "w2") is not None
    before = q.stats()
    assert q.ack(job) is False
    assert q.retry(job, 0, "transient", "w1") is None
    assert q.dead_letter(job, "permanent_error", "w1") is None
    assert q.apply(job, None, policy) == Outcome("ack", "success", None, False)
    late = q.apply(job, HTTPError(503), policy)
    assert (late.action, late.reason, late.applied, late.due_ms) == ("retry", "transient", False, None)
    late = q.apply(job, HTTPError(400), policy)
    assert (late.action, late.reason, late.applied, late.dlq_id) == ("dead_letter", "permanent_error", False, None)
    assert q.stats() == before
    [(member, _)] = r.zrange(q.keys.delayed, 0, -1, withscores=True)
    assert json.loads(member)["last_error"] == "w2"


def test_noscript_falls_back_to_loading_the_script(r, q):
    q.enqueue("a")
    r.script_flush()
    assert not any(r.script_exists(*(s.sha for s in q._scripts.values())))
    q.enqueue("b")
    jobs = q.read("w1", count=10)
    r.script_flush()
    assert [q.ack(j) for j in jobs] == [True, True]
    assert r.script_exists(q._scripts["enqueue"].sha, q._scripts["ack"].sha) == [False, True]
    assert counters(q)["attempts:success"] == 2


def test_a_malformed_entry_is_dead_lettered_whole(r, q, policy):
    r.xadd(q.keys.jobs, {"id": "job-x", "attempt": "zero", "payload": "p", "extra": "kept"})
    [job] = q.read("w1")
    assert job.malformed and job.id == "job-x" and job.fields["extra"] == "kept"
    with pytest.raises(redis.ResponseError, match="backstop retry: entry .* is malformed"):
        q.retry(job, 0, "transient")
    assert q.stats().pending == 1  # refused, left pending
    out = q.apply(job, None, policy)  # even a "success" cannot be trusted
    assert (out.action, out.reason, out.decision, out.applied) == ("dead_letter", "malformed", None, True)
    [(_, f)] = dlq(r, q)
    assert (f["reason"], f["attempt"], f["id"], f["payload"]) == ("malformed", "zero", "job-x", "p")
    assert f["error"].startswith("malformed entry: needs id")
    assert counters(q)["dead_letters:malformed"] == 1


def test_a_malformed_delayed_member_is_promoted_raw(r, q, policy):
    r.zadd(q.keys.delayed, {"not json": 0})
    assert q.promote() == (1, None)
    [job] = q.read("w1")
    assert job.malformed and job.fields == {"malformed_delayed_member": "not json"}
    out = q.apply(job, RuntimeError("never ran"), policy)
    assert (out.action, out.reason, out.applied) == ("dead_letter", "malformed", True)
    [(_, f)] = dlq(r, q)
    assert f["error"] == "malformed entry: needs id, attempt >= 1 and first_enqueued_ms (RuntimeError: never ran)"


def test_bad_arguments_are_refused_before_redis(r, q):
    for call, match in [
        (lambda: q.enqueue("", b""), "job_id"),
        (lambda: q.retry("1-0", -1, "transient"), "delay_ms"),
        (lambda: q.retry("1-0", 1.5, "transient"), "delay_ms"),
        (lambda: q.retry("1-0", 0, ""), "reason"),
        (lambda: q.dead_letter("1-0", ""), "reason"),
        (lambda: q.promote(0), "limit"),
        (lambda: q.promote(10001), "limit"),
        (lambda: q.reclaim("w", count=1001), "count"),
        (lambda: q.reclaim("w", max_deliveries=0), "max_deliveries"),
        (lambda: q.replay(0), "limit"),
        (lambda: q.read("", count=1), "consumer"),
    ]:
        with pytest.raises(ValueError, match=match):
            call()
    with pytest.raises(TypeError, match="payload"):
        q.enqueue("x", {"a": 1})
    with pytest.raises(TypeError, match="AsyncQueue"):
        Queue(redis.asyncio.Redis(), "x")
    with pytest.raises(TypeError, match="Queue"):
        AsyncQueue(redis.Redis(), "x")
    with pytest.raises(TypeError, match="classify"):
        q.apply(Job("1-0", "j", 1, 0, b""), ValueError(), None, classify={"x": "permanent"})
    # The scripts check too, and write nothing.
    with pytest.raises(redis.ResponseError, match="backstop promote: limit"):
        q._scripts["promote"](keys=[q.keys.delayed, q.keys.jobs, q.keys.stats], args=[0])
    with pytest.raises(redis.ResponseError, match="backstop replay"):
        q._scripts["replay"](keys=[q.keys.dlq, q.keys.jobs, q.keys.stats], args=[10, "", "-", 5])
    assert q.stats().counters == {}


# -- apply: the policy's decision, through the scripts --------------------------------


def test_apply_503_goes_to_the_delayed_set_with_the_decided_delay(r, q, policy):
    q.enqueue("job-1")
    [job] = q.read("w1")
    before = server_ms(r)
    out = q.apply(job, HTTPError(503, {"Retry-After": "7"}), policy)
    assert (out.action, out.reason, out.applied) == ("retry", "retry_after", True)
    assert (out.decision.delay_ms, out.decision.klass) == (7000, "retryable")
    [(member, score)] = r.zrange(q.keys.delayed, 0, -1, withscores=True)
    assert score == out.due_ms and before + 7000 <= out.due_ms <= server_ms(r) + 7000
    assert json.loads(member)["last_error"] == "HTTPError: HTTP 503"
    assert counters(q)["retries:retry_after"] == 1

    q.enqueue("job-2")
    [job] = q.read("w1")
    out = q.apply(job, HTTPError(503), policy)
    assert (out.action, out.reason, out.decision.delay_ms) == ("retry", "transient", 250)


def test_apply_400_dead_letters_as_permanent(r, q, policy):
    q.enqueue("job-1", b"body")
    [job] = q.read("w1")
    out = q.apply(job, HTTPError(400), policy)
    assert (out.action, out.reason, out.decision.klass, out.applied) == ("dead_letter", "permanent_error", "permanent", True)
    [(dlq_id, f)] = dlq(r, q)
    assert out.dlq_id == dlq_id
    assert (f["reason"], f["error"], f["id"], f["payload"]) == ("permanent_error", "HTTPError: HTTP 400", "job-1", "body")
    c = counters(q)
    assert (c["dead_letters:permanent_error"], c["finished:dead_letter:1"]) == (1, 1)
    assert "max_attempts_reached" not in c


def test_apply_until_max_attempts(r, q, policy):
    q.enqueue("job-1")
    outcomes = []
    for _ in range(3):
        q.promote()
        [job] = q.read("w1")
        outcomes.append((job.attempt, q.apply(job, HTTPError(503), policy).reason))
        make_due(r, q)
    assert outcomes == [(1, "transient"), (2, "transient"), (3, "max_attempts_reached")]
    c = counters(q)
    assert (c["max_attempts_reached"], c["dead_letters:max_attempts_reached"], c["finished:dead_letter:3"],
            c["attempts:retry"], c["retries:transient"]) == (1, 1, 1, 2, 2)


def test_apply_success_acks_and_reports_to_the_policy(r, q, monkeypatch, policy):
    calls = []
    real = policy.outcome  # the core records the success (its breaker and budget) and acks
    monkeypatch.setattr(policy, "outcome", lambda event, *a, **kw: calls.append(event) or real(event, *a, **kw))
    q.enqueue("job-1")
    [job] = q.read("w1")
    assert q.apply(job, None, policy) == Outcome("ack", "success", None, True)
    assert calls == ["success"]
    assert counters(q)["finished:success:1"] == 1


def test_apply_describes_like_the_decorator(r, q, policy):
    for i in range(5):
        q.enqueue("job-%d" % i)
    jobs = q.read("w1", count=10)
    # classify, the most specific type first
    assert q.apply(jobs[0], KeyError("k"), policy, classify={LookupError: "retryable", KeyError: "permanent"}).reason == "permanent_error"
    # An inner @policy.retry that gave up is a layer below that already
    # retried: classified by its last exception (a 503, retryable) and
    # dead-lettered as retried_downstream, not retried again by the queue.
    # This asserted ("retry", "transient") before issue 25: retry at one
    # layer (docs/layers.md), or 3 layers x 3 attempts make 27 calls.
    with pytest.raises(RetryError) as e:
        policy.retry(classify=lambda exc: "permanent")(lambda: (_ for _ in ()).throw(HTTPError(503)))()
    out = q.apply(jobs[1], e.value, policy)
    assert (out.action, out.reason, out.decision.klass) == ("dead_letter", "retried_downstream", "retryable")
    # A policy with retried_downstream: retry (cold retries over hot ones) retries it.
    q.enqueue("job-cold")
    [cold_job] = q.read("w1")
    with backstop.load_policy({**FIXED, "retried_downstream": "retry"}) as cold:
        out = q.apply(cold_job, e.value, cold)
    assert (out.action, out.reason) == ("retry", "transient")
    # a queue job carries no method: a POST is not gated, the job id is its key
    assert q.apply(jobs[2], HTTPError(503, method="POST"), policy).reason == "transient"
    # network errors
    assert q.apply(jobs[3], ConnectionRefusedError(), policy).decision.klass == "retryable"
    # a failure the policy refuses: dead-lettered as malformed
    out = q.apply(jobs[4], ValueError("x"), policy, classify=lambda exc: {"http_status": 42})
    assert (out.action, out.reason, out.decision) == ("dead_letter", "malformed", None)
    [(_, f)] = [d for d in dlq(r, q) if d[1]["id"] == "job-4"]
    assert f["error"].startswith("ValueError: x (policy refused the failure: http_status")


def test_apply_counts_elapsed_from_the_first_enqueue(r, q):
    old = server_ms(r) - 3600_000
    r.xadd(q.keys.jobs, {"id": "old", "attempt": "1", "first_enqueued_ms": str(old), "payload": ""})
    [job] = q.read("w1")
    with backstop.load_policy({**FIXED, "max_elapsed": "10m"}) as p:
        assert q.apply(job, HTTPError(503), p).reason == "max_elapsed_exceeded"


# -- the worker loop ----------------------------------------------------------------


def test_work_retries_then_acks_and_stops(r, q):
    seen = []
    stop = threading.Event()

    def handler(job):
        seen.append((job.id, job.attempt, job.payload))
        if job.attempt == 1:
            raise HTTPError(503)
        stop.set()

    fast = {**FIXED, "backoff": {"strategy": "constant", "base": "10ms", "cap": "10ms"}}
    with backstop.load_policy(fast) as p:
        r.xadd(q.keys.jobs, {"id": "", "payload": "bad"})  # malformed: never reaches the handler
        q.enqueue("job-1", b"x")
        t = threading.Thread(target=q.work, args=(p, handler),
                             kwargs=dict(consumer="w1", stop=stop, block_ms=50, promote_every=0.02))
        t.start()
        t.join(20)
        assert not t.is_alive()
    assert seen == [("job-1", 1, b"x"), ("job-1", 2, b"x")]
    c = counters(q)
    assert (c["retries:transient"], c["attempts:success"], c["finished:success:2"], c["dead_letters:malformed"]) == (1, 1, 1, 1)
    s = q.stats()
    assert (s.jobs, s.pending, s.delayed) == (0, 0, 0)


def test_work_reclaims_crashed_entries(r, q, policy):
    q.enqueue("orphan")
    q.read("dead-worker")  # read, then crashed
    stop = threading.Event()
    seen = []

    def handler(job):
        seen.append(job.id)
        stop.set()

    t = threading.Thread(target=q.work, args=(policy, handler),
                         kwargs=dict(consumer="w2", stop=stop, block_ms=20, reclaim_every=0.01, min_idle_ms=0))
    t.start()
    t.join(20)
    assert not t.is_alive() and seen == ["orphan"]
    assert counters(q)["reclaimed"] == 1 and q.stats().pending == 0


class LogUntil(logging.Handler):
    """Keeps the records of the ``backstop.queue`` logger while installed,
    and calls ``then`` at the first one whose message contains ``text``."""

    def __init__(self, text, then):
        super().__init__()
        self.text, self.then, self.records = text, then, []

    def emit(self, record):
        self.records.append(record)
        if self.text in record.getMessage():
            self.then()

    def __enter__(self):
        logging.getLogger("backstop.queue").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("backstop.queue").removeHandler(self)


def crash_loop_the_dlq_refuses(r, q):
    """A crashed consumer's entry delivered twice, and a DLQ of the wrong
    type: reclaim with max_deliveries=2 skips it. Returns its entry id."""
    q.enqueue("loop")
    [loop] = q.read("crashed")
    r.xclaim(q.keys.jobs, q.group, "crashed", 0, [loop.entry_id])  # delivery 2
    r.set(q.keys.dlq, "legacy")
    return loop.entry_id


def check_skip_logged(q, entry_id, records):
    [rec] = [rec for rec in records if entry_id in rec.getMessage()][:1]
    assert (rec.name, rec.levelno) == ("backstop.queue", logging.ERROR)
    msg = rec.getMessage()
    prefix = "queue %s: crash loop %s stays pending: not dead-lettered: " % (q.name, entry_id)
    assert msg.startswith(prefix) and msg.endswith("is a string, not a stream"), msg
    assert [x for x in records if x.levelno >= logging.WARNING and entry_id not in x.getMessage()] == []


# Issue 15: reclaim skips a crash loop the DLQ refuses (it stays pending)
# and the Go worker logs it; the Python worker said nothing.
def test_work_logs_each_crash_loop_the_dlq_refuses(r, q, policy):
    entry_id = crash_loop_the_dlq_refuses(r, q)
    stop = threading.Event()
    ran = []
    with LogUntil(entry_id, stop.set) as log:
        t = threading.Thread(target=q.work, args=(policy, ran.append),
                             kwargs=dict(consumer="w2", stop=stop, block_ms=20, reclaim_every=0.01, min_idle_ms=0,
                                         max_deliveries=2))
        t.start()
        t.join(20)
        stop.set()  # a worker that never logged it stops too
        t.join()
    check_skip_logged(q, entry_id, log.records)
    assert ran == []  # a crash loop is not run again
    assert int(r.hget(q.keys.stats, "reclaim_skipped")) >= 1  # stats() reads the dlq too
    [p] = r.xpending_range(q.keys.jobs, q.group, "-", "+", 10)
    assert (p["message_id"].decode(), p["times_delivered"]) == (entry_id, 2)  # still pending, as it was


# -- client flavours and a real cluster ------------------------------------------------


@pytest.mark.parametrize("options", [{"decode_responses": True}, {"protocol": 3}, {"protocol": 3, "decode_responses": True}],
                         ids=["decode_responses", "resp3", "resp3-decoded"])
def test_client_flavours(redis_server, options, policy):
    c = redis.Redis(port=redis_server.port, **options)
    c.flushall()
    q = Queue(c, "flavour")
    q.ensure_group()
    q.enqueue("job-1", "payload")
    [job] = q.read("w1", block_ms=10)
    assert (job.id, job.attempt, job.payload) == ("job-1", 1, b"payload")
    assert q.apply(job, HTTPError(503), policy).applied
    make_due(c, q)
    assert q.promote().moved == 1
    [job] = q.read("w1")
    assert (job.attempt, job.last_reason) == (2, "transient")
    assert q.reclaim("w2", min_idle_ms=0).jobs[0].entry_id == job.entry_id
    out = q.apply(job, HTTPError(400), policy)
    assert out.applied and isinstance(out.dlq_id, str)
    assert q.replay(reason="permanent_error") == 1
    s = q.stats()
    assert (s.jobs, s.pending, s.dlq) == (1, 0, 0)
    assert s.counters["replayed"] == 1
    c.close()


def test_cluster(redis_cluster, policy):
    c = redis.RedisCluster(host="127.0.0.1", port=redis_cluster[0])
    try:
        nodes = set()
        for name in ("alpha", "beta", "gamma", "delta", "epsilon", "zeta"):
            q = Queue(c, name)
            nodes.add(c.get_node_from_key(q.keys.jobs).port)
            q.ensure_group()
            q.enqueue("job-1", b"p")
            c.script_flush()  # NOSCRIPT on the node: the client loads and retries
            [job] = q.read("w1")
            assert q.apply(job, HTTPError(503, {"Retry-After": "0"}), policy).applied
            make_due(c, q)
            assert q.promote().moved == 1
            [job] = q.read("w1")
            assert job.attempt == 2
            assert q.apply(job, HTTPError(404), policy).reason == "permanent_error"
            assert q.replay() == 1
            assert q.reclaim("w2", min_idle_ms=60000) == (0, [])
            [job] = q.read("w1")
            assert q.apply(job, None, policy).applied
            s = q.stats()
            assert (s.jobs, s.pending, s.delayed, s.dlq) == (0, 0, 0, 0)
            assert s.counters["attempts:success"] == 1 and s.counters["replayed"] == 1
        assert len(nodes) > 1  # the queues really are spread over the nodes
    finally:
        c.close()
