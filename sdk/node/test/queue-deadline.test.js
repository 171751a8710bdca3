// The handler deadline of the Redis worker against a real redis-server
// (issue 26's Done-when, as queue/deadline_test.go in Go and
// tests/test_queue_deadline.py in Python): a handler that runs past
// minIdleMs is held, so a second worker reclaiming on the same group does
// not run it again; a handler past handlerTimeoutMs is not waited for, and
// fails as a timeout decided by the policy.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Redis } from 'ioredis';
import { loadPolicy } from '../index.js';
import { createQueue } from '../lib/redis.js';
import { inspector } from '../test-support/clients.js';
import { until } from '../test-support/eventually.js';
import { counters } from '../test-support/queue-suite.js';
import { startRedis } from '../test-support/redis-server.js';

const server = await startRedis();
const raw = inspector(server);
after(async () => {
  await raw.close();
  await server.stop();
});

// Runs a worker of queue name on a client of its own (XREADGROUP blocks
// it); returns stop().
function work(name, policy, handler, options) {
  const client = new Redis({ host: server.host, port: server.port });
  const ac = new AbortController();
  const done = createQueue(client, name).work(policy, handler, { signal: ac.signal, blockMs: 50, promoteEveryMs: 0, ...options });
  return async () => {
    ac.abort();
    await done;
    await client.quit();
  };
}

// A policy that notes the error kinds of the failures it was asked about.
function spied(policy) {
  const kinds = [];
  return { kinds, outcome: (e) => (e.event === 'failure' && kinds.push(e.errorKind), policy.outcome(e)) };
}

test('a handler running past minIdleMs runs once: its worker holds it, a second worker reclaims nothing', async () => {
  await raw('FLUSHALL');
  const policy = await loadPolicy('default');
  const q = createQueue(raw.client, 'held');
  await q.ensureGroup();
  await q.enqueue('job-1', '');
  const ran = [];
  const outcomes = [];
  const errors = [];
  const common = { minIdleMs: 1000, onError: (e) => errors.push(e) };
  const stopA = work(q.name, policy, async (job) => {
    ran.push(['a', job.id]);
    await new Promise((resolve) => setTimeout(resolve, 3000)); // 3 × minIdleMs: the work under test
  }, { ...common, consumer: 'a', reclaimEveryMs: 0, onOutcome: (o) => outcomes.push(['a', o.action]) });
  await until('worker a to start the job', () => ran.length === 1);
  // Started once a holds the entry: b's reads find nothing new, its reclaim every ~150 ms would take the entry once idle for 1 s.
  const stopB = work(q.name, policy, (job) => void ran.push(['b', job.id]), {
    ...common, consumer: 'b', reclaimEveryMs: 150, onOutcome: (o) => outcomes.push(['b', o.action]),
  });
  try {
    await until('the job to be acked', () => outcomes.length > 0);
  } finally {
    await Promise.all([stopA(), stopB()]);
    policy.close();
  }
  assert.deepEqual(ran, [['a', 'job-1']]);
  assert.deepEqual(outcomes, [['a', 'ack']]);
  assert.deepEqual(errors, []);
  const stats = await q.stats();
  assert.deepEqual([stats.pending, stats.delayed, stats.dlq], [0, 0, 0]);
  const c = await counters(raw, q);
  assert.equal(c.reclaimed ?? 0, 0);
});

test('a handler past handlerTimeoutMs fails once as a timeout, whether it honours its signal or not', async () => {
  await raw('FLUSHALL');
  // Retries an hour apart: the retry is not run again within the test.
  const policy = await loadPolicy({ max_attempts: 3, backoff: { strategy: 'constant', base: '1h', cap: '1h' }, jitter: { mode: 'none' } });
  const spy = spied(policy);
  const q = createQueue(raw.client, 'deadline');
  await q.ensureGroup();
  await q.enqueue('ignores', '');
  await q.enqueue('honours', '');
  const ran = [];
  const signals = {};
  const outcomes = [];
  const errors = [];
  const stop = work(q.name, spy, (job, { signal }) => {
    ran.push(job.id);
    signals[job.id] = signal;
    // One never returns; the other gives up when its signal aborts.
    return new Promise((_, reject) => job.id === 'honours' && signal.addEventListener('abort', () => reject(signal.reason)));
  }, {
    consumer: 'w1', handlerTimeoutMs: 300, onOutcome: (o, job) => outcomes.push([job.id, o.action, o.reason]), onError: (e) => errors.push(e),
  });
  try {
    await until('both outcomes', () => outcomes.length === 2);
  } finally {
    await stop();
    policy.close();
  }
  assert.deepEqual(ran, ['ignores', 'honours']);
  assert.deepEqual(outcomes, [['ignores', 'retry', 'transient'], ['honours', 'retry', 'transient']]);
  assert.deepEqual(spy.kinds, ['timeout', 'timeout']);
  for (const s of Object.values(signals)) assert.equal(s.reason?.name, 'TimeoutError');
  // The one that ignored its signal is reported once; the worker did not wait for it.
  assert.deepEqual(errors.map((e) => e.message), [
    'queue deadline: job ignores: handler deadline exceeded after 300 ms; its handler ignores its signal and runs on: the worker moved on',
  ]);
  const delayed = (await raw('ZRANGE', q.keys.delayed, 0, -1)).map((m) => JSON.parse(m));
  assert.deepEqual(delayed.map((m) => [m.id, m.attempt, m.last_reason, m.last_error]).sort(), [
    ['honours', 2, 'transient', 'TimeoutError: handler deadline exceeded after 300 ms'],
    ['ignores', 2, 'transient', 'TimeoutError: handler deadline exceeded after 300 ms'],
  ]);
  const stats = await q.stats();
  assert.deepEqual([stats.pending, stats.delayed, stats.dlq], [0, 2, 0]);
});

test('stopping the worker aborts the handler\'s signal; its failure is applied', async () => {
  await raw('FLUSHALL');
  const policy = await loadPolicy({ max_attempts: 3, backoff: { strategy: 'constant', base: '1h', cap: '1h' }, jitter: { mode: 'none' } });
  const q = createQueue(raw.client, 'stopping');
  await q.ensureGroup();
  await q.enqueue('job-1', '');
  const outcomes = [];
  let started = false;
  const stop = work(q.name, policy, (job, { signal }) => {
    started = true;
    return new Promise((_, reject) => signal.addEventListener('abort', () => reject(signal.reason)));
  }, { consumer: 'w1', onOutcome: (o) => outcomes.push([o.action, o.reason]) });
  await until('the handler to start', () => started);
  await stop();
  policy.close();
  assert.deepEqual(outcomes, [['retry', 'uncertain']]); // an AbortError nobody classifies: the default class
});

test('handlerTimeoutMs must be a whole number >= 1', async () => {
  const policy = await loadPolicy('default');
  const q = createQueue(raw.client, 'options');
  for (const bad of [0, -1, 1.5, '300']) {
    await assert.rejects(q.work(policy, () => {}, { handlerTimeoutMs: bad }), {
      name: 'TypeError', message: new RegExp(`^Expected \`handlerTimeoutMs\` to be a whole number >= 1`),
    });
  }
  policy.close();
});
