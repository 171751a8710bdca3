// backstop-policy/rabbitmq across a broker restart (a private rabbitmq-server
// for this file): the worker reconnects with backoff and goes on, enqueue
// with a signal publishes once the broker is back, and an outcome decided
// while the channel was lost is kept and applied when the message comes
// back, without running the job again.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { loadPolicy } from '../index.js';
import { connect } from '../lib/rabbitmq.js';
import { until } from '../test-support/eventually.js';
import { startRabbit } from '../test-support/rabbitmq-server.js';

// A hang fails its test instead of the run (a worker that never stops).
const LIMIT = { timeout: 180_000 };

let server;
let broker;
let policy;

before(async () => {
  server = await startRabbit();
  broker = await connect(server.url, { onError: () => {} });
  policy = await loadPolicy({ max_attempts: 3, backoff: { strategy: 'constant', base: '1ms', cap: '1ms' }, jitter: { mode: 'none' } });
});

after(async () => {
  await broker?.close();
  await server?.stop();
});

test('a worker reconnects after a broker restart and keeps an outcome it could not apply', LIMIT, async () => {
  const q = broker.queue('restart');
  await q.enqueue('held', 'h');
  let release;
  const gate = new Promise((resolve) => {
    release = resolve;
  });
  const seen = [];
  const outcomes = [];
  const errors = [];
  const ac = new AbortController();
  const done = q.work(policy, async (job) => {
    seen.push(`${job.id}#${job.attempt}`);
    if (job.id === 'held' && job.attempt === 1) {
      await gate;
      throw Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }); // a retry, decided with no channel
    }
  }, {
    signal: ac.signal,
    onError: (err) => errors.push(err),
    onOutcome: (o, job) => outcomes.push(`${job.id}#${job.attempt} ${o.action}`),
  });
  await until('the held job to start', () => seen.length === 1);
  // Enqueued while the broker is down: with a signal, published once it is back.
  let enqueuedDuringOutage = false;
  const enqueued = await server.restart(() => {
    const p = q.enqueue('during', 'd', { signal: AbortSignal.timeout(120_000) }).then(() => {
      enqueuedDuringOutage = true;
    });
    return { p };
  });
  release();
  await enqueued.p;
  assert.equal(enqueuedDuringOutage, true);
  await until('the outcome to be kept', () => errors.some((e) => /not applied \(kept for its redelivery\)/.test(e.message)));
  // Enqueued after the restart: the worker reconnected by itself.
  await q.enqueue('after', 'a');
  await until('the jobs to finish', () => ['held#2 ack', 'after#1 ack', 'during#1 ack'].every((o) => outcomes.includes(o)));
  ac.abort();
  await done;
  // held#1 ran once: its retry was applied on redelivery, not run again.
  assert.deepEqual(seen.filter((s) => s.startsWith('held')), ['held#1', 'held#2']);
  assert.deepEqual(outcomes.filter((s) => s.startsWith('held')), ['held#1 retry', 'held#2 ack']);
  assert.deepEqual(await q.stats(), { ready: 0, consumers: 0, dlq: 0, delayLevels: 0 });
});
