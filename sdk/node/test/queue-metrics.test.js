// A queue worker with `metrics` exports the backstop_client_* families
// retry() does, with target = the queue's name (as queue/metrics_test.go in
// Go and tests/test_queue_metrics.py in Python), against a real redis-server:
// a success, a failure that opens the breaker (deferred: a retry with
// reason circuit_open), and a job the open breaker refuses before it runs.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Redis } from 'ioredis';
import promClient from 'prom-client';
import { createMetrics, loadPolicy } from '../index.js';
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

test('a worker counts successes, deferrals and refused jobs under target = the queue', async () => {
  await raw('FLUSHALL');
  const policy = await loadPolicy({
    max_attempts: 3, backoff: { base: '10ms', cap: '20ms' }, jitter: { mode: 'none' },
    circuit_breaker: { failure_threshold: 1, open_for: '1h' },
  });
  const q = createQueue(raw.client, 'orders');
  for (const id of ['job-ok', 'job-fails', 'job-refused']) await q.enqueue(id, '');
  const registry = new promClient.Registry();
  const metrics = createMetrics(promClient, { policy: 'payments', target: 'orders', registry });
  const client = new Redis({ host: server.host, port: server.port });
  const ac = new AbortController();
  // One read takes all three: the worker stops reading once the breaker opens.
  const done = createQueue(client, 'orders').work(policy, (job) => {
    if (job.id !== 'job-ok') throw Object.assign(new Error('HTTP 503'), { status: 503 });
  }, { signal: ac.signal, consumer: 'w1', reclaimEveryMs: 0, promoteEveryMs: 0, batch: 3, blockMs: 20, onError: () => {}, metrics });
  try {
    const value = async (name, labels) => (await registry.getSingleMetric(name).get()).values
      .find((v) => Object.entries(labels).every(([k, x]) => v.labels[k] === x))?.value;
    await until('a job refused', async () => (await value('backstop_client_calls_refused_total', { reason: 'circuit_open' })) === 1);
    const got = {};
    for (const outcome of ['success', 'retry', 'dead_letter', 'refused']) {
      got[outcome] = await value('backstop_client_attempts_total', { outcome, target: 'orders', policy: 'payments' });
    }
    assert.deepEqual(got, { success: 1, retry: 1, dead_letter: undefined, refused: 1 });
    assert.equal(await value('backstop_client_retries_total', { reason: 'circuit_open' }), 1);
    assert.equal(await value('backstop_client_circuit_state', { state: 'open' }), 1);
    assert.equal(await value('backstop_client_circuit_transitions_total', { from: 'closed', to: 'open' }), 1);
  } finally {
    ac.abort();
    await done;
    await client.quit();
  }
});

test('a worker exports the retry budget left after each job', async () => {
  await raw('FLUSHALL');
  const policy = await loadPolicy({ retry_budget: { max_tokens: 10, token_ratio: 0.5 } });
  const q = createQueue(raw.client, 'orders');
  for (const id of ['job-1', 'job-2']) await q.enqueue(id, '');
  const registry = new promClient.Registry();
  const metrics = createMetrics(promClient, { policy: 'payments', target: 'orders', registry });
  const client = new Redis({ host: server.host, port: server.port });
  const ac = new AbortController();
  const done = createQueue(client, 'orders').work(policy, () => {
    throw Object.assign(new Error('HTTP 503'), { status: 503 });
  }, { signal: ac.signal, consumer: 'w1', reclaimEveryMs: 0, promoteEveryMs: 0, batch: 2, blockMs: 20, onError: () => {}, metrics });
  try {
    const gauge = async () => (await registry.getSingleMetric('backstop_client_budget_tokens').get()).values
      .find((v) => v.labels.policy === 'payments' && v.labels.target === 'orders')?.value;
    // Two failures take a token each from 10.
    await until('both jobs counted', async () => (await gauge()) === 8);
  } finally {
    ac.abort();
    await done;
    await client.quit();
  }
});

test('metrics for another target are refused at once', async () => {
  const policy = await loadPolicy('default');
  const metrics = createMetrics(promClient, { policy: 'payments', target: 'charge-api', registry: new promClient.Registry() });
  await assert.rejects(createQueue(raw.client, 'orders').work(policy, () => {}, { metrics }),
    /`metrics` to have target "orders", the queue's name \(got "charge-api"\)/);
});

// A retry whose promoter stalled shows in the measured retry latency
// (backstop_client_retry_latency_seconds: failure to the next attempt's
// start), not in the decided delay (as Go's
// TestRetryLatencyShowsStalledPromoter): the failed job's member is moved
// 5 s back in the delayed set (it failed 5 s ago, no promoter ran since),
// then promoted; the entry carries its due time (due_ms).
test('a stalled promoter shows in the measured retry latency', async () => {
  await raw('FLUSHALL');
  const policy = await loadPolicy({ max_attempts: 3, backoff: { strategy: 'constant', base: '10ms' }, jitter: { mode: 'none' } });
  const q = createQueue(raw.client, 'latency');
  await q.enqueue('job-1', '');
  const registry = new promClient.Registry();
  const metrics = createMetrics(promClient, { policy: 'payments', target: 'latency', registry });
  const client = new Redis({ host: server.host, port: server.port });
  const ac = new AbortController();
  const started = [];
  const done = createQueue(client, 'latency').work(policy, (job) => {
    started.push(job);
    if (job.attempt === 1) throw Object.assign(new Error('HTTP 503'), { status: 503 });
  }, { signal: ac.signal, reclaimEveryMs: 0, promoteEveryMs: 0, batch: 1, blockMs: 20, onError: () => {}, metrics });
  const hist = async (name) => {
    const values = (await registry.getSingleMetric(name).get()).values;
    return { count: values.find((v) => v.metricName === `${name}_count`)?.value ?? 0, sum: values.find((v) => v.metricName === `${name}_sum`)?.value ?? 0 };
  };
  try {
    await until('the failed job in the delayed set', async () => (await raw('ZCARD', '{latency}:delayed')) === 1);
    const [member] = await raw('ZRANGE', '{latency}:delayed', 0, 0);
    await raw('ZINCRBY', '{latency}:delayed', -5000, member);
    const { moved } = await q.promote(10);
    assert.equal(moved, 1);
    await until('the retry latency recorded', async () => (await hist('backstop_client_retry_latency_seconds')).count === 1);
    assert.equal(started[1].attempt, 2);
    assert.deepEqual(await hist('backstop_client_retry_delay_seconds'), { count: 1, sum: 0.01 });
    const { sum } = await hist('backstop_client_retry_latency_seconds');
    assert.ok(sum >= 5, `measured latency ${sum} s; want at least the 5 s stall`);
  } finally {
    ac.abort();
    await done;
    await client.quit();
  }
});
