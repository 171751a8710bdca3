// The handler deadline of the RabbitMQ worker against a real rabbitmq-server
// (issue 26's Done-when, as queue/rabbitmq/deadline_test.go in Go and
// tests/test_rabbitmq_deadline.py in Python): a handler that runs past the
// connection's heartbeat timeout runs once and is acked (the heartbeats
// flow meanwhile, nothing is redelivered); one past handlerTimeoutMs is
// retried once through the delay levels, as a timeout.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { loadPolicy } from '../index.js';
import { connect } from '../lib/rabbitmq.js';
import { until } from '../test-support/eventually.js';
import { startRabbit } from '../test-support/rabbitmq-server.js';

// A hang fails its test instead of the run (a worker that never stops).
const LIMIT = { timeout: 120_000 };

let server;
let broker;
let policy;
before(async () => {
  server = await startRabbit();
  // A 1 s heartbeat (amqplib asks for it; the broker takes the lower of
  // its own 60 s and this): a connection that misses two is closed.
  broker = await connect(`${server.url}?heartbeat=1`, { onError: () => {} });
  policy = await loadPolicy({ max_attempts: 3, backoff: { strategy: 'constant', base: '1s', cap: '1s' }, jitter: { mode: 'none' } });
});
after(async () => {
  policy?.close();
  await broker?.close();
  await server?.stop();
});

// Runs q's worker; returns {seen, outcomes, errors, stop()}.
function work(q, p, handler, options) {
  const ac = new AbortController();
  const w = { seen: [], outcomes: [], errors: [] };
  const done = q.work(p, (job, ctx) => {
    w.seen.push(job);
    return handler(job, ctx);
  }, { signal: ac.signal, onError: (e) => w.errors.push(e), onOutcome: (o, job) => w.outcomes.push([job.attempt, o.action, o.reason]), ...options });
  w.stop = async () => {
    ac.abort();
    await done;
  };
  return w;
}

test('a handler running past the heartbeat timeout runs once and is acked', LIMIT, async () => {
  const q = broker.queue('deadline-heartbeat');
  await q.enqueue('job-1', 'x');
  const w = work(q, policy, () => new Promise((resolve) => setTimeout(resolve, 3000))); // 3 heartbeats: the work under test
  try {
    await until('the outcome', () => w.outcomes.length > 0);
  } finally {
    await w.stop();
  }
  assert.deepEqual(w.outcomes, [[1, 'ack', 'success']]);
  assert.deepEqual(w.seen.map((j) => [j.attempt, j.deliveryCount]), [[1, 0]]);
  assert.deepEqual(w.errors, []); // the connection was never lost
  assert.deepEqual(await q.stats(), { ready: 0, consumers: 0, dlq: 0, delayLevels: 0 });
});

test('a handler past handlerTimeoutMs is retried once through the delay levels, as a timeout', LIMIT, async () => {
  const q = broker.queue('deadline-timeout');
  await q.enqueue('job-1', 'x');
  const kinds = [];
  const spy = { outcome: (e) => (e.event === 'failure' && kinds.push(e.errorKind), policy.outcome(e)) };
  // The first attempt never returns (it ignores its signal); the second succeeds.
  const w = work(q, spy, (job) => (job.attempt === 1 ? new Promise(() => {}) : 'ok'), { handlerTimeoutMs: 300 });
  try {
    await until('the retry to succeed', () => w.outcomes.length === 2);
  } finally {
    await w.stop();
  }
  assert.deepEqual(w.outcomes, [[1, 'retry', 'transient'], [2, 'ack', 'success']]);
  assert.deepEqual(kinds, ['timeout']);
  const retried = w.seen[1];
  assert.deepEqual([retried.lastReason, retried.lastError], ['transient', 'TimeoutError: handler deadline exceeded after 300 ms']);
  assert.deepEqual(w.errors.map((e) => e.message), [
    'rabbitmq queue deadline-timeout: job job-1: handler deadline exceeded after 300 ms; its handler ignores its signal and runs on: the worker moved on',
  ]);
});

test('handlerTimeoutMs must be a whole number >= 1', LIMIT, async () => {
  const q = broker.queue('deadline-options');
  for (const bad of [0, -1, 2.5, '300']) {
    await assert.rejects(q.work(policy, () => {}, { handlerTimeoutMs: bad }), {
      name: 'TypeError', message: /^Expected `handlerTimeoutMs` to be a whole number >= 1/,
    });
  }
});
