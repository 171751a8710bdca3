// testdata/outcomes/cases.json (see its README): what a queue worker does
// about each event of a job, as the core decides it, replayed through this
// host's policy.outcome(): each case's steps in order on one fresh policy.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { InputError, loadPolicy } from '../index.js';

const file = JSON.parse(readFileSync(new URL('../../../testdata/outcomes/cases.json', import.meta.url), 'utf8'));

// A step as policy.outcome() takes it; absent numbers are 0 (a failure's
// random and now_ms too, not a draw and the clock).
function event(step) {
  const e = { event: step.event, deliveries: step.deliveries ?? 0, maxDeliveries: step.max_deliveries ?? 0 };
  if (step.event === 'failure') return { ...e, random: 0, now_ms: 0, ...step.failure };
  return { ...e, nowMs: step.now_ms ?? 0 };
}

// The outcome in the cases' shape, with its error's text when invalid.
function answer(policy, step) {
  let o;
  try {
    o = policy.outcome(event(step));
  } catch (err) {
    if (!(err instanceof InputError)) throw err;
    return { error: err.message };
  }
  const got = { expect: { action: o.action, reason: o.reason, class: o.class, delay_ms: o.delayMs, pause: o.pause, count: o.count, invalid: o.invalid } };
  if (o.invalid) got.error = o.error.message;
  return got;
}

test('the outcome cases cover every event', () => {
  const events = new Set(file.cases.flatMap((c) => c.steps.map((s) => s.event)));
  assert.deepEqual([...events].sort(), ['before', 'delivered', 'failure', 'success']);
});

for (const c of file.cases) {
  test(`outcomes: ${c.name}`, async () => {
    const policy = await loadPolicy(c.preset ?? c.policy);
    try {
      assert.equal(policy.stateful, c.stateful === true);
      for (const [i, step] of c.steps.entries()) {
        const want = step.error === undefined ? { expect: step.expect } : step.expect === undefined ? { error: step.error } : { expect: step.expect, error: step.error };
        assert.deepEqual(answer(policy, step), want, `step ${i}: ${JSON.stringify(step)}`);
      }
    } finally {
      policy.close();
    }
  });
}

// A failure the host refuses before the module sees it (a wrong type) is
// answered in the same shape as one the module refuses (a bad value).
test('outcomes: an invalid failure has the same shape whoever refuses it', async () => {
  const policy = await loadPolicy('default');
  try {
    const byHost = policy.outcome({ event: 'failure', attempt: 'one', nowMs: 1 });
    const byModule = policy.outcome({ event: 'failure', attempt: 0, nowMs: 1 });
    const shape = ({ error, ...o }) => [o, error instanceof InputError];
    assert.deepEqual(shape(byHost), shape(byModule));
    assert.deepEqual(shape(byModule), [
      { action: 'dead_letter', reason: 'malformed', class: 'retryable', delayMs: 0, pause: false, count: 'dead_letter', invalid: true },
      true,
    ]);
  } finally {
    policy.close();
  }
});
