// The shared idempotency cases (testdata/idempotency/cases.json, see its
// README) replayed through the Node.js store against a real redis-server
// and a Redis Cluster, with ioredis and node-redis: every reply and the
// record after must be what the Go store produced.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { createIdempotencyStore, Metrics } from '../lib/idempotency.js';
import { cluster, inspector, standalone } from '../test-support/clients.js';
import { FILE, replayCase } from '../test-support/idempotency-cases.js';
import { serverNow } from '../test-support/queue-suite.js';
import { startCluster, startRedis } from '../test-support/redis-server.js';

const server = await startRedis();
const servers = await startCluster(3);
const raws = [inspector(server), inspector(servers.nodes)];
after(async () => {
  await Promise.all(raws.map((r) => r.close()));
  await server.stop();
  await servers.stop();
});

// The record as a Redis hash.
function redisRaw(store, raw) {
  const rk = store.recordKey(FILE.scope, FILE.key);
  return {
    reset: () => raw('DEL', rk),
    lapse: async () => raw('HSET', rk, 'lease_until', String((await serverNow(raw)) - 1000)),
    expire: () => raw('DEL', rk),
    write: async (fields) => {
      await raw('HSET', rk, ...Object.entries(fields).flat());
      await raw('PEXPIRE', rk, String(FILE.retention_ms));
    },
    record: (tokens) => record(raw, rk, tokens),
  };
}

async function record(raw, rk, tokens) {
  const flat = await raw('HGETALL', rk);
  if (flat.length === 0) return null;
  const h = {};
  for (let i = 0; i < flat.length; i += 2) h[flat[i]] = flat[i + 1];
  const now = await serverNow(raw);
  for (const [caller, tok] of Object.entries(tokens)) if (h.token === tok) h.token = `{${caller}}`;
  if (h.lease_until !== undefined) {
    const s = Math.round((Number(h.lease_until) - now) / 1000);
    h.lease_until = `{now${s < 0 ? '-' : '+'}${Math.abs(s)}s}`;
  }
  if (h.headers) h.headers = JSON.parse(h.headers);
  h.ttl_s = Math.round(Number(await raw('PTTL', rk)) / 1000);
  return h;
}

const kinds = [
  ...['ioredis 6', 'node-redis 6 RESP3', 'node-redis 4 legacyMode'].map((n) => [n, standalone[n], server, raws[0]]),
  ...['ioredis 6 Cluster', 'node-redis 6 cluster'].map((n) => [n, cluster[n], servers.nodes, raws[1]]),
];
for (const [name, kind, target, raw] of kinds) {
  test(`idempotency cases through ${name}`, async () => {
    const client = await kind.connect(target);
    try {
      const store = createIdempotencyStore(client, { leaseMs: FILE.lease_ms, retentionMs: FILE.retention_ms, maxBody: FILE.max_body,
        metrics: new Metrics() });
      assert.ok(FILE.cases.length >= 30);
      for (const c of FILE.cases) {
        const got = await replayCase(store, redisRaw(store, raw), c);
        assert.deepEqual(got, { replies: c.replies, final: c.final }, c.name);
      }
    } finally {
      await kind.close(client);
    }
  });
}
