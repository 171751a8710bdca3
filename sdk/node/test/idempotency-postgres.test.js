// The idempotency store on PostgreSQL (lib/idempotency-pg.js) against a real
// postgres the test starts (test-support/postgres-server.js): every shared
// case of testdata/idempotency answered as the Redis store answers it, once
// and onceTx (the record in the caller's transaction), the middleware, and
// the password never shown.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { after, before, test } from 'node:test';
import pg from 'pg';
import {
  ConflictError, InProgressError, Metrics, createPgIdempotencyStore, idempotent, once, onceTx, pgSchema,
} from '../lib/idempotency.js';
import { FILE, replayCase } from '../test-support/idempotency-cases.js';
import { PASSWORD, startPostgres } from '../test-support/postgres-server.js';


let server;
let pool;
before(async () => {
  server = await startPostgres();
  pool = new pg.Pool({ connectionString: server.url });
  pool.on('error', () => {}); // an idle client of a server that went away
  await createPgIdempotencyStore(pool).createTable();
});
after(async () => {
  await pool.end();
  await server.stop();
});

const T = 'backstop_idempotency';
const at = (sql, ...args) => pool.query(sql, [FILE.scope, FILE.key, ...args]);

// The record as the cases compare it: the row's columns shown as the Redis
// hash holds them (status and too_large as text, body base64, headers ""
// when too large, truncated only when set); a row past its retention is
// absent.
async function record(tokens) {
  const { rows } = await at(`SELECT state, token, request, status, headers::text AS headers, body, too_large, truncated,
  extract(epoch FROM lease_until - clock_timestamp())::float8 AS lease_s, extract(epoch FROM expires_at - clock_timestamp())::float8 AS ttl_s
FROM ${T} WHERE scope = $1 AND key = $2 AND expires_at > clock_timestamp()`);
  const r = rows[0];
  if (!r) return null;
  const h = { state: r.state, request: r.request, ttl_s: Math.round(r.ttl_s) };
  if (r.token !== null) {
    h.token = r.token;
    for (const [caller, tok] of Object.entries(tokens)) if (r.token === tok) h.token = `{${caller}}`;
  }
  if (r.lease_s !== null) {
    const s = Math.round(r.lease_s);
    h.lease_until = `{now${s < 0 ? '-' : '+'}${Math.abs(s)}s}`;
  }
  if (r.state === 'completed') {
    Object.assign(h, {
      status: String(r.status), body: (r.body ?? Buffer.alloc(0)).toString('base64'), too_large: r.too_large ? '1' : '0',
      headers: r.headers === null ? '' : JSON.parse(r.headers),
    });
    if (r.truncated) h.truncated = '1';
  }
  return h;
}

// The steps that reach under the store, on the row.
const pgRaw = {
  reset: () => at(`DELETE FROM ${T} WHERE scope = $1 AND key = $2`),
  lapse: () => at(`UPDATE ${T} SET lease_until = clock_timestamp() - interval '1 second' WHERE scope = $1 AND key = $2`),
  // The row stays, past its retention: the store must treat it as absent.
  expire: () => at(`UPDATE ${T} SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE scope = $1 AND key = $2`),
  write: (f) => at(`INSERT INTO ${T} (scope, key, state, token, request, status, headers, body, too_large, truncated, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, clock_timestamp() + $11::float8 * interval '1 millisecond')`,
  f.state, f.token ?? null, f.request, f.status === undefined ? null : Number(f.status), f.headers ? f.headers : null,
  Buffer.from(f.body ?? '', 'base64'), f.too_large === '1', f.truncated === '1', FILE.retention_ms),
  record,
};

test('idempotency cases on PostgreSQL (node-postgres)', async () => {
  const store = createPgIdempotencyStore(pool, { leaseMs: FILE.lease_ms, retentionMs: FILE.retention_ms, maxBody: FILE.max_body,
    metrics: new Metrics(), log: () => {} });
  assert.ok(FILE.cases.length >= 30);
  for (const c of FILE.cases) {
    const got = await replayCase(store, pgRaw, c);
    assert.deepEqual(got, { replies: c.replies, final: c.final }, c.name);
  }
});

async function inTx(fn) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const out = await fn(client);
    await client.query('COMMIT');
    return out;
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  } finally {
    client.release();
  }
}

test('onceTx: the charge and its record commit together, or neither', async () => {
  await pool.query('CREATE TABLE charges (id serial PRIMARY KEY, order_id text NOT NULL)');
  const count = async () => Number((await pool.query('SELECT count(*) AS n FROM charges')).rows[0].n);
  const store = createPgIdempotencyStore(pool, { metrics: new Metrics() });
  let runs = 0;
  const charge = async (client) => {
    runs++;
    await client.query("INSERT INTO charges (order_id) VALUES ('o1')");
    return 'charged';
  };
  for (let i = 0; i < 2; i++) {
    const out = await inTx((c) => onceTx(store, c, 'jobs', 'j1', 'j1', charge));
    assert.equal(out.toString(), 'charged');
  }
  assert.deepEqual([runs, await count()], [1, 1], 'one run, one charge, its result twice');
  // Rolled back after onceTx succeeded: neither the charge nor the record.
  await assert.rejects(inTx(async (c) => {
    await onceTx(store, c, 'jobs', 'j2', 'j2', charge);
    throw new Error('the caller rolls back');
  }), /the caller rolls back/);
  assert.deepEqual([runs, await count()], [2, 1]);
  // fn throws: its savepoint is rolled back, so a caller that commits
  // anyway keeps neither its writes nor a record.
  await inTx(async (c) => {
    await assert.rejects(onceTx(store, c, 'jobs', 'j2', 'j2', async (cl) => {
      await charge(cl);
      throw new Error('card declined');
    }), /card declined/);
  });
  assert.equal(await count(), 1);
  await inTx((c) => onceTx(store, c, 'jobs', 'j2', 'j2', charge));
  assert.deepEqual([runs, await count()], [4, 2], 'the job runs after a rollback and a failure');
  await assert.rejects(inTx((c) => onceTx(store, c, 'jobs', 'j1', 'other', charge)), ConflictError);
  // A duplicate while the transaction runs: in progress at once, through
  // onceTx and through begin (the middleware's).
  let inner;
  let claim;
  await inTx((c) => onceTx(store, c, 'jobs', 'j3', 'j3', async () => {
    inner = await inTx((c2) => onceTx(store, c2, 'jobs', 'j3', 'j3', charge)).catch((e) => e);
    claim = await store.begin('jobs', 'j3', 'j3');
    return 'first';
  }));
  assert.ok(inner instanceof InProgressError && inner.retryAfterS === 1, String(inner));
  assert.equal(claim.state, 'in_progress');
  const after = await store.begin('jobs', 'j3', 'j3');
  assert.equal(after.response.body.toString(), 'first');
});

test('once and the middleware on PostgreSQL', async () => {
  const store = createPgIdempotencyStore(pool, { metrics: new Metrics() });
  let effects = 0;
  const fn = async () => { effects++; return 'done'; };
  assert.equal((await once(store, 'jobs', 'w1', 'w1', fn)).toString(), 'done');
  assert.equal((await once(store, 'jobs', 'w1', 'w1', fn)).toString(), 'done');
  assert.equal(effects, 1);
  let runs = 0;
  let release;
  const gate = new Promise((r) => { release = r; });
  let started;
  const began = new Promise((r) => { started = r; });
  const srv = http.createServer(idempotent(store, async (req, res) => {
    runs++;
    if (req.body.toString() === 'slow') {
      started();
      await gate;
    }
    res.writeHead(201, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ charged: req.body.toString() }));
  }));
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${srv.address().port}/charges`;
  const post = (key, body) => fetch(url, { method: 'POST', headers: { 'idempotency-key': key }, body });
  try {
    const a = await post('k1', '500');
    const b = await post('k1', '500');
    assert.deepEqual([a.status, b.status, b.headers.get('idempotent-replayed'), await a.text() === await b.text(), runs], [201, 201, 'true', true, 1]);
    assert.equal((await post('k1', '700')).status, 422);
    const first = post('k2', 'slow');
    await began;
    const dup = await post('k2', 'slow');
    assert.deepEqual([dup.status, dup.headers.get('retry-after')], [409, '30']);
    release();
    assert.equal((await first).status, 201);
    assert.equal((await post('k2', 'slow')).headers.get('idempotent-replayed'), 'true');
  } finally {
    srv.closeAllConnections();
    await new Promise((r) => srv.close(r));
  }
});

test('the password never shows in errors or logs', async () => {
  const lines = [];
  const log = (message, fields) => lines.push(`${message} ${JSON.stringify(fields)}`);
  const wrong = new pg.Pool({ connectionString: server.url.replace(encodeURIComponent(PASSWORD), 'wrong') });
  wrong.on('error', () => {});
  const errors = [];
  try {
    await createPgIdempotencyStore(wrong, { log, metrics: new Metrics() }).begin('s', 'k', 'r').catch((e) => errors.push(e));
  } finally {
    await wrong.end();
  }
  // A server that is not there (the port of one that stopped).
  const gone = new pg.Pool({ connectionString: server.url.replace(/:(\d+)\//, ':1/') });
  gone.on('error', () => {});
  const store = createPgIdempotencyStore(gone, { log, metrics: new Metrics(), leaseMs: 50, retentionMs: 1000 });
  try {
    await store.begin('s', 'k', 'r').catch((e) => errors.push(e));
    await store.complete('s', 'k', 'tok', { status: 200, body: 'x' }).catch((e) => errors.push(e));
    await once(store, 's', 'k', 'r', async () => 'x').catch((e) => errors.push(e));
  } finally {
    await gone.end();
  }
  assert.equal(errors.length, 4);
  for (const e of errors) {
    const shown = `${e.message} ${e.stack} ${String(e.cause?.message)} ${JSON.stringify(e)}`;
    assert.ok(!shown.includes(PASSWORD) && !shown.includes(encodeURIComponent(PASSWORD)), shown);
  }
  assert.ok(!lines.join('\n').includes(PASSWORD));
});

test("pgSchema is the DDL docs/idempotency.md shows (and Go's and Python's)", () => {
  const doc = readFileSync(new URL('../../../docs/idempotency.md', import.meta.url), 'utf8');
  const block = /```sql\n([\s\S]*?)```/.exec(doc);
  assert.ok(block, 'docs/idempotency.md has no ```sql block');
  assert.equal(pgSchema(), block[1]);
});

test("a table of its own (a quote and capitals in its name) has its own claim function; an older table's DDL is run again", async () => {
  const m = new Metrics();
  const other = createPgIdempotencyStore(pool, { table: "Idem'Keys", metrics: m, log: () => {} });
  await other.createTable();
  const c = await other.begin('', 'own-k1', 'r1');
  assert.equal(c.state, 'started');
  await other.complete('', 'own-k1', c.token, { status: 201, headers: {}, body: Buffer.from('paid') });
  const again = await other.begin('', 'own-k1', 'r1');
  assert.equal(again.state, 'completed');
  assert.equal(again.response.body.toString(), 'paid');
  assert.equal((await pool.query(`SELECT count(*)::int AS n FROM "Idem'Keys"`)).rows[0].n, 1);
  assert.equal((await createPgIdempotencyStore(pool, { metrics: m }).begin('', 'own-k1', 'r1')).state, 'started', 'the default table is not the other');
  // A table an older pgSchema made (no function): begin says to run the DDL again.
  const old = createPgIdempotencyStore(pool, { table: 'idem_old', metrics: m, log: () => {} });
  await pool.query(pgSchema('idem_old').split('CREATE OR REPLACE FUNCTION')[0]);
  await assert.rejects(old.begin('', 'own-k1', 'r1'), /run createTable\(\) or pgSchema\(\) again/);
  await old.createTable();
  assert.equal((await old.begin('', 'own-k1', 'r1')).state, 'started');
});
