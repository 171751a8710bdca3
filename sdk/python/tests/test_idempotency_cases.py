"""The shared idempotency cases (testdata/idempotency/cases.json, see its
README) replayed through the Python stores, sync and asyncio, against a real
redis-server and a real Redis Cluster: every reply and the record after must
be what the Go store produced."""

import asyncio
import base64
import json
from pathlib import Path

import pytest
import redis
import redis.asyncio

from backstop.idempotency import (AsyncIdempotencyStore, IdempotencyMetrics, IdempotencyStore, LeaseLostError,
                                  StoredResponse)

FILE = json.loads((Path(__file__).resolve().parents[3] / "testdata" / "idempotency" / "cases.json").read_text())


def _claim_reply(cl):
    r = {"state": cl.state}
    if cl.state == "started":
        r["taken_over"] = cl.taken_over
    elif cl.state == "in_progress":
        r["retry_after_s"] = cl.retry_after
    elif cl.state == "completed":
        r.update(status=cl.response.status, headers=cl.response.headers, too_large=cl.response.too_large,
                 body_b64=base64.b64encode(cl.response.body).decode())
        if cl.response.truncated:
            r["truncated"] = True
    return r


def _record(raw, rk, tokens):
    h = {k.decode(): v.decode() for k, v in raw.hgetall(rk).items()}
    if not h:
        return None
    s, us = raw.time()
    now = s * 1000 + us // 1000
    for caller, tok in tokens.items():
        if h.get("token") == tok:
            h["token"] = "{%s}" % caller
    if "lease_until" in h:
        d = round((int(h["lease_until"]) - now) / 1000)
        h["lease_until"] = "{now%s%ds}" % ("-" if d < 0 else "+", abs(d))
    if h.get("headers"):
        h["headers"] = json.loads(h["headers"])
    h["ttl_s"] = round(raw.pttl(rk) / 1000)
    return h


async def _maybe(v):
    return await v if asyncio.iscoroutine(v) else v


class RedisRaw:
    """The steps that reach under the store, on the Redis hash."""

    def __init__(self, raw, rk):
        self.raw, self.rk = raw, rk

    def reset(self):
        self.raw.delete(self.rk)

    def lapse(self):
        s, us = self.raw.time()
        self.raw.hset(self.rk, "lease_until", s * 1000 + us // 1000 - 1000)

    def expire(self):
        self.raw.delete(self.rk)

    def write(self, fields):
        # A record as another adapter (or a version before the header rule) stored it.
        self.raw.hset(self.rk, mapping=fields)
        self.raw.pexpire(self.rk, FILE["retention_ms"])

    def record(self, tokens):
        return _record(self.raw, self.rk, tokens)


async def replay_case(store, raw, c):
    """Runs case c's steps through store (sync or asyncio) and raw (reset,
    lapse, expire, write, record: the steps that reach under the store);
    tests/test_idempotency_postgres.py replays the cases with its own raw."""
    raw.reset()
    tokens, replies = {}, []
    for st in c["steps"]:
        op = st["op"]
        if op == "begin":
            cl = await _maybe(store.begin(FILE["scope"], FILE["key"], st["request"]))
            if cl.state == "started":
                tokens[st["caller"]] = cl.token
            replies.append(_claim_reply(cl))
        elif op in ("complete", "fail"):
            tok = tokens.get(st["caller"], "never-begun-" + st["caller"])
            try:
                if op == "complete":
                    await _maybe(store.complete(FILE["scope"], FILE["key"], tok, StoredResponse(
                        st["status"], st.get("headers") or {}, base64.b64decode(st.get("body_b64", "")),
                        truncated=st.get("truncated", False))))
                else:
                    await _maybe(store.fail(FILE["scope"], FILE["key"], tok))
                replies.append({"ok": True})
            except LeaseLostError:
                replies.append({"error": "lease_lost"})
        elif op == "lapse":
            raw.lapse()
        elif op == "expire":
            raw.expire()
        elif op == "write":
            raw.write(st["fields"])
        else:
            raise AssertionError("unknown op %r" % op)
    return {"replies": replies, "final": raw.record(tokens)}


async def _replay(store, raw, c):
    return await replay_case(store, RedisRaw(raw, store.record_key(FILE["scope"], FILE["key"])), c)


def _options():
    return dict(lease=FILE["lease_ms"] / 1000, retention=FILE["retention_ms"] / 1000, max_body=FILE["max_body"],
                metrics=IdempotencyMetrics())


def _check(store, raw):
    assert len(FILE["cases"]) >= 30
    for c in FILE["cases"]:
        got = asyncio.run(_replay(store, raw, c))
        assert got == {"replies": c["replies"], "final": c["final"]}, c["name"]


@pytest.mark.parametrize("protocol", [2, 3])
def test_cases_sync(redis_server, protocol):
    raw = redis.Redis(port=redis_server.port)
    _check(IdempotencyStore(redis.Redis(port=redis_server.port, protocol=protocol), **_options()), raw)


def test_cases_asyncio(redis_server):
    raw = redis.Redis(port=redis_server.port)

    async def main():
        client = redis.asyncio.Redis(port=redis_server.port)
        store = AsyncIdempotencyStore(client, **_options())
        for c in FILE["cases"]:
            got = await _replay(store, raw, c)
            assert got == {"replies": c["replies"], "final": c["final"]}, c["name"]
        await client.aclose()

    asyncio.run(main())


def test_cases_cluster(redis_cluster):
    raw = redis.RedisCluster(host="127.0.0.1", port=redis_cluster[0])
    _check(IdempotencyStore(redis.RedisCluster(host="127.0.0.1", port=redis_cluster[0]), **_options()), raw)
