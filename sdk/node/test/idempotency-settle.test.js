// backstop-policy/idempotency completes its record whatever happens to the
// request, against a real redis-server: a stream.pipeline handler whose
// client leaves mid-response leaves a record completed `truncated` (never a
// second run); a store error at complete (ioredis with enableOfflineQueue
// false, its connection broken while the handler runs) is retried while the
// lease lasts; once() stores its result the same way.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer, request as httpRequest } from 'node:http';
import { Readable, pipeline } from 'node:stream';
import { after, test } from 'node:test';
import { Redis as IORedis } from 'ioredis';
import { Metrics, createIdempotencyStore, idempotencyMiddleware, idempotent, once as runOnce, safeHeader } from '../lib/idempotency.js';
import { setHeaders } from '../lib/idempotency-common.js';
import { until } from '../test-support/eventually.js';
import { startRedis } from '../test-support/redis-server.js';

const server = await startRedis();
const raw = new IORedis({ host: server.host, port: server.port });
after(async () => {
  await raw.quit();
  await server.stop();
});

const prefix = () => `t${Math.random().toString(36).slice(2)}`;

async function listen(handler) {
  const srv = createServer(handler);
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  return { srv, port: srv.address().port };
}

async function post(port, key) {
  const r = await fetch(`http://127.0.0.1:${port}/charges`, { method: 'POST', body: '10', headers: { 'Idempotency-Key': key } });
  return { status: r.status, replayed: r.headers.get('idempotent-replayed'), type: r.headers.get('content-type'), body: await r.text() };
}

test('a stream.pipeline response whose client leaves: the record is completed truncated, never run twice', async () => {
  const store = createIdempotencyStore(raw, { metrics: new Metrics(), prefix: prefix(), log: () => {} });
  let runs = 0;
  let streaming;
  const streamed = new Promise((resolve) => { streaming = resolve; });
  const { srv, port } = await listen(idempotent(store, (req, res) => {
    runs++;
    res.setHeader('content-type', 'text/csv');
    let sent = 0;
    // A report streamed row by row, slower than the client's patience.
    const rows = new Readable({
      read() {
        if (sent++ === 0) this.push('id,amount\n');
        else streaming(); // the next row never comes before the client leaves
      },
    });
    pipeline(rows, res, () => {});
  }));
  try {
    const req = httpRequest({ port, host: '127.0.0.1', method: 'POST', path: '/charges', headers: { 'Idempotency-Key': 'k' } });
    req.on('error', () => {});
    req.end('10');
    await streamed;
    req.destroy(); // the client leaves mid-response
    const rk = store.recordKey('', 'k');
    await until('the record to be completed', async () => (await raw.hget(rk, 'state')) === 'completed', 10_000);
    assert.equal(await raw.hget(rk, 'truncated'), '1');
    const r = await post(port, 'k');
    assert.deepEqual(r, { status: 200, replayed: 'true', type: 'text/csv', body: 'id,amount\n' });
    assert.equal(runs, 1);
  } finally {
    srv.close();
  }
});

test('a slow handler whose client left still stores its whole response, not truncated', async () => {
  const store = createIdempotencyStore(raw, { metrics: new Metrics(), prefix: prefix(), log: () => {} });
  let runs = 0;
  let left;
  const gone = new Promise((resolve) => { left = resolve; });
  let entered;
  const running = new Promise((resolve) => { entered = resolve; });
  const { srv, port } = await listen(idempotent(store, async (req, res) => {
    runs++;
    res.on('close', left);
    entered();
    await gone; // the charge takes longer than the client waits
    res.statusCode = 201;
    res.end('charged');
  }));
  try {
    const req = httpRequest({ port, host: '127.0.0.1', method: 'POST', path: '/charges', headers: { 'Idempotency-Key': 'k' } });
    req.on('error', () => {});
    req.end('10');
    await running;
    req.destroy();
    const rk = store.recordKey('', 'k');
    await until('the record to be completed', async () => (await raw.hget(rk, 'state')) === 'completed', 10_000);
    assert.equal(await raw.hget(rk, 'truncated'), null);
    const r = await post(port, 'k');
    assert.deepEqual([r.status, r.replayed, r.body, runs], [201, 'true', 'charged', 1]);
  } finally {
    srv.close();
  }
});

// ioredis with enableOfflineQueue false fails every command at once while
// it reconnects: the connection breaks while the handler runs.
async function offlineClient() {
  const c = new IORedis({ host: server.host, port: server.port, enableOfflineQueue: false });
  c.on('error', () => {});
  await once(c, 'ready');
  return c;
}

async function breakConnection(c) {
  const reconnecting = once(c, 'reconnecting');
  await raw.client('KILL', 'ID', String(await c.client('ID')));
  await reconnecting;
}

test('a store error at complete (enableOfflineQueue false): the record completes once the store answers again', async () => {
  const c = await offlineClient();
  const metrics = new Metrics();
  const logs = [];
  const store = createIdempotencyStore(c, { metrics, prefix: prefix(), log: (message, fields) => logs.push({ message, ...fields }) });
  let runs = 0;
  const { srv, port } = await listen(idempotent(store, async (req, res) => {
    runs++;
    await breakConnection(c);
    res.statusCode = 201;
    res.end('charged');
  }));
  try {
    assert.equal((await post(port, 'k')).status, 201);
    assert.ok(metrics.storeErrors.complete >= 1, 'the first complete did not fail');
    const rk = store.recordKey('', 'k');
    await until('the record to be completed', async () => (await raw.hget(rk, 'state')) === 'completed', 10_000);
    const r = await post(port, 'k');
    assert.deepEqual([r.status, r.replayed, r.body, runs], [201, 'true', 'charged', 1]);
    assert.ok(logs.some((l) => /retrying while the lease lasts/.test(l.message) && l.op === 'complete' && l.key === 'k'), JSON.stringify(logs));
    assert.ok(logs.some((l) => /succeeded after retries/.test(l.message)), JSON.stringify(logs));
  } finally {
    srv.close();
    c.disconnect();
  }
});

test('a store that hangs at complete: the client is answered, the record completes when the store answers', async () => {
  const store = createIdempotencyStore(raw, { metrics: new Metrics(), prefix: prefix(), log: () => {} });
  const watch = new IORedis({ host: server.host, port: server.port });
  let runs = 0;
  const { srv, port } = await listen(idempotent(store, async (req, res) => {
    runs++;
    await watch.client('PAUSE', '60000', 'WRITE'); // scripts wait; reads go on
    res.statusCode = 201;
    res.end('charged');
  }));
  const rk = store.recordKey('', 'k');
  try {
    const first = await post(port, 'k');
    assert.equal(first.status, 201);
    assert.equal(await watch.hget(rk, 'state'), 'in_progress', 'the client waited for the store');
    await watch.client('UNPAUSE');
    await until('the record to be completed', async () => (await watch.hget(rk, 'state')) === 'completed', 10_000);
    const r = await post(port, 'k');
    assert.deepEqual([r.status, r.replayed, r.body, runs], [201, 'true', 'charged', 1]);
  } finally {
    await watch.client('UNPAUSE');
    await watch.quit();
    srv.close();
  }
});

test('a store still failing when the lease ends: logged, and the key may run again', async () => {
  const c = await offlineClient();
  const logs = [];
  const store = createIdempotencyStore(c, { metrics: new Metrics(), prefix: prefix(), leaseMs: 200,
    log: (message, fields) => logs.push({ message, ...fields }) });
  let runs = 0;
  const { srv, port } = await listen(idempotent(store, async (req, res) => {
    if (++runs === 1) {
      c.disconnect(); // and it stays away past the lease
    }
    res.statusCode = 201;
    res.end('charged');
  }));
  try {
    assert.equal((await post(port, 'k')).status, 201);
    await until('the retries to give up', () => logs.some((l) => /the key may run again/.test(l.message)), 10_000);
    await c.connect();
    // 409 until the lease is over on the server's clock too, then a run.
    const r = await until('the lease to end', async () => {
      const got = await post(port, 'k');
      return got.status !== 409 && got;
    }, 10_000);
    assert.deepEqual([r.status, r.replayed, runs], [201, null, 2]);
  } finally {
    srv.close();
    c.disconnect();
  }
});

test('once: a store error at complete is retried; the redelivered job returns the result', async () => {
  const c = await offlineClient();
  const store = createIdempotencyStore(c, { metrics: new Metrics(), prefix: prefix(), log: () => {} });
  let effects = 0;
  const charge = async () => {
    effects++;
    return 'charged';
  };
  const out = await runOnce(store, 'jobs', 'j1', 'j1', async () => {
    await breakConnection(c);
    return charge();
  });
  assert.equal(out.toString(), 'charged');
  assert.equal(store.metrics.storeErrors.complete >= 1, true);
  assert.equal((await runOnce(store, 'jobs', 'j1', 'j1', charge)).toString(), 'charged');
  assert.equal(effects, 1);
  c.disconnect();
});

test('safeHeader and setHeaders: the header rule, and a header the server refuses is skipped', () => {
  assert.equal(safeHeader('Location', '/orders/€42'), '/orders/%E2%82%AC42');
  assert.equal(safeHeader('Location', ' a  b\t'), 'a%20%20b');
  assert.equal(safeHeader('Location', '100%25'), '100%25');
  assert.equal(safeHeader('X Odd:Name', 'v'), undefined);
  const set = {};
  const skipped = [];
  setHeaders({ Location: ['/orders/€42'], 'X Odd:Name': 'v', 'Content-Type': ['a', 'b'], Ok: 'fine' }, (n, v) => { set[n] = v; },
    (n) => skipped.push(n));
  assert.deepEqual(set, { 'Content-Type': ['a', 'b'], Ok: 'fine' });
  assert.deepEqual(skipped, ['Location', 'X Odd:Name']);
});

test('a client that leaves mid-body gets an answer, never a rejection (Express would exit on it)', async () => {
  const store = createIdempotencyStore(raw, { metrics: new Metrics(), prefix: prefix(), log: () => {} });
  const mw = idempotencyMiddleware(store);
  let settled;
  const outcome = new Promise((resolve) => { settled = resolve; });
  const { srv, port } = await listen((req, res) => {
    mw(req, res, () => {}).then(() => settled('resolved'), (err) => settled(err));
  });
  try {
    const req = httpRequest({ port, host: '127.0.0.1', method: 'POST', path: '/charges',
      headers: { 'Idempotency-Key': 'k', 'content-length': '100' } });
    req.on('error', () => {});
    const arrived = once(srv, 'request');
    req.write('only ten b');
    await arrived;
    req.destroy();
    assert.equal(await outcome, 'resolved');
  } finally {
    srv.close();
  }
});
