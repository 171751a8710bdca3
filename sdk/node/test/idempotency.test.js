// backstop-policy/idempotency's middleware on node:http against a real
// redis-server: one run per key, replays marked, 422 on another body, 409
// and Retry-After while the first runs, too large never replayed, fail
// closed (or open) when Redis is gone.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer } from 'node:http';
import { after, test } from 'node:test';
import { Redis as IORedis } from 'ioredis';
import { ConflictError, InProgressError, Metrics, createIdempotencyStore, idempotent, once as runOnce } from '../lib/idempotency.js';
import { startRedis } from '../test-support/redis-server.js';

const server = await startRedis();
const client = new IORedis({ host: server.host, port: server.port });
after(async () => {
  await client.quit();
  await server.stop();
});

async function serve(handler, options = {}, storeOptions = {}, c = client) {
  const metrics = new Metrics();
  const store = createIdempotencyStore(c, { metrics, prefix: `t${Math.random().toString(36).slice(2)}`, ...storeOptions });
  let runs = 0;
  const srv = createServer(idempotent(store, async (req, res) => {
    runs++;
    await handler(req, res);
  }, options));
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  const url = `http://127.0.0.1:${srv.address().port}/charges`;
  const post = async (key, body) => {
    const r = await fetch(url, { method: 'POST', body, headers: key === undefined ? {} : { 'Idempotency-Key': key } });
    return { status: r.status, headers: r.headers, body: await r.text() };
  };
  return { post, runs: () => runs, metrics, close: () => srv.close() };
}

const charge = async (req, res) => {
  res.setHeader('Content-Type', 'application/json');
  res.setHeader('X-Not-Stored', '1');
  res.statusCode = 201;
  res.end(JSON.stringify({ charged: String(req.body ?? '') }));
};

test('replays the first response, 422 on another body, no key passes through', async () => {
  const s = await serve(charge);
  try {
    const a = await s.post('k1', '10');
    const b = await s.post('k1', '10');
    assert.equal(a.status, 201);
    assert.equal(b.status, 201);
    assert.equal(b.body, a.body);
    assert.equal(s.runs(), 1);
    assert.equal(a.headers.get('idempotent-replayed'), null);
    assert.equal(b.headers.get('idempotent-replayed'), 'true');
    assert.equal(b.headers.get('content-type'), 'application/json');
    assert.equal(b.headers.get('x-not-stored'), null);
    assert.equal((await s.post('k1', '99')).status, 422);
    assert.equal((await s.post(undefined, '10')).status, 201);
    assert.equal(s.runs(), 2);
    assert.equal((await s.post('k'.repeat(256), '10')).status, 400);
    assert.deepEqual(s.metrics.requests, { first_run: 1, replayed: 1, in_progress: 0, conflict: 1, too_large: 0 });
    assert.match(s.metrics.text(), /^backstop_idempotency_requests_total\{outcome="replayed"\} 1$/m);
  } finally {
    s.close();
  }
});

test('a duplicate while the first runs gets 409 and Retry-After', async () => {
  let release;
  const gate = new Promise((r) => { release = r; });
  let started;
  const begun = new Promise((r) => { started = r; });
  const s = await serve(async (req, res) => {
    started();
    await gate;
    await charge(req, res);
  });
  try {
    const first = s.post('k', '1');
    await begun;
    const dup = await s.post('k', '1');
    assert.equal(dup.status, 409);
    assert.equal(dup.headers.get('retry-after'), '30');
    release();
    const a = await first;
    const again = await s.post('k', '1');
    assert.equal(again.body, a.body);
    assert.equal(s.runs(), 1);
  } finally {
    s.close();
  }
});

test('a retryable status releases the key; a response over maxBody is never replayed truncated', async () => {
  let n = 0;
  const s = await serve(async (req, res) => {
    if (n++ === 0) {
      res.statusCode = 503;
      return res.end('busy');
    }
    res.end('x'.repeat(2000));
  }, {}, { maxBody: 1000 });
  try {
    assert.equal((await s.post('k', '1')).status, 503);
    const big = await s.post('k', '1');
    assert.equal(big.status, 200);
    assert.equal(big.body.length, 2000);
    const retry = await s.post('k', '1');
    assert.equal(retry.status, 500);
    assert.match(retry.body, /too large/);
    assert.equal(s.runs(), 2);
  } finally {
    s.close();
  }
});

test('Redis unreachable: 503 by default, the handler runs with failOpen', async () => {
  const down = await startRedis();
  const c = new IORedis({ host: down.host, port: down.port, maxRetriesPerRequest: 0, retryStrategy: () => null });
  c.on('error', () => {});
  await c.ping();
  const closedConn = once(c, 'end');
  await down.stop();
  await closedConn;
  const closed = await serve(charge, {}, {}, c);
  const open = await serve(charge, { failOpen: true }, {}, c);
  try {
    const r = await closed.post('k', '1');
    assert.equal(r.status, 503);
    assert.equal(r.headers.get('retry-after'), '1');
    assert.equal(closed.metrics.storeErrors.begin, 1);
    assert.equal((await open.post('k', '1')).status, 201);
  } finally {
    closed.close();
    open.close();
    c.disconnect();
  }
});

test('once: a redelivered job returns its recorded result; a failure releases the key', async () => {
  const store = createIdempotencyStore(client, { metrics: new Metrics(), prefix: `t${Math.random().toString(36).slice(2)}` });
  let effects = 0;
  const charge = async () => {
    effects++;
    return 'charged';
  };
  assert.equal((await runOnce(store, 'jobs', 'j1', 'j1/10', charge)).toString(), 'charged');
  assert.equal((await runOnce(store, 'jobs', 'j1', 'j1/10', charge)).toString(), 'charged');
  assert.equal(effects, 1);
  await assert.rejects(runOnce(store, 'jobs', 'j1', 'j1/11', charge), ConflictError);
  await assert.rejects(runOnce(store, 'jobs', 'j2', 'j2', async () => { throw new Error('upstream timeout'); }), /upstream timeout/);
  assert.equal((await runOnce(store, 'jobs', 'j2', 'j2', charge)).toString(), 'charged');
  assert.equal(effects, 2);
  let inner;
  await runOnce(store, 'jobs', 'j3', 'j3', async () => {
    inner = await runOnce(store, 'jobs', 'j3', 'j3', charge).catch((err) => err);
    return '';
  });
  assert.ok(inner instanceof InProgressError);
  assert.equal(inner.retryAfterS, 30);
});

test('once: when Redis goes away during fn, fn\'s error is the one thrown', async () => {
  const down = await startRedis();
  const c = new IORedis({ host: down.host, port: down.port, maxRetriesPerRequest: 0, retryStrategy: () => null });
  c.on('error', () => {});
  const metrics = new Metrics();
  // A short lease: the release is retried in the background while it lasts.
  const store = createIdempotencyStore(c, { metrics, leaseMs: 500, log: () => {} });
  await assert.rejects(runOnce(store, 'jobs', 'j1', 'j1', async () => {
    const closed = once(c, 'end');
    await down.stop();
    await closed;
    throw new Error('upstream timeout');
  }), /upstream timeout/);
  assert.equal(metrics.storeErrors.fail, 1);
  c.disconnect();
});
