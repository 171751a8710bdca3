"""The shared queue cases (testdata/queue/cases.json, see its README)
replayed through the Python worker's path against a real redis-server: the
job as ``Job.from_entry`` reads it, the failure classified, decided by
backstop.wasm and applied through the scripts (``Queue.apply``'s plan and
move), then every key compared with what the Go worker left."""
import codecs
import json
import os
import re
import socket
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import redis

import backstop
from backstop import DeadlineExceeded, RetryError
from backstop._policy import Decision
from backstop._retry import classifier
from backstop.redis import Job, Queue, _error_text

CASES = Path(os.environ.get("BACKSTOP_QUEUE_CASES",
                            Path(__file__).resolve().parents[3] / "testdata" / "queue" / "cases.json"))
FILE = json.loads(CASES.read_text())
NOW = re.compile(r"\{now([+-][0-9]+)?\}")
# The failure fields a spy reports, and the two flags the worker adds (retry
# at one layer: an inner retry that gave up, docs/layers.md).
FIELDS = ("http_status", "grpc_code", "error_kind", "retry_after", "method", "retried_downstream", "server_declined")
NEW_ID = re.compile(r"\b[0-9]{13}-[0-9]+\b")
MS = re.compile(r"\b[0-9]{13}\b")


class CaseError(Exception):
    """The failure a case's handler raises; classified by its fields."""

    def __init__(self, spec: Dict[str, Any]) -> None:
        super().__init__(spec["message"])
        self.fields = {k: spec[k] for k in ("http_status", "grpc_code", "error_kind", "retry_after", "method") if spec.get(k)}


class ConnectTimeout(Exception):
    """A third-party connect timeout (requests, httpx): matched by name."""


def native(kind: str, message: str) -> BaseException:
    """Python's own error of a kind (errorkinds.json), with the case's text."""
    return {
        "connection_refused": lambda: ConnectionRefusedError(message),
        "connection_reset": lambda: ConnectionResetError(message),
        "connect_timeout": lambda: ConnectTimeout(message),
        "timeout": lambda: TimeoutError(message),
        "dns_temporary": lambda: socket.gaierror(socket.EAI_AGAIN, message),
        "dns_not_found": lambda: socket.gaierror(socket.EAI_NONAME, message),
    }[kind]()


def case_error(spec: Dict[str, Any]) -> BaseException:
    """The exception a case's handler raises: a CaseError classified by its
    fields, or a native error left to the built-in classification. With
    inner_retry (a reason), Python's own RetryError of an inner
    @policy.retry that gave up with that reason, whose last exception is
    that failure; its text is the case's message, as the others' is."""
    if spec.get("inner_retry") is not None:
        reason = spec["inner_retry"]
        last = case_error({k: v for k, v in spec.items() if k != "inner_retry"})
        # circuit_open: refused before any call, as @policy.retry raises it.
        e = RetryError(reason, 0 if reason == "circuit_open" else 1, last, Decision("dead_letter", 0, reason, "retryable"))
        e.args = (spec["message"],)
        e.__cause__ = last
        return e
    return native(spec["native"], spec["message"]) if spec.get("native") else CaseError(spec)


def classify(exc: BaseException) -> Any:
    # None: the built-in classification (describe), for native errors.
    return dict(exc.fields) if isinstance(exc, CaseError) else None


class Spy:
    """The policy, reporting the failure it was asked about."""

    def __init__(self, policy: Any) -> None:
        self.policy, self.asked = policy, None

    def outcome(self, event: str, fields: Any = None, **kw: Any) -> Any:
        if event == "failure":
            self.asked = {k: fields[k] for k in FIELDS if fields.get(k)}
        return self.policy.outcome(event, fields, **kw)


@pytest.fixture(scope="module")
def r(redis_server):
    # RESP2 and raw replies: RESP3 gives scores as doubles, and the parsed
    # replies lose a stream entry's field order.
    c = redis.Redis(port=redis_server.port, protocol=2)
    for cmd in ("XRANGE", "XPENDING", "XINFO GROUPS", "ZRANGE", "HGETALL", "XCLAIM"):
        c.response_callbacks.pop(cmd, None)
    yield c
    c.close()


@pytest.fixture(scope="module")
def policy():
    with backstop.load_policy(json.dumps(FILE["policy"])) as p:
        yield p


def server_ms(r: redis.Redis) -> int:
    s, us = r.time()
    return s * 1000 + us // 1000


def text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def res_now(s: str, base: int, known: set) -> str:
    """A "{now±N}" token as base + N; N becomes a known offset."""
    def one(m: "re.Match[str]") -> str:
        off = int(m.group(1) or 0)
        known.add(off)
        return str(base + off)
    return NOW.sub(one, s)


def setup(r: redis.Redis, keys: Dict[str, str], state: Dict[str, Any]) -> Tuple[int, set]:
    r.flushall()
    base = server_ms(r)
    known = {0}

    def res(s: str) -> str:
        return res_now(s, base, known)

    def add(key: str, entries: List[Dict[str, Any]]) -> None:
        for e in entries:
            r.execute_command("XADD", key, res(e["id"]), *[res(f) for f in e["fields"]])

    add(keys["jobs"], state.get("jobs", []))
    r.execute_command("XGROUP", "CREATE", keys["jobs"], FILE["group"], "0", "MKSTREAM")
    for e in state.get("jobs", []):
        p = e.get("pending")
        if p:
            r.execute_command("XCLAIM", keys["jobs"], FILE["group"], p["consumer"], 0, res(e["id"]), "IDLE", p["idle_ms"],
                              "RETRYCOUNT", p["deliveries"], "FORCE", "JUSTID")
    add(keys["dlq"], state.get("dlq", []))
    for m in state.get("delayed", []):
        r.execute_command("ZADD", keys["delayed"], res(m["score"]), res(m["member"]))
    for f, v in state.get("stats", {}).items():
        r.execute_command("HSET", keys["stats"], f, res(v))
    for cmd in state.get("raw", []):
        r.execute_command(*[res(a) for a in cmd])
    return base, known


def pairs(flat: List[Any]) -> List[Tuple[Any, Any]]:
    return list(zip(flat[0::2], flat[1::2]))


def dump(r: redis.Redis, keys: Dict[str, str]) -> Dict[str, Any]:
    names = {v: k for k, v in keys.items()}
    out: Dict[str, Any] = {}
    for key in sorted(text(k) for k in r.keys("*")):
        name = names.get(key, key)
        typ = text(r.type(key))
        if typ == "stream":
            entries = [[text(i), [text(x) for x in f]] for i, f in r.execute_command("XRANGE", key, "-", "+")]
            groups = []
            for g in r.execute_command("XINFO", "GROUPS", key):
                g = {text(k): v for k, v in (g.items() if isinstance(g, dict) else pairs(g))}
                pend = [[text(i), text(c), n] for i, c, _, n in
                        r.execute_command("XPENDING", key, g["name"], "-", "+", 10000)]
                groups.append({"name": text(g["name"]), "last_delivered_id": text(g["last-delivered-id"]), "pending": pend})
            out[name] = {"type": "stream", "entries": entries, "groups": groups}
        elif typ == "zset":
            out[name] = {"type": "zset", "members": [[text(m), text(s)] for m, s in
                                                     pairs(r.execute_command("ZRANGE", key, 0, -1, "WITHSCORES"))]}
        elif typ == "hash":
            out[name] = {"type": "hash", "fields": {text(k): text(v) for k, v in pairs(r.execute_command("HGETALL", key))}}
        elif typ == "string":
            out[name] = {"type": "string", "value": text(r.get(key))}
        else:
            out[name] = {"type": typ}
    return out


def normalise(reply: Any, state: Dict[str, Any], base: int, end: int, known: set, texts: Dict[str, str]) -> Any:
    """As the Go applier does (testdata/queue/README.md): new stream ids in
    order of first appearance in the canonical JSON, then times as offsets."""
    s = json.dumps([reply, state], sort_keys=True, separators=(",", ":"))
    # The error's text is the language's own ("Type: message", a gaierror's
    # "[Errno -3] message"; Go and the cases: the message): not compared.
    esc = lambda t: json.dumps(t)[1:-1]  # noqa: E731
    for mine, theirs in texts.items():
        # In a field, and in a delayed member (JSON in JSON).
        s = s.replace(esc(esc(mine)), esc(esc(theirs))).replace(esc(mine), esc(theirs))
    ids: Dict[str, str] = {}
    s = NEW_ID.sub(lambda m: ids.setdefault(m.group(0), "new:%d" % (len(ids) + 1)), s)
    offs = sorted(known)

    def ms(m: "re.Match[str]") -> str:
        n = int(m.group(0))
        for d in offs:
            if base <= n - d <= end:
                return "{now}" if d == 0 else "{now%+d}" % d
        return m.group(0)
    return json.loads(MS.sub(ms, s))


def go_text(b: bytes) -> str:
    """Bytes as Go's encoding/json writes a string of them: each byte not
    part of valid UTF-8 becomes U+FFFD."""
    return b.decode("utf-8", "backstop-each-byte")


codecs.register_error("backstop-each-byte", lambda e: ("\ufffd" * (e.end - e.start), e.end))


def read_reply(job: Job) -> Dict[str, Any]:
    """The job of a "read" event, as the cases write it; a malformed one
    only as such (the rest differs by language). The numbers as decimal
    text, as Go's cases write them: normalise rewrites a time in the JSON
    text, and a bare number made "{now-1000}" would not be JSON."""
    if job.malformed:
        return {"malformed": True}
    return {"id": job.id, "attempt": str(job.attempt), "first_enqueued_ms": str(job.first_enqueued_ms),
            "payload": go_text(job.payload), "type": job.job_type, "last_error": job.last_error,
            "last_reason": job.last_reason, "prev_delay_ms": str(job.prev_delay_ms), "malformed": False}


def run(r: redis.Redis, q: Queue, policy: Any, case: Dict[str, Any]) -> Any:
    keys = {"jobs": q.keys.jobs, "delayed": q.keys.delayed, "dlq": q.keys.dlq, "stats": q.keys.stats}
    base, known = setup(r, keys, case["state"])
    ev = dict(case["event"])
    # Entry ids may be times too ("{now-1000}-0"), as in the state.
    if "entry" in ev:
        ev["entry"] = res_now(ev["entry"], base, known)
    if "entries" in ev:
        ev["entries"] = [res_now(e, base, known) for e in ev["entries"]]
    spec = ev.get("error")
    exc: Any = None
    if spec:
        exc = case_error(spec)
    texts = {_error_text(exc): spec["message"]} if exc is not None else {}
    if ev.get("deadline"):
        # The handler overran the worker's deadline: the error Queue.work makes then.
        exc = DeadlineExceeded("handler", 0.05, True)
        texts = {_error_text(exc): "{deadline_error}"}

    def apply(job: Job) -> Dict[str, Any]:
        # The worker's path (Queue.work): a malformed job is not run.
        spy = Spy(policy)
        plan = q._plan(job, None if job.malformed else exc, spy, classifier(classify))
        try:
            out = q._move(job, plan)
        except redis.ResponseError:
            return {"refused": True}
        reply: Dict[str, Any] = {"action": out.action, "reason": out.reason, "applied": out.applied}
        if spy.asked is not None:
            reply["failure"] = spy.asked
        if out.action == "retry":
            reply["delay_ms"] = plan[4]
            known.add(plan[4])
        return reply

    reply: Any
    try:
        if ev["type"] == "handle":
            (entry,) = r.execute_command("XRANGE", keys["jobs"], ev["entry"], ev["entry"])
            reply = apply(Job.from_entry(entry[0], dict(pairs(entry[1]))))
        elif ev["type"] == "read":
            (entry,) = r.execute_command("XRANGE", keys["jobs"], ev["entry"], ev["entry"])
            reply = {"job": read_reply(Job.from_entry(entry[0], dict(pairs(entry[1]))))}
        elif ev["type"] == "defer":
            # The policy refused the job (an open breaker, an empty budget).
            delay = ev.get("delay_ms", 0)
            known.add(delay)
            due = q.defer(ev["entry"], delay, ev.get("reason", ""), ev.get("last_error", ""))
            reply = {"action": "defer", "reason": ev.get("reason", ""), "applied": due is not None, "delay_ms": delay}
        elif ev["type"] == "promote":
            p = q.promote(ev.get("limit", 0))
            reply = {"moved": p.moved, "next_due": p.next_due_ms is not None}
        elif ev["type"] == "reclaim":
            rec = q.reclaim(FILE["consumer"], min_idle_ms=ev.get("min_idle_ms", 0), count=ev.get("count", 0),
                            max_deliveries=ev.get("max_deliveries", 0))
            reply = {"dead_lettered": rec.dead_lettered, "claimed": [j.entry_id for j in rec.jobs],
                     "skipped": [[i, w] for i, w in rec.skipped], "outcomes": [apply(j) for j in rec.jobs]}
        elif ev["type"] == "run":
            if ev.get("before"):
                ran = q.run(due_before=int(res_now(ev["before"], base, known)), limit=ev.get("limit", 0))
            else:
                ran = q.run(ev.get("job_id", ""))
            reply = {"moved": ran.moved, "left": ran.left}
        elif ev["type"] == "replay":
            reply = {"replayed": q.replay(ev.get("limit", 0), ev.get("reason") or None, job_type=ev.get("job_type") or None)}
        elif ev["type"] == "hold":
            reply = {"held": q.hold(ev["consumer"], ev["entries"])}
        elif ev["type"] == "enqueue":
            reply = {"entry": q.enqueue(ev.get("job_id", ""), ev.get("payload", ""), job_type=ev.get("job_type") or None)}
        else:
            raise AssertionError("unknown event %r" % ev["type"])
    except (redis.ResponseError, ValueError, TypeError):
        reply = {"refused": True}
    end = server_ms(r)
    return normalise(reply, dump(r, keys), base, end, known, texts)


def test_at_least_200_cases():
    assert len(FILE["cases"]) >= 200


@pytest.mark.parametrize("case", FILE["cases"], ids=[c["name"] for c in FILE["cases"]])
def test_queue_case(r, policy, case):
    q = Queue(r, FILE["queue"], group=FILE["group"])
    got = run(r, q, policy, case)
    assert got == [case["expect"]["reply"], case["expect"]["state"]]
