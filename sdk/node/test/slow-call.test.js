// Issue 43: the slow-call rate. Every call succeeds, each slower than the
// policy's slow_call_duration_threshold: the retry loop and the worker's
// runner measure each call and report it, so the breaker opens on
// successes alone. A call spins at least 3 ms against a 1 ms threshold: a
// lower bound on the clock, never an upper one.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { RetryError, loadPolicy, retry } from '../index.js';
import { Runner } from '../lib/runner.js';

const SLOW = {
  circuit_breaker: {
    type: 'failure_rate', slow_call_rate_threshold: 100, slow_call_duration_threshold: '1ms',
    sliding_window: { size: 5 }, minimum_calls: 5, open_for: '1h',
  },
};

function spin() {
  for (const start = performance.now(); performance.now() - start < 3;);
}

test('retry: slow successes open the breaker', async (t) => {
  const policy = await loadPolicy(SLOW);
  t.after(() => policy.close());
  for (let i = 0; i < 5; i++) assert.equal(await retry(() => (spin(), 'ok'), { policy }), 'ok');
  let ran = 0;
  await assert.rejects(retry(() => ran++, { policy }), (err) => err instanceof RetryError && err.reason === 'circuit_open');
  assert.equal(ran, 0, 'no call leaves while the breaker is open');
});

test('worker runner: slow successes open the breaker and defer the next job', async (t) => {
  const policy = await loadPolicy(SLOW);
  t.after(() => policy.close());
  let ran = 0;
  const handler = async () => {
    ran++;
    spin();
  };
  const runner = new Runner('reports', policy, handler, { handlerTimeoutMs: 60_000, onError: (err) => assert.fail(err) }, { malformed: 'malformed', error: (w, e) => e });
  const job = { id: 'report', attempt: 1, firstEnqueuedMs: Date.now() };
  for (let i = 0; i < 5; i++) assert.equal((await runner.run(job, '', undefined)).action, 'ack');
  const plan = await runner.run(job, '', undefined);
  assert.equal(plan.action, 'defer');
  assert.equal(plan.reason, 'circuit_open');
  assert.equal(ran, 5);
});

test('recordDuration: validated, and ignored by a policy without a slow-call rate', async (t) => {
  const policy = await loadPolicy(SLOW);
  t.after(() => policy.close());
  assert.throws(() => policy.recordDuration(-1), { name: 'InputError', message: /duration_ms: must be >= 0/ });
  const plain = await loadPolicy({ circuit_breaker: { type: 'failure_rate' } });
  t.after(() => plain.close());
  for (let i = 0; i < 200; i++) plain.recordDuration(1e9);
  assert.equal(plain.circuitState(), 'closed');
});
