// A service that replays idempotency records other adapters stored with
// headers its HTTP server refuses (Location `/orders/€42` stored by Go, a
// control byte by Python, a header name `X Odd:Name` by a store API), run
// as a child process by test/idempotency-replay.test.js so that a crash is
// seen as one: `node idempotency-replayer.js http|express|fastify REDIS_PORT`
// prints {results, runs, logs} as JSON and exits 0. (Outside test/ so that
// `node --test` does not take it for a test file.)
import { once } from 'node:events';
import { createServer } from 'node:http';
import { Redis } from 'ioredis';
import { createIdempotencyStore, fastifyIdempotency, fingerprint, idempotencyMiddleware, idempotent, Metrics } from '../lib/idempotency.js';

export const BODY = '{"sku":7}';

/** The records written as they are in Redis, by key: their stored headers (status 201, body `stored <key>`). */
export const RECORDS = {
  'go-location': { Location: ['/orders/€42'], 'Content-Type': ['application/json'] },
  'python-control': { Location: ['/charges/1\u0001'] },
  snowman: { Location: ['/charges/☃'] },
  'odd-name': { 'X Odd:Name': ['v'], 'Content-Type': ['application/json'] },
  crlf: { 'X-Split': ['a\r\nSet-Cookie: x=1'] },
  latin1: { 'X-Note': ['caf\u00e9'] },
};

async function main() {
  const [framework, port] = process.argv.slice(2);
  const redis = new Redis({ host: '127.0.0.1', port: Number(port) });
  const logs = [];
  const store = createIdempotencyStore(redis, {
    prefix: `replayer-${framework}`, metrics: new Metrics(), log: (message, fields) => logs.push({ message, ...fields }),
  });
  const request = fingerprint('POST', '/charges', BODY);
  for (const [key, headers] of Object.entries(RECORDS)) {
    await redis.hset(store.recordKey('', key), {
      state: 'completed', request, status: '201', headers: JSON.stringify(headers),
      body: Buffer.from(`stored ${key}`).toString('base64'), too_large: '0',
    });
  }
  // Through the store API: what it stores is replayable.
  const claim = await store.begin('', 'store-api', request);
  await store.complete('', 'store-api', claim.token, {
    status: 201, headers: { 'X Odd:Name': ['v'], Location: ['/charges/☃'] }, body: 'stored store-api',
  });

  let runs = 0;
  const handler = (req, res) => {
    runs++;
    res.statusCode = 201;
    res.end('ran');
  };
  let server;
  let close;
  if (framework === 'http') {
    server = createServer(idempotent(store, handler));
  } else if (framework === 'express') {
    const { default: express } = await import('express');
    const app = express();
    app.post('/charges', idempotencyMiddleware(store), handler);
    server = createServer(app);
  } else if (framework === 'fastify') {
    const { default: Fastify } = await import('fastify');
    const app = Fastify();
    await app.register(fastifyIdempotency, { store });
    app.post('/charges', async (request, reply) => {
      runs++;
      reply.code(201);
      return 'ran';
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    server = app.server;
    close = () => app.close();
  } else throw new Error(`unknown framework ${framework}`);
  if (!server.listening) {
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
  }
  const url = `http://127.0.0.1:${server.address().port}/charges`;
  const results = {};
  for (const key of [...Object.keys(RECORDS), 'store-api']) {
    for (let i = 0; i < 2; i++) { // every replay, not only the first
      const r = await fetch(url, { method: 'POST', body: BODY, headers: { 'Idempotency-Key': key, 'content-type': 'application/json' } });
      results[key] = { status: r.status, headers: Object.fromEntries(r.headers), body: await r.text() };
    }
  }
  await (close ? close() : new Promise((resolve) => server.close(resolve)));
  await redis.quit();
  process.stdout.write(JSON.stringify({ results, runs, logs }));
}

if (process.argv[1] === new URL(import.meta.url).pathname) await main();
