// The idempotency store on PostgreSQL (docs/idempotency.md, "PostgreSQL"):
// the same begin/complete/fail as the Redis store (it answers
// testdata/idempotency the same way) over the caller's node-postgres (pg)
// Pool, and onceTx, which writes the record in the caller's transaction.
// pg is an optional peer dependency: this module never imports it, it calls
// the pool it is given. The table and its claim are the contract's
// (scripts/idempotency.sql, which every language's store runs).
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import {
  LeaseLostError, StoreError, checkKey, defaultMetrics, onceAnswer, safeHeaders,
} from './idempotency-common.js';

export const DEFAULT_TABLE = 'backstop_idempotency';

const ident = (name) => `"${name.replaceAll('"', '""')}"`;

const SQL = readFileSync(new URL('../scripts/idempotency.sql', import.meta.url), 'utf8');

/**
 * The DDL of the table and of its claim function (the contract's
 * scripts/idempotency.sql, as Go's pgstore.Schema writes it): CREATE TABLE
 * IF NOT EXISTS, its expiry index, CREATE OR REPLACE FUNCTION. Run it again
 * after an upgrade: the table and its rows stay as they are.
 */
export function pgSchema(table = DEFAULT_TABLE) {
  const names = {
    '{table}': ident(table), '{index}': ident(`${table}_expires_at`), '{function}': beginFunction(table),
    '{name}': `'${table.replaceAll("'", "''")}'`,
  };
  return SQL.replace(/\{(?:table|index|function|name)\}/g, (p) => names[p]);
}

const beginFunction = (table) => ident(`${table}_begin_v1`);

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
 * Returns a store over pool (a pg Pool: its statements, each its own
 * transaction, run on pool.query). Options: table
 * ('backstop_idempotency'), leaseMs (30000), retentionMs (86400000), maxBody
 * (1 MiB), metrics (defaultMetrics), log. The table must exist
 * with its function (pgSchema, store.createTable()). The store has the Redis store's shape:
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
  #begin; // the table's claim function, quoted

  constructor(pool, o) {
    this.#pool = pool;
    this.#o = o;
    this.#t = ident(o.table);
    this.#begin = beginFunction(o.table);
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

  /** The claim: one call of the table's function (idempotency.sql) on client, or on the pool. */
  async claim(client, scope, key, request, token) {
    let r;
    try {
      r = await client.query(`SELECT state, retry_after_s::float8 AS retry_after_s, taken_over, status, headers, body,
  too_large, truncated FROM ${this.#begin}($1, $2, $3, $4, $5::bigint, $6::bigint)`,
      [scope, key, request, token, this.#o.leaseMs, this.#o.retentionMs]);
    } catch (err) {
      if (err?.code === '42883') err.message += " (the store's DDL is older than the store: run createTable() or pgSchema() again)";
      throw err;
    }
    const row = r.rows[0];
    switch (row.state) {
      case 'started':
        return { state: 'started', token, takenOver: row.taken_over };
      case 'in_progress':
        return { state: 'in_progress', retryAfterS: row.retry_after_s };
      case 'conflict':
        return { state: 'conflict' };
      case 'completed': {
        const large = row.too_large;
        return {
          state: 'completed',
          response: {
            status: row.status, headers: large || !row.headers ? {} : safeHeaders(JSON.parse(row.headers)),
            body: large || !row.body ? Buffer.alloc(0) : row.body, tooLarge: large, truncated: row.truncated,
          },
        };
      }
      default:
        throw new Error(`${this.#begin} answered ${JSON.stringify(row.state)}`);
    }
  }

  /**
   * Claims key within scope for a request whose hash is request, in one
   * statement (its own transaction) that commits the in_progress row with
   * its lease.
   * Resolves as the Redis store's begin does.
   */
  async begin(scope, key, request) {
    checkKey(key);
    word('request', request);
    let c;
    try {
      c = await this.claim(this.#pool, scope, key, request, randomBytes(16).toString('hex')); // one statement: its own transaction
    } catch (err) {
      throw this.#storeError('begin', key, err);
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
