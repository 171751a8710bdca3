"""The idempotency store on PostgreSQL (backstop.idempotency_postgres)
against a private postgres the tests start (tests/pgserver.py): every shared
case of testdata/idempotency answered as the Redis store answers it (sync and
asyncio), once_tx (the record in the caller's transaction), idempotent and
the ASGI middleware on it, and the password never shown."""

import asyncio
import base64
import json
import logging
from pathlib import Path

import psycopg
import psycopg_pool
import pytest

from backstop.idempotency import (ConflictError, IdempotencyMetrics, IdempotencyMiddleware, InProgressError,
                                  StoredResponse, idempotent)
from backstop.idempotency_postgres import AsyncPostgresIdempotencyStore, PostgresIdempotencyStore, schema
from pgserver import PASSWORD, PostgresServer
from test_idempotency_cases import replay_case

FILE = json.loads((Path(__file__).resolve().parents[3] / "testdata" / "idempotency" / "cases.json").read_text())
T = "backstop_idempotency"


@pytest.fixture(scope="module")
def pg():
    s = PostgresServer()
    with psycopg.connect(s.url, autocommit=True) as conn:
        PostgresIdempotencyStore(conn).create_table()
    yield s
    s.stop()


@pytest.fixture
def pool(pg):
    p = psycopg_pool.ConnectionPool(pg.url, min_size=1, max_size=4, open=True)
    yield p
    p.close()


def _at(raw, sql, *args):
    return raw.execute(sql, [FILE["scope"], FILE["key"], *args])


def _record(raw, tokens):
    """The record as the cases compare it: the row's columns shown as the
    Redis hash holds them; a row past its retention is absent."""
    row = _at(raw, """SELECT state, token, request, status, headers::text, body, too_large, truncated,
  extract(epoch FROM lease_until - clock_timestamp())::float8, extract(epoch FROM expires_at - clock_timestamp())::float8
FROM backstop_idempotency WHERE scope = %s AND key = %s AND expires_at > clock_timestamp()""").fetchone()
    if row is None:
        return None
    state, token, request, status, headers, body, large, truncated, lease_s, ttl_s = row
    h = {"state": state, "request": request, "ttl_s": round(ttl_s)}
    if token is not None:
        h["token"] = token
        for caller, tok in tokens.items():
            if token == tok:
                h["token"] = "{%s}" % caller
    if lease_s is not None:
        d = round(lease_s)
        h["lease_until"] = "{now%s%ds}" % ("-" if d < 0 else "+", abs(d))
    if state == "completed":
        h.update(status=str(status), body=base64.b64encode(bytes(body or b"")).decode(), too_large="1" if large else "0",
                 headers="" if headers is None else json.loads(headers))
        if truncated:
            h["truncated"] = "1"
    return h


class PgRaw:
    """The steps that reach under the store, on the row."""

    def __init__(self, raw):
        self.raw = raw

    def reset(self):
        _at(self.raw, "DELETE FROM backstop_idempotency WHERE scope = %s AND key = %s")

    def lapse(self):
        _at(self.raw, "UPDATE backstop_idempotency SET lease_until = clock_timestamp() - interval '1 second' "
                      "WHERE scope = %s AND key = %s")

    def expire(self):  # the row stays, past its retention: the store must treat it as absent
        _at(self.raw, "UPDATE backstop_idempotency SET expires_at = clock_timestamp() - interval '1 millisecond' "
                      "WHERE scope = %s AND key = %s")

    def write(self, f):
        _at(self.raw, """INSERT INTO backstop_idempotency (scope, key, state, token, request, status, headers, body,
  too_large, truncated, expires_at)
VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, clock_timestamp() + %s::float8 * interval '1 millisecond')""",
            f["state"], f.get("token"), f["request"], int(f["status"]) if "status" in f else None,
            f.get("headers") or None, base64.b64decode(f.get("body", "")), f.get("too_large") == "1",
            f.get("truncated") == "1", FILE["retention_ms"])

    def record(self, tokens):
        return _record(self.raw, tokens)


def _options():
    return dict(lease=FILE["lease_ms"] / 1000, retention=FILE["retention_ms"] / 1000, max_body=FILE["max_body"],
                metrics=IdempotencyMetrics())


def test_cases_sync(pg, pool):
    store = PostgresIdempotencyStore(pool, **_options())
    assert len(FILE["cases"]) >= 30
    with psycopg.connect(pg.url, autocommit=True) as raw:
        for c in FILE["cases"]:
            assert asyncio.run(replay_case(store, PgRaw(raw), c)) == {"replies": c["replies"], "final": c["final"]}, c["name"]


def test_cases_asyncio(pg):
    async def main():
        async with psycopg_pool.AsyncConnectionPool(pg.url, min_size=1, max_size=4, open=False) as apool:
            store = AsyncPostgresIdempotencyStore(apool, **_options())
            with psycopg.connect(pg.url, autocommit=True) as raw:
                for c in FILE["cases"]:
                    got = await replay_case(store, PgRaw(raw), c)
                    assert got == {"replies": c["replies"], "final": c["final"]}, c["name"]

    asyncio.run(main())


def test_once_tx_commits_the_write_and_the_record_together(pg, pool):
    with psycopg.connect(pg.url, autocommit=True) as c:
        c.execute("CREATE TABLE charges (id serial PRIMARY KEY, order_id text NOT NULL)")

    def count():
        with pool.connection() as c:
            return c.execute("SELECT count(*) FROM charges").fetchone()[0]

    store = PostgresIdempotencyStore(pool, metrics=IdempotencyMetrics())
    runs = []

    def charge(conn):
        runs.append(1)
        conn.execute("INSERT INTO charges (order_id) VALUES ('o1')")
        return "charged"

    for _ in range(2):
        with pool.connection() as conn, conn.transaction():
            assert store.once_tx(conn, "jobs", "j1", "j1", charge) == b"charged"
    assert (len(runs), count()) == (1, 1), "one run, one charge, its result twice"

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), pool.connection() as conn, conn.transaction():  # the caller rolls back after once_tx
        store.once_tx(conn, "jobs", "j2", "j2", charge)
        raise Rollback()
    assert (len(runs), count()) == (2, 1)

    def declined(conn):
        charge(conn)
        raise RuntimeError("card declined")

    with pool.connection() as conn, conn.transaction():  # fn raises; the caller commits anyway
        with pytest.raises(RuntimeError, match="card declined"):
            store.once_tx(conn, "jobs", "j2", "j2", declined)
    assert count() == 1
    with pool.connection() as conn, conn.transaction():
        store.once_tx(conn, "jobs", "j2", "j2", charge)
    assert (len(runs), count()) == (4, 2), "the job runs after a rollback and a failure"
    with pytest.raises(ConflictError), pool.connection() as conn, conn.transaction():
        store.once_tx(conn, "jobs", "j1", "other", charge)
    with pytest.raises(ValueError, match="inside a transaction"), psycopg.connect(pg.url, autocommit=True) as conn:
        store.once_tx(conn, "jobs", "j9", "j9", charge)

    # A duplicate while the transaction runs: in progress at once, through
    # once_tx and through begin (the middleware's).
    seen = {}

    def first(conn):
        with pool.connection() as c2, c2.transaction():
            with pytest.raises(InProgressError) as e:
                store.once_tx(c2, "jobs", "j3", "j3", charge)
            seen["retry_after"] = e.value.retry_after
        seen["begin"] = store.begin("jobs", "j3", "j3").state
        return "first"

    with pool.connection() as conn, conn.transaction():
        store.once_tx(conn, "jobs", "j3", "j3", first)
    assert seen == {"retry_after": 1, "begin": "in_progress"}
    assert store.begin("jobs", "j3", "j3").response.body == b"first"


def test_async_once_tx_and_idempotent(pg):
    async def main():
        async with psycopg_pool.AsyncConnectionPool(pg.url, min_size=1, max_size=4, open=False) as apool:
            store = AsyncPostgresIdempotencyStore(apool, metrics=IdempotencyMetrics())
            runs = []

            async def fn(conn):
                runs.append(1)
                await conn.execute("SELECT 1")
                return b"done"

            for _ in range(2):
                async with apool.connection() as conn, conn.transaction():
                    assert await store.once_tx(conn, "jobs", "a1", "a1", fn) == b"done"

            @idempotent(store, key=lambda job: job["id"])
            async def handle(job):
                runs.append(1)
                return {"charged": job["id"]}

            assert await handle({"id": "a2"}) == await handle({"id": "a2"}) == {"charged": "a2"}
            assert len(runs) == 2
            await store.drain()

    asyncio.run(main())


def test_idempotent_sync(pool):
    store = PostgresIdempotencyStore(pool, metrics=IdempotencyMetrics())
    effects = []

    @idempotent(store, key=lambda job: job["id"])
    def handle(job):
        effects.append(job["id"])
        return {"ok": job["id"]}

    assert handle({"id": "w1"}) == handle({"id": "w1"}) == {"ok": "w1"}
    assert effects == ["w1"]
    with pytest.raises(ConflictError):
        handle({"id": "w1", "other": True})


def test_middleware(pg):
    """The ASGI middleware on the asyncio PostgreSQL store: replay, 422, 409."""
    async def main():
        async with psycopg_pool.AsyncConnectionPool(pg.url, min_size=1, max_size=4, open=False) as apool:
            store = AsyncPostgresIdempotencyStore(apool, metrics=IdempotencyMetrics())
            runs, gate, started = [], asyncio.Event(), asyncio.Event()

            async def app(scope, receive, send):
                body = (await receive())["body"]
                runs.append(body)
                if body == b"slow":
                    started.set()
                    await gate.wait()
                await send({"type": "http.response.start", "status": 201,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": b'{"charged":"' + body + b'"}'})

            mw = IdempotencyMiddleware(app, store=store)

            async def post(key, body):
                sent = []

                async def receive():
                    return {"type": "http.request", "body": body, "more_body": False}

                async def send(m):
                    sent.append(m)

                await mw({"type": "http", "method": "POST", "path": "/charges",
                          "headers": [(b"idempotency-key", key.encode())]}, receive, send)
                return sent[0]["status"], dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])

            a, b = await post("k1", b"500"), await post("k1", b"500")
            assert (a[0], b[0], a[2] == b[2], b[1].get(b"idempotent-replayed"), len(runs)) == (201, 201, True, b"true", 1)
            assert (await post("k1", b"700"))[0] == 422
            first = asyncio.ensure_future(post("k2", b"slow"))
            await started.wait()
            dup = await post("k2", b"slow")
            assert (dup[0], dup[1].get(b"retry-after")) == (409, b"30")
            gate.set()
            assert (await first)[0] == 201
            assert (await post("k2", b"slow"))[1].get(b"idempotent-replayed") == b"true"
            await store.drain()

    asyncio.run(main())


def test_password_never_shown(pg, caplog):
    """A wrong password, a server that is not there: the errors and the log
    lines never show the password."""
    caplog.set_level(logging.DEBUG)
    errors = []
    wrong = pg.url.replace(PASSWORD, "wrong")
    gone = pg.url.replace(":%d/" % pg.port, ":1/")
    for url in (wrong, gone):
        p = psycopg_pool.ConnectionPool(url, min_size=0, max_size=1, open=True, timeout=0.5)
        store = PostgresIdempotencyStore(p, metrics=IdempotencyMetrics(), lease=0.05, retention=1)
        for call in (lambda: store.begin("s", "k", "r"), lambda: store.complete("s", "k", "tok", StoredResponse(200)),
                     lambda: store.fail("s", "k", "tok")):
            try:
                call()
            except Exception as e:  # psycopg's own errors, or the pool's timeout
                errors.append(e)
        p.close()
    assert len(errors) == 6
    for e in errors:
        shown = "%s %r %r" % (e, e, getattr(e, "__cause__", None))
        assert PASSWORD not in shown, shown
    assert PASSWORD not in caplog.text


def test_schema_documented():
    """schema() is the DDL docs/idempotency.md shows (and Go's and Node's)."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "idempotency.md").read_text()
    block = doc.split("```sql\n", 1)[1].split("```", 1)[0]
    assert schema() == block


def test_table_name_with_percent_and_quote(pool):
    # The name is quoted as an identifier; psycopg reads % in a query with
    # parameters as a placeholder, so the store must double it there.
    store = PostgresIdempotencyStore(pool, table='odd%s"name%', metrics=IdempotencyMetrics())
    store.create_table()
    claim = store.begin("pct", "k1", "r1")
    assert claim.state == "started"
    store.complete("pct", "k1", claim.token, StoredResponse(201, {}, b"made"))
    again = store.begin("pct", "k1", "r1")
    assert (again.state, again.response.status, again.response.body) == ("completed", 201, b"made")
    assert store.purge() == 0


def test_a_table_of_its_own_and_an_older_tables_upgrade(pool):
    # Its own claim function, its name quoted as an identifier and as a
    # string (a quote and capitals in it); the default table is not it.
    m = IdempotencyMetrics()
    other = PostgresIdempotencyStore(pool, table="Idem'Keys", metrics=m)
    other.create_table()
    c = other.begin("", "own-k1", "r1")
    assert c.state == "started"
    other.complete("", "own-k1", c.token, StoredResponse(201, {}, b"paid"))
    again = other.begin("", "own-k1", "r1")
    assert (again.state, again.response.body) == ("completed", b"paid")
    with pool.connection() as conn:
        assert conn.execute('SELECT count(*) FROM "Idem\'Keys"').fetchone()[0] == 1
    assert PostgresIdempotencyStore(pool, metrics=m).begin("", "own-k1", "r1").state == "started"
    # A table an older schema() made (no function): begin says to run the
    # DDL again, and running it keeps the table.
    old = PostgresIdempotencyStore(pool, table="idem_old", metrics=m)
    with pool.connection() as conn:
        conn.execute(schema("idem_old").split("CREATE OR REPLACE FUNCTION")[0])
    with pytest.raises(psycopg.ProgrammingError, match=r"run create_table\(\) or schema\(\) again"):
        old.begin("", "own-k1", "r1")
    old.create_table()
    assert old.begin("", "own-k1", "r1").state == "started"
