// A queue worker and an open circuit breaker, against a real redis-server
// (issue 11's Done-when, as queue/defer_test.go in Go and
// tests/test_queue_defer.py in Python): the breaker refuses a job before its
// handler runs, the job is deferred without spending an attempt, the worker
// stops reading, and an outage ends with no dead letter.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
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

const counters = async (q) => {
  const flat = await raw('HGETALL', q.keys.stats);
  const c = {};
  for (let i = 0; i < flat.length; i += 2) c[flat[i]] = Number(flat[i + 1]);
  return c;
};

const commandCalls = async (cmd) => {
  const m = new RegExp(`^cmdstat_${cmd}:calls=(\\d+)`, 'm').exec(await raw('INFO', 'commandstats'));
  return m ? Number(m[1]) : 0;
};

const refused = () => Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' });

// Runs q's worker on a client of its own (XREADGROUP blocks it); returns stop().
function work(q, policy, handler, options) {
  const client = new Redis({ host: server.host, port: server.port });
  const ac = new AbortController();
  const wq = createQueue(client, q.name);
  const done = wq.work(policy, handler, { signal: ac.signal, consumer: 'w1', reclaimEveryMs: 0, onError: () => {}, ...options });
  return async () => {
    ac.abort();
    await done; // resolves once stopped, even while waiting for the breaker
    await client.quit();
  };
}

test('an open breaker refuses the job before the handler runs, defers it and stops the worker reading', async () => {
  await raw('FLUSHALL');
  const policy = await loadPolicy({
    max_attempts: 3, backoff: { base: '10ms', cap: '20ms' }, jitter: { mode: 'none' },
    circuit_breaker: { failure_threshold: 1, open_for: '1h' },
  });
  const q = createQueue(raw.client, 'stop');
  for (let i = 0; i < 10; i++) await q.enqueue(`job-${i}`, '');
  let calls = 0;
  let whileOpen = 0;
  const stop = work(q, policy, () => {
    calls++;
    if (policy.circuitState() === 'open') whileOpen++;
    throw refused();
  }, { batch: 1, blockMs: 20, promoteEveryMs: 10 });
  try {
    await until('the first job deferred', async () => (await counters(q))['deferred:circuit_open'] === 1);
    const reads = await commandCalls('xreadgroup');
    const promotes = await commandCalls('evalsha');
    // The promote loop runs on, 10 ms apart: a worker that kept reading
    // would have read the next job (20 ms blocks) long before.
    await until('the promote loop to run on', async () => (await commandCalls('evalsha')) >= promotes + 20);
    assert.equal(await commandCalls('xreadgroup'), reads, 'the worker read while the breaker was open');
    assert.deepEqual([calls, whileOpen], [1, 0]);
    const c = await counters(q);
    assert.deepEqual([c['attempts:deferred'], c['attempts:retry'], c['attempts:dead_letter']], [1, undefined, undefined]);
    const [member] = await raw('ZRANGE', q.keys.delayed, 0, -1);
    assert.match(member, /"attempt":1,/);
    assert.match(member, /"last_reason":"circuit_open"/);
  } finally {
    await stop();
  }
});

// A job the retry budget refuses waits its own backoff, which the
// budget_exhausted decision carries in delayMs (not a poll interval).
test('a budget refusal defers the job by its backoff', async () => {
  await raw('FLUSHALL');
  const policy = await loadPolicy({
    max_attempts: 5, backoff: { strategy: 'constant', base: '1h', cap: '1h' }, jitter: { mode: 'none' },
    retry_budget: { max_tokens: 1, token_ratio: 0.1 },
  });
  const q = createQueue(raw.client, 'budget');
  const before = Date.now();
  await q.enqueue('job-0', '');
  const stop = work(q, policy, () => { throw Object.assign(new Error('503'), { httpStatus: 503 }); }, { batch: 1, blockMs: 20 });
  try {
    await until('the job deferred', async () => (await counters(q))['deferred:budget_exhausted'] === 1);
    const [, score] = await raw('ZRANGE', q.keys.delayed, 0, -1, 'WITHSCORES');
    assert.ok(Number(score) >= before + 3_600_000, `deferred until ${Number(score) - before} ms after enqueue, want the 1h backoff`);
  } finally {
    await stop();
  }
});

for (const onOpen of ['defer', 'dead_letter']) {
  test(`an outage with a breaker (on_open: ${onOpen})`, async () => {
    await raw('FLUSHALL');
    const jobs = 12;
    const policy = await loadPolicy({
      max_attempts: 3, backoff: { base: '10ms', cap: '20ms' }, jitter: { mode: 'none' },
      circuit_breaker: { failure_threshold: 2, open_for: '200ms' }, on_open: onOpen,
    });
    assert.equal(policy.onOpen, onOpen);
    const q = createQueue(raw.client, 'outage');
    for (let i = 0; i < jobs; i++) await q.enqueue(`job-${i}`, '');
    let down = true;
    let downCalls = 0;
    let whileOpen = 0;
    const stop = work(q, policy, () => {
      if (policy.circuitState() === 'open') whileOpen++;
      if (down) {
        downCalls++;
        throw refused();
      }
    }, { batch: 4, blockMs: 20, promoteEveryMs: 10 });
    try {
      if (onOpen === 'dead_letter') {
        // The old behaviour, kept on request: jobs are dead-lettered.
        await until('dead letters', async () => (await counters(q))['attempts:dead_letter'] > 0);
        return;
      }
      // The outage lasts until the breaker has opened, half-opened and
      // reopened on a failed trial, and jobs have waited it out.
      await until('deferrals across a reopened breaker', async () => (await counters(q))['deferred:circuit_open'] >= jobs && downCalls >= 4);
      down = false;
      const c = await until('every job done', async () => {
        const c = await counters(q);
        return c['attempts:success'] === jobs && c;
      });
      assert.equal(Number(await raw('XLEN', q.keys.dlq)), 0, 'dead letters');
      assert.equal(c['attempts:dead_letter'], undefined);
      assert.equal(whileOpen, 0, 'the handler ran while the breaker was open');
      assert.ok(c['attempts:deferred'] >= jobs, JSON.stringify(c));
    } finally {
      await stop();
    }
  });
}
