// Every shared vector (testdata/vectors/vectors.json) through this host.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { InputError, loadPolicy } from '../index.js';
import { parseJSON } from '../lib/json.js';

const path = process.env.BACKSTOP_VECTORS ?? new URL('../../../testdata/vectors/vectors.json', import.meta.url);
const vectors = parseJSON(readFileSync(path, 'utf8'));

// The vectors leave out random and now_ms when they are 0; decide() would
// draw Math.random() and read the clock instead.
const failure = (input) => ({ random: 0, now_ms: 0, ...input });

const expected = (e) =>
  e.error !== undefined ? { error: e.error } : { action: e.action, delayMs: e.delay_ms, reason: e.reason, class: e.class };

function actual(fn) {
  try {
    return fn();
  } catch (err) {
    if (!(err instanceof InputError)) throw err;
    return { error: err.message };
  }
}

test('vectors: ABI version', () => {
  assert.equal(vectors.abi_version, 1);
});

for (const [gi, group] of vectors.groups.entries()) {
  test(`vectors: ${group.name} (#${gi})`, async () => {
    // Cases run in order on one fresh policy: budget and breaker sequences.
    const policy = await loadPolicy(group.preset ?? group.policy);
    try {
      for (const [i, c] of group.cases.entries()) {
        if (c.op === 'success') {
          policy.recordSuccess(c.now_ms);
          continue;
        }
        if (c.op === 'duration') {
          policy.recordDuration(c.duration_ms ?? 0, c.now_ms);
          continue;
        }
        if (c.op === 'acquire') {
          const { allowed, retry_in_ms: retryInMs, state } = c.permit;
          assert.deepEqual(policy.acquire(c.now_ms), { allowed, retryInMs, state }, `case ${i}: acquire at ${c.now_ms}`);
          continue;
        }
        if (c.op === 'connect_timeout') {
          assert.equal(policy.connectTimeout, c.timeout_ms, `case ${i}: connect_timeout`);
          continue;
        }
        if (c.op === 'attempt_timeout') {
          // elapsed_ms is left out when 0, as the failures' fields are.
          const got = actual(() => ({ timeoutMs: policy.attemptTimeout(c.elapsed_ms ?? 0) }));
          assert.deepEqual(got, c.error !== undefined ? { error: c.error } : { timeoutMs: c.timeout_ms }, `case ${i}: attempt_timeout at ${c.elapsed_ms}`);
          continue;
        }
        const got = actual(() => policy.decide(failure(c.input)));
        assert.deepEqual(got, expected(c.expect), `case ${i}: ${JSON.stringify(c.input, (_, v) => (typeof v === 'bigint' ? `${v}` : v))}`);
      }
    } finally {
      policy.close();
    }
  });

  if (!group.stateful) {
    // The same decisions through decideMany (decide_batch with many records).
    test(`vectors: ${group.name} (#${gi}) via decideMany`, async () => {
      const policy = await loadPolicy(group.preset ?? group.policy);
      const cases = group.cases.filter((c) => c.input && c.expect.error === undefined);
      const got = policy.decideMany(cases.map((c) => failure(c.input)));
      assert.deepEqual(got, cases.map((c) => expected(c.expect)));
      policy.close();
    });
  }
}
