// Clock skew between Redis workers (issue 40, as
// queue/redisqueue/skew_internal_test.go in Go and tests/test_queue_skew.py
// in Python), against a real redis-server: the scripts stamp
// first_enqueued_ms and due times with the server's TIME, so a worker whose
// clock is 30 s off must still measure a job's elapsed time (max_elapsed)
// on the server's clock, and no retry may run before its delay is over.
import assert from 'node:assert/strict';
import { after, mock, test } from 'node:test';
import { Redis } from 'ioredis';
import { loadPolicy } from '../index.js';
import { createQueue } from '../lib/redis.js';
import { inspector } from '../test-support/clients.js';
import { until } from '../test-support/eventually.js';
import { startRedis } from '../test-support/redis-server.js';

const server = await startRedis();
const raw = inspector(server);
after(async () => {
  await raw.close();
  await server.stop();
});

const serverMs = async () => {
  const [s, us] = await raw('TIME');
  return Number(s) * 1000 + Math.floor(Number(us) / 1000);
};

const counters = async (q) => {
  const flat = await raw('HGETALL', q.keys.stats);
  const c = {};
  for (let i = 0; i < flat.length; i += 2) c[flat[i]] = Number(flat[i + 1]);
  return c;
};

for (const skewMs of [30_000, -30_000]) {
  test(`a worker whose clock is ${skewMs / 1000} s off judges the time budget on the server's clock`, async () => {
    // The worker's clock (Date.now) is off; the server's is right. Before,
    // a worker ahead dead-lettered fresh jobs as max_elapsed_exceeded (20 s
    // budget), one behind retried jobs 25 s old, past their budget.
    const policy = await loadPolicy({
      max_attempts: 5, max_elapsed: '20s', backoff: { strategy: 'constant', base: '200ms', cap: '200ms' }, jitter: { mode: 'none' },
    });
    const q = createQueue(raw.client, `skew${skewMs}`);
    await q.ensureGroup();
    for (let i = 0; i < 4; i++) await q.enqueue(`fresh-${i}`, '');
    const old = String((await serverMs()) - 25_000);
    for (let i = 0; i < 2; i++) await raw('XADD', q.keys.jobs, '*', 'id', `old-${i}`, 'attempt', '1', 'first_enqueued_ms', old, 'payload', '');
    const spans = new Map(); // job id → [{start, end}] by the server's clock
    const real = Date.now;
    mock.method(Date, 'now', () => real() + skewMs);
    const client = new Redis({ host: server.host, port: server.port });
    const ac = new AbortController();
    const done = createQueue(client, q.name).work(policy, async (job) => {
      const span = { start: await serverMs() };
      spans.set(job.id, [...(spans.get(job.id) ?? []), span]);
      try {
        if (job.attempt < 3) throw Object.assign(new Error('503 unavailable'), { status: 503 });
      } finally {
        span.end = await serverMs();
      }
    }, { signal: ac.signal, consumer: 'w1', batch: 1, blockMs: 20, promoteEveryMs: 10, reclaimEveryMs: 0, onError: () => {} });
    try {
      await until('every job to finish', async () => {
        const c = await counters(q);
        return (c['attempts:success'] ?? 0) + (c['attempts:dead_letter'] ?? 0) === 6;
      });
    } finally {
      ac.abort();
      await done;
      await client.quit();
      mock.restoreAll();
    }
    const c = await counters(q);
    assert.deepEqual([c['attempts:success'], c['dead_letters:max_elapsed_exceeded']], [4, 2], JSON.stringify(c));
    for (const [id, runs] of spans) {
      assert.equal(runs.length, id.startsWith('old') ? 1 : 3, `${id} ran ${runs.length} times`);
      for (let i = 1; i < runs.length; i++) {
        assert.ok(runs[i].start >= runs[i - 1].end + 200, `${id}: attempt ${i + 1} ran before its 200 ms delay was over (server clock)`);
      }
    }
  });
}
