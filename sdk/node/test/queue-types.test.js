// Job types against a real redis-server (issue 16, as queue/jobtypes_test.go
// in Go and tests/test_queue_types.py in Python): one work() loop over a
// stream of three job types, one failing; each type decided by its own
// policy ({policies}), counted by type in the stats hash, replayed alone.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Redis } from 'ioredis';
import { loadPolicy } from '../index.js';
import { createQueue } from '../lib/redis.js';
import { inspector } from '../test-support/clients.js';
import { until } from '../test-support/eventually.js';
import { counters, entries } from '../test-support/queue-suite.js';
import { startRedis } from '../test-support/redis-server.js';

const server = await startRedis();
const raw = inspector(server);
after(async () => {
  await raw.close();
  await server.stop();
});

// A policy that notes the ids of the jobs it decided.
function spied(policy) {
  const ids = new Set();
  return {
    ids,
    policy: new Proxy(policy, {
      get(target, prop) {
        if (prop === 'outcome') return (e) => { if (e.event === 'failure') ids.add(e.idempotencyKey); return target.outcome(e); };
        const v = Reflect.get(target, prop, target);
        return typeof v === 'function' ? v.bind(target) : v;
      },
    }),
  };
}

test('enqueue takes a job type and refuses a bad one before Redis', async () => {
  await raw('FLUSHALL');
  const q = createQueue(raw.client, 'typed');
  await q.enqueue('a', 'x', { type: 'send_email' });
  await q.enqueue('b', 'x');
  await q.enqueue('c', 'x', { type: '' });
  for (const bad of ['a:b', 't'.repeat(65), 'b\u0000', 'send email', 'café', 7]) {
    await assert.rejects(q.enqueue('bad', 'x', { type: bad }), (err) => err instanceof TypeError && /`type`/.test(err.message), String(bad));
  }
  assert.deepEqual((await entries(raw, q.keys.jobs)).map((e) => e.fields.type ?? null), ['send_email', null, null]);
  await assert.rejects(q.replay({ limit: 1, type: 'a:b' }), TypeError);
});

test('one work() loop over three job types: each decided by its own policy, counted and replayed by type', async () => {
  await raw('FLUSHALL');
  const fast = { backoff: { base: '5ms', cap: '10ms' }, jitter: { mode: 'none' } };
  const base = spied(await loadPolicy({ max_attempts: 5, ...fast }));
  const critical = spied(await loadPolicy({ max_attempts: 2, ...fast }));
  const batch = spied(await loadPolicy({ max_attempts: 3, ...fast }));
  const q = createQueue(raw.client, 'mixed');
  const types = ['send_email', 'charge_card', 'render_report'];
  for (let i = 0; i < 9; i++) await q.enqueue(`${types[i % 3]}-${i}`, 'x', { type: types[i % 3] });
  const seen = new Map();
  const client = new Redis({ host: server.host, port: server.port });
  const ac = new AbortController();
  const wq = createQueue(client, q.name);
  const done = wq.work(base.policy, (job) => {
    const n = (seen.get(job.id) ?? 0) + 1;
    seen.set(job.id, n);
    if (job.type === 'charge_card') throw Object.assign(new Error('card processor down'), { status: 503 });
    if (job.type === 'send_email' && n === 1) throw Object.assign(new Error('smtp busy'), { status: 503 });
    if (job.id === 'render_report-2') throw Object.assign(new Error('bad template'), { status: 400 });
  }, {
    signal: ac.signal, consumer: 'w1', reclaimEveryMs: 0, blockMs: 20, promoteEveryMs: 10, onError: () => {},
    classify: (err) => (err.status ? { httpStatus: err.status } : undefined),
    policies: { charge_card: critical.policy, render_report: batch.policy },
  });
  try {
    await until('every job finished', async () => {
      const c = await counters(raw, q);
      return c['attempts:success'] === 5 && c['attempts:dead_letter'] === 4;
    });
  } finally {
    ac.abort();
    await done;
    await client.quit();
  }
  const kinds = (s) => new Set([...s.ids].map((id) => id.replace(/-\d+$/, '')));
  assert.deepEqual([...kinds(base)], ['send_email']);
  assert.deepEqual([...kinds(critical)], ['charge_card']);
  assert.deepEqual([...kinds(batch)], ['render_report']);
  const c = await counters(raw, q);
  // charge_card gave up at its policy's 2 attempts, not work()'s 5.
  assert.equal(c['t:charge_card:max_attempts_reached'], 3);
  assert.equal(c['t:charge_card:finished:dead_letter:2'], 3);
  assert.equal(c['t:send_email:finished:success:2'], 3);
  assert.deepEqual([c['t:render_report:attempts:success'], c['t:render_report:dead_letters:permanent_error']], [2, 1]);
  assert.equal(c.types, 3);

  assert.equal(await q.replay({ limit: 10, type: 'send_email' }), 0);
  assert.equal(await q.replay({ limit: 10, type: 'charge_card' }), 3);
  assert.deepEqual((await entries(raw, q.keys.jobs)).map((e) => e.fields.type), ['charge_card', 'charge_card', 'charge_card']);
  assert.deepEqual((await entries(raw, q.keys.dlq)).map((e) => e.fields.type), ['render_report']);
});

test('work() refuses policies that are not a map of job type to policy', async () => {
  const q = createQueue(raw.client, 'refuse');
  const p = await loadPolicy('default');
  await assert.rejects(q.work(p, () => {}, { policies: { 'a:b': p } }), /policies key/);
  await assert.rejects(q.work(p, () => {}, { policies: { charge_card: {} } }), /policies\.charge_card/);
  await assert.rejects(q.work(p, () => {}, { policies: 'charge_card' }), /policies/);
});
