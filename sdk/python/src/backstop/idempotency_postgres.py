"""The idempotency store on PostgreSQL (``docs/idempotency.md``,
"PostgreSQL"): the Redis store's ``begin``/``complete``/``fail`` on a table,
answering ``testdata/idempotency`` as the Redis store does, over psycopg 3
(``pip install 'backstop-policy[postgres]'``), and ``once_tx``, which writes
the record in the caller's transaction so that the business write and the
record commit (or roll back) together.

``PostgresIdempotencyStore`` takes a ``psycopg_pool.ConnectionPool`` (or a
``psycopg.Connection``, used by one call at a time);
``AsyncPostgresIdempotencyStore`` their asyncio counterparts. Both work with
``idempotent`` and (the asyncio one) ``IdempotencyMiddleware``. The table
and its claim are the contract's (``scripts/idempotency.sql``, which every
language's store runs): a claim is one call of the table's function, which
takes the key's transaction-scoped advisory lock
(``pg_try_advisory_xact_lock``; taken elsewhere: in progress at once), reads
the row ``FOR UPDATE`` and upserts it on its primary key; ``complete`` and
``fail`` are single statements guarded by the owner's token.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import secrets
import threading
from importlib import resources
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Optional, Tuple, Union

import psycopg

from .idempotency import (_AsyncSettle, _once_answer, _Options, _safe_headers, _stored_pairs, _SyncSettle, Claim,
                          LeaseLostError, StoredResponse, check_key)

__all__ = ["AsyncPostgresIdempotencyStore", "DEFAULT_TABLE", "PostgresIdempotencyStore", "schema"]

DEFAULT_TABLE = "backstop_idempotency"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def schema(table: str = DEFAULT_TABLE) -> str:
    """The DDL of the table and of its claim function (the contract's
    ``scripts/idempotency.sql``, as Go's ``pgstore.Schema`` writes it):
    ``CREATE TABLE IF NOT EXISTS``, its expiry index, ``CREATE OR REPLACE
    FUNCTION``. Run it again after an upgrade: the table and its rows stay
    as they are."""
    names = {"{table}": _ident(table), "{index}": _ident(table + "_expires_at"), "{function}": _begin_function(table),
             "{name}": "'" + table.replace("'", "''") + "'"}
    return re.sub(r"\{(?:table|index|function|name)\}", lambda m: names[m.group(0)], _sql())


@functools.lru_cache(maxsize=1)
def _sql() -> str:
    return (resources.files("backstop") / "scripts" / "idempotency.sql").read_text("utf-8")


def _begin_function(table: str) -> str:
    return _ident(table + "_begin_v1")


def _word(name: str, v: Any) -> None:
    if not isinstance(v, str) or not 1 <= len(v) <= 128 or any(not 0x21 <= ord(c) <= 0x7E for c in v):
        raise ValueError("%s must be 1..128 printable ASCII characters without spaces" % name)


# The statements, on the table's quoted name ({t}) and its claim function's ({f}).
_BEGIN = """SELECT state, retry_after_s, taken_over, status, headers, body, too_large, truncated
FROM {f}(%s, %s, %s, %s, %s, %s)"""
_COMPLETE = """UPDATE {t} SET state = 'completed', status = %s, headers = %s::jsonb, body = %s, too_large = %s,
  truncated = %s, lease_until = NULL, expires_at = clock_timestamp() + %s::float8 * interval '1 millisecond'
WHERE scope = %s AND key = %s AND state = 'in_progress' AND token = %s AND expires_at > clock_timestamp()"""
_FAIL = """DELETE FROM {t}
WHERE scope = %s AND key = %s AND state = 'in_progress' AND token = %s AND expires_at > clock_timestamp()"""
_PURGE = """DELETE FROM {t} WHERE ctid IN (SELECT ctid FROM {t} WHERE expires_at <= clock_timestamp() LIMIT %s)"""


class _PgBase(_Options):
    _transient = (psycopg.Error,)

    def __init__(self, db: Any, *, table: str = DEFAULT_TABLE, **options: Any) -> None:
        if not isinstance(table, str) or table == "":
            raise ValueError("table must be a non-empty string, got %r" % (table,))
        super().__init__(**options)
        self.db, self.table = db, table
        # psycopg reads a lone % of a query with parameters as a placeholder
        t, f = _ident(table).replace("%", "%%"), _begin_function(table).replace("%", "%%")
        self._sql = {name: q.replace("{t}", t).replace("{f}", f) for name, q in
                     (("begin", _BEGIN), ("complete", _COMPLETE), ("fail", _FAIL), ("purge", _PURGE))}

    def _begin_args(self, scope: str, key: str, request: str, token: str) -> list:
        return [scope, key, request, token, self._lease, self._retention]

    def _claim_of(self, row: tuple, token: str) -> Claim:
        """The Claim of the table's function's answer."""
        state, retry_after_s, taken_over, status, headers, body, large, truncated = row
        if state == "started":
            return Claim("started", token=token, taken_over=taken_over)
        if state == "in_progress":
            return Claim("in_progress", retry_after=retry_after_s)
        if state == "conflict":
            return Claim("conflict")
        if state != "completed":
            raise psycopg.DataError("%s answered %r" % (_begin_function(self.table), state))
        h: Any = {}
        if not large and headers:
            try:
                h = json.loads(headers)
            except ValueError:
                h = None
        return Claim("completed", response=StoredResponse(
            status=status, headers=_safe_headers(_stored_pairs(h)) if not large else {},
            body=bytes(body) if body is not None and not large else b"", too_large=large, truncated=truncated))

    def _begin_checks(self, key: str, request: str) -> str:
        check_key(key)
        _word("request", request)
        return secrets.token_hex(16)

    def _complete_args(self, scope: str, key: str, token: str, response: StoredResponse) -> list:
        _word("token", token)
        if not isinstance(response.status, int) or not 100 <= response.status <= 999:
            raise ValueError("status must be a whole number in 100..999, got %r" % (response.status,))
        large = response.too_large or len(response.body) > self.max_body
        headers = None if large else json.dumps(
            _safe_headers(((k, v) for k, vs in (response.headers or {}).items() for v in vs), logged=True),
            separators=(",", ":"))
        return [response.status, headers, None if large else bytes(response.body), large, response.truncated,
                self._retention, scope, key, token]

    def _owner(self, op: str, key: str, rowcount: int) -> None:
        if rowcount == 0:
            self.metrics.lease_lost += 1
            raise LeaseLostError("idempotency: %s %r: lease lost: the record is gone, completed, or owned by another "
                                 "caller" % (op, key))

    @contextlib.contextmanager
    def _counted(self, op: str) -> Iterator[None]:
        """Counts a psycopg error of op in the store errors metric."""
        try:
            yield
        except psycopg.Error:
            self.metrics.store_errors[op] += 1
            raise

    def _first_run(self, claim: Claim) -> None:
        if claim.taken_over:
            self.metrics.lease_expiries += 1
        self.metrics.requests["first_run"] += 1


@contextlib.contextmanager
def _older_ddl() -> Iterator[None]:
    """Says what to do when the table's function is missing: the table was
    made by an older schema()."""
    try:
        yield
    except psycopg.errors.UndefinedFunction as e:
        raise psycopg.ProgrammingError("%s (the store's DDL is older than the store: run create_table() or schema() "
                                       "again)" % e) from e


def _bytes(out: Union[bytes, str, None]) -> bytes:
    if out is None:
        return b""
    return out.encode() if isinstance(out, str) else bytes(out)


def _in_transaction(conn: Any) -> bool:
    return conn.info.transaction_status in (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR)


class PostgresIdempotencyStore(_SyncSettle, _PgBase):
    """The store over a ``psycopg_pool.ConnectionPool`` (each call on a
    connection of its own) or a ``psycopg.Connection`` in autocommit mode
    (one call at a time). ``table`` (default ``backstop_idempotency``; create
    it with ``create_table`` or ``schema``), ``lease``, ``retention``,
    ``max_body`` and ``metrics`` as ``IdempotencyStore``'s."""

    def __init__(self, db: Any, **options: Any) -> None:
        super().__init__(db, **options)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _conn(self) -> Iterator[Any]:
        if not isinstance(self.db, psycopg.Connection):  # a pool
            with self.db.connection() as conn:
                yield conn
        else:
            with self._lock:
                yield self.db

    def create_table(self) -> None:
        """Runs ``schema(table)``."""
        with self._conn() as conn, conn.transaction():
            conn.execute(schema(self.table))

    def purge(self, limit: int = 1000) -> int:
        """Deletes up to limit rows past their retention; returns how many."""
        with self._conn() as conn, conn.transaction():
            return conn.execute(self._sql["purge"], [limit]).rowcount

    def _claim(self, conn: Any, scope: str, key: str, request: str, token: str) -> Claim:
        with _older_ddl():
            return self._claim_of(conn.execute(self._sql["begin"], self._begin_args(scope, key, request, token)).fetchone(),
                                  token)

    def begin(self, scope: str, key: str, request: str) -> Claim:
        """Claims key within scope for a request whose hash is request: one
        call of the table's function, in a transaction of its own that
        commits the in_progress row and its lease."""
        token = self._begin_checks(key, request)
        with self._counted("begin"), self._conn() as conn, conn.transaction():
            claim = self._claim(conn, scope, key, request, token)
        if claim.taken_over:
            self.metrics.lease_expiries += 1
        return claim

    def complete(self, scope: str, key: str, token: str, response: StoredResponse) -> None:
        """Stores response as the key's; only the owner may (else LeaseLostError)."""
        args = self._complete_args(scope, key, token, response)
        with self._counted("complete"), self._conn() as conn, conn.transaction():
            n = conn.execute(self._sql["complete"], args).rowcount
        self._owner("complete", key, n)

    def fail(self, scope: str, key: str, token: str) -> None:
        """Releases the key (deletes the row) so that a retry may run; only the owner may (else LeaseLostError)."""
        _word("token", token)
        with self._counted("fail"), self._conn() as conn, conn.transaction():
            n = conn.execute(self._sql["fail"], [scope, key, token]).rowcount
        self._owner("fail", key, n)

    def once_tx(self, conn: Any, scope: str, key: str, request: str, fn: Callable[[Any], Union[bytes, str]]) -> bytes:
        """Runs ``fn(conn)`` at most once for key within scope, with the
        record written in the caller's transaction on conn (a
        ``psycopg.Connection`` inside ``with conn.transaction():``): fn's
        writes and the record commit together, or neither does. fn runs in
        a savepoint, rolled back when it raises (the error propagates;
        conn's transaction stays usable). A later call with the same key and
        request returns the first result without running fn; a duplicate
        while the transaction runs raises InProgressError at once (the key's
        advisory lock is held until the transaction ends), another request
        under the key ConflictError, a first result over max_body
        TooLargeError."""
        token = self._begin_checks(key, request)
        if not _in_transaction(conn):
            raise ValueError("once_tx wants a connection inside a transaction (with conn.transaction(): ...)")
        try:
            with conn.transaction():  # a savepoint: the claim, fn's writes and the record, or none of them
                with self._counted("begin"):
                    claim = self._claim(conn, scope, key, request, token)
                if claim.state != "started":
                    raise _Answer(claim)
                self._first_run(claim)
                out = _bytes(fn(conn))
                args = self._complete_args(scope, key, token, StoredResponse(200, {}, out))
                with self._counted("complete"):
                    n = conn.execute(self._sql["complete"], args).rowcount
                self._owner("complete", key, n)
        except _Answer as a:
            return _once_answer(self.metrics, key, a.claim)
        return out


class AsyncPostgresIdempotencyStore(_AsyncSettle, _PgBase):
    """``PostgresIdempotencyStore`` for asyncio, over a
    ``psycopg_pool.AsyncConnectionPool`` (or a ``psycopg.AsyncConnection`` in
    autocommit mode, one call at a time): the same methods, as coroutines.
    ``IdempotencyMiddleware`` and ``idempotent`` (coroutine functions) take it."""

    def __init__(self, db: Any, **options: Any) -> None:
        super().__init__(db, **options)
        self._pending = set()
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[Any]:
        if not isinstance(self.db, psycopg.AsyncConnection):  # a pool
            async with self.db.connection() as conn:
                yield conn
        else:
            async with self._lock:
                yield self.db

    async def create_table(self) -> None:
        """Runs ``schema(table)``."""
        async with self._conn() as conn, conn.transaction():
            await conn.execute(schema(self.table))

    async def purge(self, limit: int = 1000) -> int:
        """Deletes up to limit rows past their retention; returns how many."""
        async with self._conn() as conn, conn.transaction():
            return (await conn.execute(self._sql["purge"], [limit])).rowcount

    async def _claim(self, conn: Any, scope: str, key: str, request: str, token: str) -> Claim:
        with _older_ddl():
            cur = await conn.execute(self._sql["begin"], self._begin_args(scope, key, request, token))
            return self._claim_of(await cur.fetchone(), token)

    async def begin(self, scope: str, key: str, request: str) -> Claim:
        token = self._begin_checks(key, request)
        with self._counted("begin"):
            async with self._conn() as conn, conn.transaction():
                claim = await self._claim(conn, scope, key, request, token)
        if claim.taken_over:
            self.metrics.lease_expiries += 1
        return claim

    async def complete(self, scope: str, key: str, token: str, response: StoredResponse) -> None:
        args = self._complete_args(scope, key, token, response)
        with self._counted("complete"):
            async with self._conn() as conn, conn.transaction():
                n = (await conn.execute(self._sql["complete"], args)).rowcount
        self._owner("complete", key, n)

    async def fail(self, scope: str, key: str, token: str) -> None:
        _word("token", token)
        with self._counted("fail"):
            async with self._conn() as conn, conn.transaction():
                n = (await conn.execute(self._sql["fail"], [scope, key, token])).rowcount
        self._owner("fail", key, n)

    async def once_tx(self, conn: Any, scope: str, key: str, request: str,
                      fn: Callable[[Any], Awaitable[Union[bytes, str]]]) -> bytes:
        """``PostgresIdempotencyStore.once_tx`` on a ``psycopg.AsyncConnection``
        inside ``async with conn.transaction():``; fn is a coroutine function."""
        token = self._begin_checks(key, request)
        if not _in_transaction(conn):
            raise ValueError("once_tx wants a connection inside a transaction (async with conn.transaction(): ...)")
        try:
            async with conn.transaction():
                with self._counted("begin"):
                    claim = await self._claim(conn, scope, key, request, token)
                if claim.state != "started":
                    raise _Answer(claim)
                self._first_run(claim)
                out = _bytes(await fn(conn))
                args = self._complete_args(scope, key, token, StoredResponse(200, {}, out))
                with self._counted("complete"):
                    n = (await conn.execute(self._sql["complete"], args)).rowcount
                self._owner("complete", key, n)
        except _Answer as a:
            return _once_answer(self.metrics, key, a.claim)
        return out


class _Answer(Exception):
    """once_tx's claim that the caller did not take: raised to roll its savepoint back."""

    def __init__(self, claim: Claim) -> None:
        super().__init__(claim.state)
        self.claim = claim
