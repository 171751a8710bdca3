// backstop-policy/idempotency's Fastify plugin against a real redis-server
// and a real Fastify server: the same answers as the node:http middleware,
// and the same request hash (raw body bytes, whatever parser Fastify runs).
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer } from 'node:http';
import { after, test } from 'node:test';
import Fastify from 'fastify';
import { Redis as IORedis } from 'ioredis';
import { Metrics, createIdempotencyStore, fastifyIdempotency, idempotent } from '../lib/idempotency.js';
import { until } from '../test-support/eventually.js';
import { startRedis } from '../test-support/redis-server.js';

const server = await startRedis();
const client = new IORedis({ host: server.host, port: server.port });
after(async () => {
  await client.quit();
  await server.stop();
});

const newStore = (c = client, storeOptions = {}) =>
  createIdempotencyStore(c, { metrics: new Metrics(), prefix: `t${Math.random().toString(36).slice(2)}`, ...storeOptions });

// A Fastify app with the plugin and POST /charges; handler(request, reply) answers.
async function serve(handler, { store = newStore(), ...options } = {}) {
  const app = Fastify();
  await app.register(fastifyIdempotency, { store, ...options });
  let runs = 0;
  app.post('/charges', async (request, reply) => {
    runs++;
    return handler(request, reply);
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  const url = `http://127.0.0.1:${app.server.address().port}/charges`;
  const post = async (key, body, type = 'application/json') => {
    const headers = { 'content-type': type, ...(key === undefined ? {} : { 'Idempotency-Key': key }) };
    const r = await fetch(url, { method: 'POST', body, headers });
    return { status: r.status, headers: r.headers, body: await r.text() };
  };
  return { post, url, runs: () => runs, metrics: store.metrics, close: () => app.close() };
}

const charge = async (request, reply) => {
  reply.code(201).header('x-not-stored', '1');
  return { charged: request.body.amount };
};

test('fastify: replays the first response, 422 on another body, 400 on a bad key, no key passes through', async () => {
  const s = await serve(charge);
  try {
    const a = await s.post('k1', '{"amount": 10}');
    const b = await s.post('k1', '{"amount": 10}');
    assert.equal(a.status, 201);
    assert.equal(a.body, '{"charged":10}');
    assert.equal(a.headers.get('idempotent-replayed'), null);
    assert.equal(b.status, 201);
    assert.equal(b.body, a.body);
    assert.equal(b.headers.get('idempotent-replayed'), 'true');
    assert.equal(b.headers.get('content-type'), a.headers.get('content-type'));
    assert.equal(b.headers.get('x-not-stored'), null);
    assert.equal(s.runs(), 1);
    // The same JSON value, other bytes: another request.
    assert.equal((await s.post('k1', '{"amount":10}')).status, 422);
    assert.equal((await s.post('k'.repeat(256), '{"amount": 10}')).status, 400);
    assert.equal((await s.post('', '{"amount": 10}')).status, 400);
    assert.equal((await s.post(undefined, '{"amount": 10}')).status, 201);
    assert.equal(s.runs(), 2);
    assert.deepEqual(s.metrics.requests, { first_run: 1, replayed: 1, in_progress: 0, conflict: 1, too_large: 0 });
  } finally {
    await s.close();
  }
});

test('fastify: a duplicate while the first runs gets 409 and Retry-After', async () => {
  let release;
  const gate = new Promise((r) => { release = r; });
  let started;
  const begun = new Promise((r) => { started = r; });
  const s = await serve(async (request, reply) => {
    started();
    await gate;
    return charge(request, reply);
  });
  try {
    const first = s.post('k', '{"amount": 1}');
    await begun;
    const dup = await s.post('k', '{"amount": 1}');
    assert.equal(dup.status, 409);
    assert.equal(dup.headers.get('retry-after'), '30');
    release();
    const a = await first;
    assert.equal(a.status, 201);
    const again = await s.post('k', '{"amount": 1}');
    assert.equal(again.body, a.body);
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.equal(s.runs(), 1);
    assert.equal(s.metrics.requests.in_progress, 1);
  } finally {
    await s.close();
  }
});

test('fastify: a retryable status and a thrown error release the key; too large is never replayed truncated', async () => {
  let n = 0;
  const store = newStore(client, { maxBody: 1000 });
  const s = await serve(async (request, reply) => {
    n++;
    if (n === 1) return reply.code(503).send('busy');
    if (n === 2) throw new Error('upstream timeout');
    return 'x'.repeat(2000);
  }, { store });
  try {
    assert.equal((await s.post('k', 'a', 'text/plain')).status, 503);
    assert.equal((await s.post('k', 'a', 'text/plain')).status, 500);
    const big = await s.post('k', 'a', 'text/plain');
    assert.equal(big.status, 200);
    assert.equal(big.body.length, 2000);
    const retry = await s.post('k', 'a', 'text/plain');
    assert.equal(retry.status, 500);
    assert.match(retry.body, /too large/);
    assert.equal(retry.headers.get('idempotent-replayed'), 'true');
    assert.equal(s.runs(), 3);
    assert.equal(s.metrics.requests.too_large, 1);
  } finally {
    await s.close();
  }
});

test('fastify: the request hash is the node:http adapter\'s (raw body bytes)', async () => {
  const store = newStore();
  const plain = createServer(idempotent(store, (req, res) => {
    res.statusCode = 201;
    res.setHeader('content-type', 'application/json');
    res.end('{"charged":"plain"}');
  }));
  plain.listen(0, '127.0.0.1');
  await once(plain, 'listening');
  const s = await serve(charge, { store });
  try {
    const body = '{"amount": 10}';
    const first = await fetch(`http://127.0.0.1:${plain.address().port}/charges`, {
      method: 'POST', body, headers: { 'content-type': 'application/json', 'Idempotency-Key': 'shared' },
    });
    assert.equal(first.status, 201);
    const replay = await s.post('shared', body);
    assert.equal(replay.status, 201);
    assert.equal(replay.body, '{"charged":"plain"}');
    assert.equal(replay.headers.get('idempotent-replayed'), 'true');
    assert.equal(s.runs(), 0);
  } finally {
    plain.close();
    await s.close();
  }
});

test('fastify: Redis unreachable gives 503 by default; the handler runs with failOpen', async () => {
  const down = await startRedis();
  const c = new IORedis({ host: down.host, port: down.port, maxRetriesPerRequest: 0, retryStrategy: () => null });
  c.on('error', () => {});
  await c.ping();
  const ended = once(c, 'end');
  await down.stop();
  await ended;
  const closed = await serve(charge, { store: newStore(c) });
  const open = await serve(charge, { store: newStore(c), failOpen: true });
  try {
    const r = await closed.post('k', '{"amount": 1}');
    assert.equal(r.status, 503);
    assert.equal(r.headers.get('retry-after'), '1');
    assert.equal(closed.runs(), 0);
    assert.equal(closed.metrics.storeErrors.begin, 1);
    assert.equal((await open.post('k', '{"amount": 1}')).status, 201);
    assert.equal(open.runs(), 1);
  } finally {
    await closed.close();
    await open.close();
    c.disconnect();
  }
});

test('fastify: a body over bodyLimit is refused before the store is asked', async () => {
  const s = await serve(charge);
  try {
    const r = await s.post('k', `{"amount": "${'x'.repeat(1 << 20)}"}`);
    assert.equal(r.status, 413);
    assert.equal(s.runs(), 0);
    assert.equal(s.metrics.requests.first_run, 0);
  } finally {
    await s.close();
  }
});

test('fastify: the plugin refuses to register without a store', async () => {
  const app = Fastify();
  await assert.rejects(app.register(fastifyIdempotency, {}).ready(), /Expected `store`/);
  await app.close();
});

test('fastify: a store error at complete (enableOfflineQueue false) is retried until the record completes', async () => {
  const c = new IORedis({ host: server.host, port: server.port, enableOfflineQueue: false });
  c.on('error', () => {});
  await once(c, 'ready');
  const store = newStore(c, { log: () => {} });
  const s = await serve(async (request, reply) => {
    // The connection breaks while the handler runs: ioredis fails every
    // command at once until it has reconnected.
    const reconnecting = once(c, 'reconnecting');
    await client.client('KILL', 'ID', String(await c.client('ID')));
    await reconnecting;
    return charge(request, reply);
  }, { store });
  try {
    const first = await s.post('k', '{"amount": 3}');
    assert.equal(first.status, 201);
    assert.ok(s.metrics.storeErrors.complete >= 1, 'the first complete did not fail');
    const rk = store.recordKey('', 'k');
    await until('the record to be completed', async () => (await client.hget(rk, 'state')) === 'completed', 10_000);
    const r = await s.post('k', '{"amount": 3}');
    assert.deepEqual([r.status, r.headers.get('idempotent-replayed'), r.body, s.runs()], [201, 'true', first.body, 1]);
  } finally {
    await s.close();
    c.disconnect();
  }
});
