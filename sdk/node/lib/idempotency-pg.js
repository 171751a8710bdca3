// The idempotency store on PostgreSQL (docs/idempotency.md, "PostgreSQL"):
// the same begin/complete/fail as the Redis store (it answers
// testdata/idempotency the same way) over the caller's node-postgres (pg)
// Pool, and onceTx, which writes the record in the caller's transaction.
// pg is an optional peer dependency: this module never imports it, it calls
// the pool it is given. The SQL is Go's idempotency/pgstore's.
import { randomBytes } from 'node:crypto';
import {
  LeaseLostError, StoreError, checkKey, defaultMetrics, onceAnswer, safeHeaders,
} from './idempotency-common.js';

export const DEFAULT_TABLE = 'backstop_idempotency';

const ident = (name) => `"${name.replaceAll('"', '""')}"`;

/** The table's DDL (CREATE TABLE IF NOT EXISTS and its expiry index), as Go's pgstore.Schema writes it. */
export function pgSchema(table = DEFAULT_TABLE) {
  const t = ident(table);
  return `CREATE TABLE IF NOT EXISTS ${t} (
  scope       text        NOT NULL,
  key         text        NOT NULL,
  state       text        NOT NULL CHECK (state IN ('in_progress', 'completed')),
  token       text,
  lease_until timestamptz,
  request     text        NOT NULL,
  status      integer,
  headers     jsonb,
  body        bytea,
  too_large   boolean     NOT NULL DEFAULT false,
  truncated   boolean     NOT NULL DEFAULT false,
  expires_at  timestamptz NOT NULL,
  PRIMARY KEY (scope, key)
);
CREATE INDEX IF NOT EXISTS ${ident(`${table}_expires_at`)} ON ${t} (expires_at);
`;
}

function positive(name, v) {
  if (!Number.isSafeInteger(v) || v < 1) throw new TypeError(`Expected \`${name}\` to be a positive whole number of milliseconds (got ${v})`);
}

function word(name, v) {
  if (typeof v !== 'string' || !/^[\x21-\x7e]{1,128}$/.test(v)) {
    throw new TypeError(`Expected \`${name}\` to be 1..128 printable ASCII characters without spaces`);
  }
}

function defaultLog(message, fields) {
  console.error(`backstop idempotency: ${message}`, fields);
}

const dropped = new Set();

/**
 * Returns a store over pool (a pg Pool: its statements run on pool.query,
 * its claims in a transaction on a client of pool.connect()). Options: table
 * ('backstop_idempotency'), leaseMs (30000), retentionMs (86400000), maxBody
 * (1 MiB), metrics (defaultMetrics), log. The table must exist
 * (pgSchema, store.createTable()). The store has the Redis store's shape:
 * idempotencyMiddleware, idempotent, fastifyIdempotency and once take it.
 */
export function createPgIdempotencyStore(pool, options = {}) {
  if (typeof pool?.query !== 'function' || typeof pool?.connect !== 'function') {
    throw new TypeError('Expected a pg Pool (with query and connect)');
  }
  const {
    table = DEFAULT_TABLE, leaseMs = 30_000, retentionMs = 86_400_000, maxBody = 1 << 20, metrics = defaultMetrics, log = defaultLog,
  } = options;
  if (typeof table !== 'string' || table === '') throw new TypeError('Expected `table` to be a non-empty string');
  positive('leaseMs', leaseMs);
  positive('retentionMs', retentionMs);
  if (retentionMs < leaseMs) throw new TypeError(`Expected \`retentionMs\` to be at least \`leaseMs\` (${leaseMs}), got ${retentionMs}`);
  if (!Number.isSafeInteger(maxBody) || maxBody < 0) throw new TypeError(`Expected \`maxBody\` to be a whole number >= 0 (got ${maxBody})`);
  if (typeof log !== 'function') throw new TypeError('Expected `log` to be a function');
  return new PgStore(pool, { table, leaseMs, retentionMs, maxBody, metrics, log });
}

class PgStore {
  #pool;
  #o;
  #t;

  constructor(pool, o) {
    this.#pool = pool;
    this.#o = o;
    this.#t = ident(o.table);
    this.metrics = o.metrics;
    this.leaseMs = o.leaseMs;
    this.table = o.table;
  }

  log(message, fields) {
    try {
      this.#o.log(message, fields);
    } catch {
      // A failing logger must not fail the request.
    }
  }

  /** Runs pgSchema for the store's table. */
  async createTable() {
    await this.#pool.query(pgSchema(this.#o.table));
  }

  /** Deletes up to limit rows past their retention; resolves to how many. */
  async purge(limit = 1000) {
    const r = await this.#pool.query(`DELETE FROM ${this.#t} WHERE ctid IN (SELECT ctid FROM ${this.#t}
  WHERE expires_at <= clock_timestamp() LIMIT $1)`, [limit]);
    return r.rowCount;
  }

  #storeError(op, key, err) {
    this.#o.metrics.storeErrors[op]++;
    return new StoreError(`idempotency: ${op} ${JSON.stringify(key)}: ${err?.message ?? err}`, { cause: err });
  }

  /** The claim (the script's begin in SQL) on client, inside its transaction. */
  async claim(client, scope, key, request, token) {
    const lock = await client.query('SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0)) AS got',
      [`${this.#o.table}\n${scope}\n${key}`]);
    if (!lock.rows[0].got) return { state: 'in_progress', retryAfterS: 1 };
    const r = await client.query(`SELECT state, request, status, headers::text AS headers, body, too_large, truncated,
  (extract(epoch FROM lease_until - clock_timestamp()) * 1000)::float8 AS lease_left_ms, expires_at <= clock_timestamp() AS expired
FROM ${this.#t} WHERE scope = $1 AND key = $2 FOR UPDATE`, [scope, key]);
    const row = r.rows[0];
    let takenOver = false;
    if (row && !row.expired) {
      if (row.request !== request) return { state: 'conflict' };
      if (row.state === 'completed') {
        const large = row.too_large;
        return {
          state: 'completed',
          response: {
            status: row.status, headers: large || !row.headers ? {} : safeHeaders(JSON.parse(row.headers)),
            body: large || !row.body ? Buffer.alloc(0) : row.body, tooLarge: large, truncated: row.truncated,
          },
        };
      }
      if (row.state !== 'in_progress') throw new Error(`${this.#t} holds state ${JSON.stringify(row.state)}, not in_progress or completed`);
      if (row.lease_left_ms !== null && row.lease_left_ms > 0) return { state: 'in_progress', retryAfterS: Math.ceil(row.lease_left_ms / 1000) };
      takenOver = true;
    }
    await client.query(`INSERT INTO ${this.#t} AS t (scope, key, state, token, lease_until, request, status, headers, body,
  too_large, truncated, expires_at)
VALUES ($1, $2, 'in_progress', $3, clock_timestamp() + $5::float8 * interval '1 millisecond', $4, NULL, NULL, NULL, false, false,
  clock_timestamp() + $6::float8 * interval '1 millisecond')
ON CONFLICT (scope, key) DO UPDATE SET state = excluded.state, token = excluded.token, lease_until = excluded.lease_until,
  request = excluded.request, status = NULL, headers = NULL, body = NULL, too_large = false, truncated = false,
  expires_at = excluded.expires_at`, [scope, key, token, request, this.#o.leaseMs, this.#o.retentionMs]);
    return { state: 'started', token, takenOver };
  }

  /**
   * Claims key within scope for a request whose hash is request, in a
   * transaction of its own that commits the in_progress row with its lease.
   * Resolves as the Redis store's begin does.
   */
  async begin(scope, key, request) {
    checkKey(key);
    word('request', request);
    let client;
    let c;
    try {
      client = await this.#pool.connect();
      await client.query('BEGIN');
      try {
        c = await this.claim(client, scope, key, request, randomBytes(16).toString('hex'));
        await client.query('COMMIT');
      } catch (err) {
        await client.query('ROLLBACK').catch(() => {});
        throw err;
      }
    } catch (err) {
      throw this.#storeError('begin', key, err);
    } finally {
      client?.release();
    }
    if (c.takenOver) this.#o.metrics.leaseExpiries++;
    return c;
  }

  completeQuery(scope, key, token, response) {
    if (!Number.isInteger(response.status) || response.status < 100 || response.status > 999) {
      throw new TypeError(`Expected the status to be a whole number in 100..999 (got ${response.status})`);
    }
    const body = Buffer.isBuffer(response.body) ? response.body : Buffer.from(response.body ?? '');
    const large = response.tooLarge === true || body.length > this.#o.maxBody;
    const headers = large ? null : JSON.stringify(safeHeaders(response.headers, (name) => {
      if (dropped.has(name) || dropped.size >= 1024) return;
      dropped.add(name);
      this.log('response header not stored: its name is not an HTTP token', { name });
    }));
    return [`UPDATE ${this.#t} SET state = 'completed', status = $4, headers = $5::jsonb, body = $6, too_large = $7,
  truncated = $8, lease_until = NULL, expires_at = clock_timestamp() + $9::float8 * interval '1 millisecond'
WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND token = $3 AND expires_at > clock_timestamp()`,
    [scope, key, token, response.status, headers, large ? null : body, large, response.truncated === true, this.#o.retentionMs]];
  }

  #owner(op, key, r) {
    if (r.rowCount === 0) {
      this.#o.metrics.leaseLost++;
      throw new LeaseLostError(`idempotency: ${op} ${JSON.stringify(key)}: lease lost: the record is gone, completed, or owned by another caller`);
    }
  }

  /** Stores response as the key's; only the owner (token) may. Rejects with LeaseLostError otherwise. */
  async complete(scope, key, token, response) {
    word('token', token);
    const [sql, args] = this.completeQuery(scope, key, token, response);
    let r;
    try {
      r = await this.#pool.query(sql, args);
    } catch (err) {
      throw this.#storeError('complete', key, err);
    }
    this.#owner('complete', key, r);
  }

  /** Releases the key (deletes the row) so that a retry may run; only the owner (token) may. */
  async fail(scope, key, token) {
    word('token', token);
    let r;
    try {
      r = await this.#pool.query(`DELETE FROM ${this.#t}
WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND token = $3 AND expires_at > clock_timestamp()`, [scope, key, token]);
    } catch (err) {
      throw this.#storeError('fail', key, err);
    }
    this.#owner('fail', key, r);
  }

  /** For onceTx: the owner check of a complete run in the caller's transaction. */
  ownerCheck(key, r) {
    this.#owner('complete', key, r);
  }

  storeError(op, key, err) {
    return this.#storeError(op, key, err);
  }
}

let savepoints = 0;

/**
 * Runs fn(client) at most once for key within scope, with the record
 * written in the caller's transaction on client (a pg client on which the
 * caller ran BEGIN): fn's writes and the record commit together when the
 * caller commits, or neither does. fn runs in a SAVEPOINT: when it throws,
 * the savepoint is rolled back (its writes and the claim) and the error
 * rethrown; client's transaction stays usable. A later call with the same
 * key and request resolves to the first result (a Buffer) without running
 * fn; a duplicate while the transaction runs rejects with InProgressError
 * at once (the key's advisory lock is held until the transaction ends),
 * another request under the key with ConflictError.
 */
export async function onceTx(store, client, scope, key, request, fn) {
  checkKey(key);
  word('request', request);
  const m = store.metrics;
  const sp = `backstop_once_${++savepoints}`;
  let claim;
  try {
    await client.query(`SAVEPOINT ${sp}`);
    claim = await store.claim(client, scope, key, request, randomBytes(16).toString('hex'));
  } catch (err) {
    await client.query(`ROLLBACK TO SAVEPOINT ${sp}`).catch(() => {});
    throw store.storeError('begin', key, err);
  }
  const undo = () => client.query(`ROLLBACK TO SAVEPOINT ${sp}`).then(() => client.query(`RELEASE SAVEPOINT ${sp}`));
  if (claim.state !== 'started') {
    await undo();
    return onceAnswer(claim, key, m);
  }
  if (claim.takenOver) m.leaseExpiries++;
  m.requests.first_run++;
  let body;
  try {
    const out = await fn(client);
    body = Buffer.isBuffer(out) ? out : Buffer.from(out ?? '');
    const [sql, args] = store.completeQuery(scope, key, claim.token, { status: 200, headers: {}, body });
    let r;
    try {
      r = await client.query(sql, args);
    } catch (err) {
      throw store.storeError('complete', key, err);
    }
    store.ownerCheck(key, r);
    await client.query(`RELEASE SAVEPOINT ${sp}`);
  } catch (err) {
    await undo().catch(() => {});
    throw err;
  }
  return body;
}
