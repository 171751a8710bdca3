"""Plain producers (spec: issue 27): a Redis stream entry without backstop's
fields, a RabbitMQ message without backstop's headers, read as the first
attempt of a job, and the fields JSON a plain entry without a payload
field gets as its payload."""
import asyncio
import datetime
import json
import re

import pytest
import redis.asyncio

import backstop

from backstop.redis import AsyncQueue, Job, Queue, _fields_json
from backstop.rabbitmq import _core


# -- the fields JSON -------------------------------------------------------------


def test_fields_json_sorts_names_by_their_bytes_not_utf16_nor_locale():
    fields = [("é", "e-acute"), ("z", "zed"), ("Z", "Zed"), ("\U0001F600", "smile"), ("\uff5e", "wide"),
              ("a", "1"), ("_", "u")]
    got = _fields_json(fields)
    # UTF-8 order: ASCII first ("Z" < "_" < "a" < "z"), then U+00E9 (C3 A9),
    # U+FF5E (EF BD 9E), U+1F600 (F0 9F 98 80). UTF-16 code units would
    # put the emoji (a surrogate pair, D83D) before U+FF5E.
    assert got == '{"Z":"Zed","_":"u","a":"1","z":"zed","é":"e-acute","～":"wide","😀":"smile"}'.encode()
    assert list(json.loads(got)) == ["Z", "_", "a", "z", "é", "～", "😀"]
    assert sorted(json.loads(got), key=lambda k: k.encode("utf-16-be")) != list(json.loads(got))


def test_fields_json_sorts_bytes_names_and_keeps_bytes_that_are_not_utf8():
    fields = {b"\xff": b"\xfe", b"b": b"2", b"a": b"1", b"\xc3\xa9": b"x"}
    assert _fields_json(fields) == b'{"a":"1","b":"2","\xc3\xa9":"x","\xff":"\xfe"}'
    # str and bytes names alike: by their UTF-8 bytes.
    assert _fields_json({"é": "x", b"e": b"y"}) == '{"e":"y","é":"x"}'.encode()


def test_fields_json_escapes_only_backslash_quote_and_control_bytes():
    fields = [('q"uote', "back\\slash"), ("ctl", "a\x01b\nc\x1f\x7f"), ("tab", "\t"), ("nul", "\x00"),
              ("slash", "</script>"), ("ws", " \u2028 é")]
    got = _fields_json(fields)
    assert got == ('{"ctl":"a\\u0001b\\u000ac\\u001f\x7f","nul":"\\u0000","q\\"uote":"back\\\\slash",'
                   '"slash":"</script>","tab":"\\u0009","ws":" \u2028 é"}').encode()
    # Lowercase hex, 4 digits, for every byte below 0x20.
    for b in range(0x20):
        assert _fields_json([("k", bytes([b]))]) == b'{"k":"\\u00' + b"%02x" % b + b'"}'
    # Valid JSON, back to the same fields.
    assert json.loads(got) == dict(fields)


def test_fields_json_last_value_wins_in_the_first_name_order():
    assert _fields_json([("k", "1"), ("k", "2"), ("a", "x")]) == b'{"a":"x","k":"2"}'
    assert _fields_json([]) == b"{}"
    assert _fields_json([("a", ""), ("b", "")]) == b'{"a":"","b":""}'


# -- plain Redis entries ------------------------------------------------------------


def test_a_plain_entry_is_the_first_attempt_of_a_job():
    job = Job.from_entry(b"1733370000000-0", {b"to": b"a@example.com", b"subject": b"hi"})
    assert (job.entry_id, job.id, job.attempt, job.first_enqueued_ms, job.payload, job.malformed) == (
        "1733370000000-0", "1733370000000-0", 1, 1733370000000, b'{"subject":"hi","to":"a@example.com"}', False)
    assert (job.last_error, job.last_reason, job.prev_delay_ms, job.job_type) == ("", "", 0, "")
    assert job.fields == {"to": "a@example.com", "subject": "hi"}


def test_a_plain_entry_with_a_payload_field_has_it_as_its_payload_and_type_is_read():
    job = Job.from_entry("5-1", {"type": "charge_card", "payload": b"\xff{}", "trace": "t1"})
    assert (job.id, job.attempt, job.first_enqueued_ms, job.payload, job.job_type, job.malformed) == (
        "5-1", 1, 5, b"\xff{}", "charge_card", False)
    # Without a payload field the type is one of the fields.
    assert Job.from_entry("5-1", {"type": "send_email", "to": "a"}).payload == b'{"to":"a","type":"send_email"}'


def test_backstops_other_fields_in_a_plain_entry_are_only_fields():
    job = Job.from_entry("7-0", {"source": "x", "last_error": "boom", "prev_delay_ms": "5000", "last_reason": "r"})
    assert (job.last_error, job.last_reason, job.prev_delay_ms, job.malformed) == ("", "", 0, False)
    assert job.payload == b'{"last_error":"boom","last_reason":"r","prev_delay_ms":"5000","source":"x"}'


@pytest.mark.parametrize("name", ["id", "attempt", "first_enqueued_ms", "malformed_delayed_member"])
def test_an_entry_with_any_of_backstops_fields_keeps_the_malformed_rule(name):
    job = Job.from_entry(b"1733370000000-0", {name.encode(): b"1", b"to": b"a"})
    assert job.malformed and job.attempt in (0, 1) and job.id in ("", "1")
    assert job.id != "1733370000000-0" and job.payload == b""


def test_a_plain_entry_past_2_to_the_53_ms_is_malformed():
    assert not Job.from_entry("9007199254740991-0", {"a": "1"}).malformed
    assert Job.from_entry("9007199254740991-0", {"a": "1"}).first_enqueued_ms == 9007199254740991
    assert Job.from_entry("9007199254740992-0", {"a": "1"}).malformed
    assert Job.from_entry("18446744073709551615-0", {"a": "1"}).malformed


def test_a_plain_entry_read_from_redis(r):
    q = Queue(r, "plain")
    q.ensure_group()
    eid = r.xadd(q.keys.jobs, {"k": "1", "é": "2"}).decode()
    [job] = q.read("w1")
    assert (job.entry_id, job.id, job.attempt, job.first_enqueued_ms, job.malformed) == (
        eid, eid, 1, int(eid.split("-")[0]), False)
    assert job.payload == '{"k":"1","é":"2"}'.encode()


def test_a_plain_entry_read_by_the_asyncio_queue_over_resp3(redis_server):
    async def main():
        c = redis.asyncio.Redis(port=redis_server.port, protocol=3, decode_responses=True)
        try:
            await c.flushall()
            q = AsyncQueue(c, "plain")
            await q.ensure_group()
            eid = await c.xadd(q.keys.jobs, {"type": "send_email", "to": "a"})
            return eid, await q.read("w1")
        finally:
            await c.aclose()

    eid, [job] = asyncio.run(main())
    assert (job.id, job.attempt, job.payload, job.job_type, job.malformed) == (
        eid, 1, b'{"to":"a","type":"send_email"}', "send_email", False)


# -- plain RabbitMQ messages --------------------------------------------------------


def test_a_plain_message_is_the_first_attempt_of_its_message_id():
    job = _core.job_from("q", "m1", {"__TypeId__": "com.example.Mail"}, b'{"to":"a"}', "application/json",
                         None, 1733370000123)
    assert (job.id, job.attempt, job.first_enqueued_ms, job.payload, job.malformed) == (
        "m1", 1, 1733370000123, b'{"to":"a"}', False)


def test_a_plain_message_without_an_id_is_adopted_under_an_id_of_its_own():
    # Issue 40: the sha256-of-body id made two events with one body one job.
    body = b'{"to":"a"}'
    h = {"x-delivery-count": 3, "other": "o"}
    job = _core.job_from("q", None, h, body, None, None, 5)
    assert (job.id, job.attempt, job.malformed) == ("", 1, False)
    assert _core.job_from("q", "", {}, body, None).id == ""
    with backstop.load_policy({"max_attempts": 2}) as policy:
        step = _core.triage(job, policy, 5, _core.Kept(), 10)
    assert step.adopt and step.plan is None
    a, b = _core.before_run("q", job, step, 10), _core.adopted("q", job)
    # To the work queue, with its headers but the broker's count, and a new id.
    assert (a.exchange, a.routing_key, a.headers) == ("", "q", {"other": "o"})
    assert re.fullmatch(r"amqp-[0-9a-f]{32}", a.message_id) and a.message_id != b.message_id
    again = _core.job_from("q", a.message_id, a.headers, body, None, None, 5)
    assert (again.id, again.attempt, again.malformed) == (a.message_id, 1, False)


def test_a_plain_messages_timestamp_is_its_first_enqueued_time():
    ts = datetime.datetime.fromtimestamp(1700000000, datetime.timezone.utc)  # aio-pika
    assert _core.job_from("q", "m", None, b"", None, ts, 5).first_enqueued_ms == 1700000000000
    assert _core.job_from("q", "m", None, b"", None, 1700000000, 5).first_enqueued_ms == 1700000000000  # pika
    zero = datetime.datetime.fromtimestamp(0, datetime.timezone.utc)
    assert _core.job_from("q", "m", None, b"", None, zero, 5).first_enqueued_ms == 5
    before = _core.now_ms()
    assert before <= _core.job_from("q", "m", None, b"", None).first_enqueued_ms <= _core.now_ms()


def test_a_plain_messages_type_header_is_read():
    job = _core.job_from("q", "m", {"backstop-job-type": "send_email", "backstop-prev-delay-ms": "5"}, b"", None)
    assert (job.job_type, job.prev_delay_ms, job.malformed) == ("send_email", 0, False)


@pytest.mark.parametrize("headers", [{"backstop-attempt": "1"}, {"backstop-first-enqueued-ms": "1"},
                                     {"backstop-attempt": None, "backstop-first-enqueued-ms": None},
                                     {"backstop-attempt": "x", "backstop-first-enqueued-ms": "1"}])
def test_a_message_with_one_of_the_headers_or_bad_ones_stays_malformed(headers):
    assert _core.job_from("q", "m", headers, b"", None).malformed


def _plain():
    return _core.job_from("q", "m1", {"x-delivery-count": 1, "other": "o"}, b"body", None, None, 1733370000000)


def test_every_move_of_a_plain_message_carries_the_job_id_and_backstops_headers():
    job = _plain()
    retry = _core.move("q", job, ("retry", "transient", None, "HTTP 503", 1000), 1733370001000)
    defer = _core.move("q", job, ("defer", "circuit_open", None, "", 2000), 1733370001000)
    dead = _core.move("q", job, ("dead_letter", "permanent", None, "HTTP 400", 0), 1733370001000)
    for pub in (retry, defer, dead):
        assert pub.message_id == job.id
        assert pub.headers["backstop-first-enqueued-ms"] == "1733370000000" and pub.headers["other"] == "o"
        assert "x-delivery-count" not in pub.headers
        # The next delivery is no longer plain: the same job.
        nxt = _core.job_from("q", pub.message_id, pub.headers, b"body", None)
        assert (nxt.id, nxt.first_enqueued_ms, nxt.malformed) == (job.id, 1733370000000, False)
    assert (retry.headers["backstop-attempt"], defer.headers["backstop-attempt"], dead.headers["backstop-attempt"]) == (
        "2", "1", "1")


def test_a_backstop_jobs_moves_keep_its_headers_as_they_were():
    h = {"backstop-attempt": "2", "backstop-first-enqueued-ms": 5, "backstop-destination": "q"}  # an AMQP integer
    job = _core.job_from("q", "j", h, b"", None)
    pub = _core.move("q", job, ("defer", "circuit_open", None, "", 2000), 10)
    assert (pub.message_id, pub.headers["backstop-attempt"], pub.headers["backstop-first-enqueued-ms"]) == ("j", "2", 5)
