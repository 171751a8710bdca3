// loadPolicy and the Policy API beyond the vectors: inputs, errors, state.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { InputError, PolicyError, loadPolicy } from '../index.js';
import { PRESET_NAMES } from '../lib/host/contract.gen.js';

const T0 = 1767225600000; // 2026-01-01T00:00:00Z
const retry503 = (extra = {}) => ({ attempt: 1, httpStatus: 503, random: 0.5, nowMs: T0, ...extra });

test('loadPolicy accepts a preset, JSON, YAML, an object and bytes', async () => {
  const json = '{"backoff": {"strategy": "constant", "base": "250ms"}, "jitter": {"mode": "none"}}';
  const yaml = 'backoff:\n  strategy: constant\n  base: 250ms\njitter:\n  mode: none\n';
  const object = { backoff: { strategy: 'constant', base: '250ms' }, jitter: { mode: 'none' } };
  const bytes = new TextEncoder().encode(json);
  for (const config of [json, yaml, object, bytes, bytes.buffer]) {
    const p = await loadPolicy(config);
    assert.equal(p.decide(retry503()).delayMs, 250);
    p.close();
  }
  const critical = await loadPolicy('critical');
  assert.deepEqual(critical.decide(retry503({ attempt: 3 })), {
    action: 'dead_letter', delayMs: 0, reason: 'max_attempts_reached', class: 'retryable',
  });
});

test('a bad policy is a PolicyError naming the field', async () => {
  await assert.rejects(loadPolicy({ backoff: { base: '1s', cap: '100ms' } }), (err) => {
    assert.ok(err instanceof PolicyError);
    assert.equal(err.field, 'backoff.cap');
    assert.equal(err.message, 'invalid policy: backoff.cap: must be >= backoff.base (got 100ms < 1s)');
    return true;
  });
  await assert.rejects(loadPolicy('max_attempts: -1\njitter: {mode: weird}\n'), (err) => {
    assert.deepEqual(err.problems.map((p) => p.field), ['max_attempts', 'jitter.mode']);
    return true;
  });
  await assert.rejects(loadPolicy('defualt'), {
    name: 'PolicyError',
    message: `invalid policy: preset: unknown preset "defualt" (presets: ${PRESET_NAMES.join(', ')})`,
  });
  await assert.rejects(loadPolicy(42), { name: 'TypeError', message: /preset name/ });
});

test('decide accepts camelCase and snake_case, gRPC names and BigInt', async () => {
  const p = await loadPolicy('default');
  const snake = p.decide({ attempt: 2, http_status: 429, retry_after: '7', random: 0.3, now_ms: T0 });
  const camel = p.decide({ attempt: 2, httpStatus: 429, retryAfter: 7, random: 0.3, nowMs: T0 });
  assert.deepEqual(snake, { action: 'retry', delayMs: 7000, reason: 'retry_after', class: 'retryable' });
  assert.deepEqual(camel, snake);
  assert.equal(p.decide({ attempt: 1, grpcCode: 'unavailable', random: 0 }).class, 'retryable');
  assert.equal(p.decide({ attempt: 1, grpc_code: 'INVALID_ARGUMENT' }).reason, 'permanent_error');
  assert.equal(p.decide({ attempt: 1, grpcCode: 14, random: 0 }).class, 'retryable');
  assert.equal(p.decide({ attempt: 9223372036854775807n, httpStatus: 503 }).reason, 'max_attempts_reached');
  assert.deepEqual(p.decide({ attempt: 2n, httpStatus: 503n, random: 0.5, nowMs: BigInt(T0), elapsedMs: 1n }), p.decide(retry503({ attempt: 2 })));
  // Fractions of a millisecond (performance.now) are dropped.
  assert.equal(p.decide(retry503({ elapsedMs: 1234.75 })).action, 'retry');
  // The hint may be gRPC pushback, and non-ASCII strings are encoded.
  assert.equal(p.decide(retry503({ grpcRetryPushbackMs: '3000' })).delayMs, 3000);
  assert.equal(p.decide(retry503({ errorKind: 'délai' })).action, 'retry');
  p.close();
});

test('invalid input is an InputError with the vectors message', async () => {
  const p = await loadPolicy('default');
  const cases = [
    [{ attempt: 0 }, 'attempt: must be >= 1 (got 0)'],
    [{ attempt: -9223372036854775808n }, 'attempt: must be >= 1 (got -9223372036854775808)'],
    [{ attempt: 1, httpStatus: 600 }, 'http_status: must be 0 (none) or 100..599 (got 600)'],
    [{ attempt: 1, grpcCode: 17 }, 'grpc_code: must be 0 (none) or 1..16 (got 17)'],
    // Negative numbers are written in two's complement, high word included.
    [{ attempt: 1, elapsedMs: -1 }, 'elapsed_ms: must be >= 0 (got -1)'],
    [{ attempt: 1, nowMs: -5e12 }, 'now_ms: must be >= 0 (got -5000000000000)'],
    [{ attempt: 1, prevDelayMs: -(2 ** 40) - 3 }, `prev_delay_ms: must be >= 0 (got ${-(2 ** 40) - 3})`],
    // Types, checked by the core's converter (a failure value).
    [{ attempt: 1.5 }, 'attempt: must be an integer (got 1.5)'],
    [{ attempt: '1' }, 'attempt: must be an integer (got a string)'],
    [{ attempt: true }, 'attempt: must be an integer (got true)'],
    // Numbers past the int64 range are refused, never saturated or wrapped.
    [{ attempt: 1e300 }, 'attempt: must fit in 64 bits (got 1e+300)'],
    [{ attempt: 2n ** 63n }, 'attempt: must fit in 64 bits (got 9223372036854775808)'],
    [{ attempt: 1, grpcCode: 'NOPE' }, 'grpc_code: unknown gRPC status name "NOPE"'],
    [{ attempt: 1, method: 5 }, 'method: must be a string (got 5)'],
    [{ attempt: 1, random: 'x' }, 'random: must be a number, "NaN", "Infinity" or "-Infinity" (got a string)'],
    // Unknown names, such as a typo, are refused (null values too).
    [{ attempt: 1, http_stauts: 503 }, 'http_stauts: unknown field'],
    [{ attempt: 1, http_stauts: null }, 'http_stauts: unknown field'],
    [{ attempt: 1, idempotencyKey: 0 }, 'idempotency_key: must be a string or a boolean (got 0)'],
    [{ attempt: 1, retryAfter: 'x'.repeat(70000) }, 'retry_after: must be at most 65535 bytes (got 70000)'],
  ];
  for (const [input, message] of cases) {
    assert.throws(() => p.decide(input), (err) => {
      assert.ok(err instanceof InputError, `${message}: ${err}`);
      assert.equal(err.message, message);
      assert.equal(err.field, message.slice(0, message.indexOf(':')));
      return true;
    });
  }
  assert.throws(() => p.decide(null), { name: 'InputError', message: 'failure: must be an object (got null)' });
  // The times of recordSuccess and circuitState follow now_ms's rules (an
  // i64 parameter would wrap a BigInt).
  for (const [nowMs, message] of [[1e300, 'now_ms: must fit in 64 bits (got 1e+300)'], [2n ** 64n, 'now_ms: must fit in 64 bits (got 18446744073709551616)'], [true, 'now_ms: must be an integer (got true)']]) {
    assert.throws(() => p.recordSuccess(nowMs), { name: 'InputError', message });
    assert.throws(() => p.circuitState(nowMs), { name: 'InputError', message });
  }
  p.close();
});

test('an absent random draws Math.random and an absent nowMs reads Date.now', async (t) => {
  const p = await loadPolicy('default'); // full jitter over 1s for attempt 1
  t.mock.method(Math, 'random', () => 0.25);
  assert.equal(p.decide({ attempt: 1, httpStatus: 503 }).delayMs, 250);
  // An HTTP-date hint 10s after "now" waits 10s.
  t.mock.method(Date, 'now', () => T0);
  const hint = new Date(T0 + 10_000).toUTCString();
  assert.equal(p.decide({ attempt: 1, httpStatus: 503, retryAfter: hint }).delayMs, 10_000);
  p.close();
});

test('decideMany matches decide, across chunks and buffer growth', async () => {
  const p = await loadPolicy('batch');
  const failures = [];
  for (let i = 0; i < 1000; i++) {
    failures.push({
      attempt: 1 + (i % 30), httpStatus: [503, 429, 500, 400][i % 4], random: (i % 97) / 97, nowMs: T0,
      elapsedMs: i * 1000, method: i % 3 ? 'GET' : 'POST',
      // Long hints grow the shared buffer in the middle of a chunk.
      retryAfter: i % 50 === 7 ? ` ${'9'.repeat(20000)}` : i % 4 === 1 ? String(i % 60) : undefined,
    });
  }
  assert.deepEqual(p.decideMany(failures), failures.map((f) => p.decide(f)));
  assert.deepEqual(p.decideMany([]), []);
  assert.throws(() => p.decideMany([retry503(), retry503({ httpStatus: 700 }), retry503({ attempt: 0 })]), {
    name: 'InputError', index: 1, message: 'failures[1]: http_status: must be 0 (none) or 100..599 (got 700)',
  });
  assert.throws(() => p.decideMany([retry503(), { attempt: 1.5 }]), { name: 'InputError', index: 1 });
  p.close();
});

// A failure the fast path does not take (a BigInt, a wrong type) goes to the
// core on its own, in its turn: a stateful policy sees the batch in order.
test('decideMany decides a failure of the slow path in its turn', async () => {
  const config = { retry_budget: { type: 'token_bucket', max_tokens: 3, token_ratio: 0.5 } };
  const failures = [retry503({ attempt: 1n }), retry503(), retry503({ attempt: 'x' }), retry503(), retry503({ nowMs: BigInt(T0) })];
  const [batch, one] = [await loadPolicy(config), await loadPolicy(config)];
  const want = failures.map((f, i) => (i === 2 ? null : one.decide(f)));
  assert.deepEqual(want.map((d) => d?.reason), ['transient', 'budget_exhausted', undefined, 'budget_exhausted', 'budget_exhausted']);
  assert.throws(() => batch.decideMany(failures), (err) => {
    assert.equal(err.message, 'failures[2]: attempt: must be an integer (got a string)');
    assert.deepEqual(err.decisions, want);
    return true;
  });
});

test('the circuit breaker is per handle', async () => {
  const config = { circuit_breaker: { failure_threshold: 2, open_for: '1s', half_open_successes: 1 } };
  const a = await loadPolicy(config);
  const b = await loadPolicy(config);
  assert.equal(a.stateful, true);
  a.decide(retry503());
  a.decide(retry503({ nowMs: T0 + 1 }));
  assert.equal(a.circuitState(T0 + 2), 'open');
  assert.equal(a.decide(retry503({ nowMs: T0 + 3 })).reason, 'circuit_open');
  assert.equal(b.circuitState(T0 + 2), 'closed');
  assert.equal(a.circuitState(T0 + 1500), 'half_open');
  a.recordSuccess(T0 + 1500);
  assert.equal(a.circuitState(BigInt(T0 + 1501)), 'closed');
  a.close();
  b.close();
  assert.equal((await loadPolicy('default')).stateful, false);
});

test('acquire: open refuses, half-open admits half_open_max_calls trials, a trial reports back', async () => {
  const p = await loadPolicy({ circuit_breaker: { failure_threshold: 1, open_for: '1s', half_open_max_calls: 2 } });
  assert.deepEqual(p.acquire(T0), { allowed: true, retryInMs: 0, state: 'closed' });
  p.decide(retry503());
  assert.deepEqual(p.acquire(T0 + 1), { allowed: false, retryInMs: 999, state: 'open' });
  const trials = [0, 1, 2, 3].map((i) => p.acquire(BigInt(T0 + 1000 + i)).allowed);
  assert.deepEqual(trials, [true, true, false, false]);
  p.recordSuccess(T0 + 1010);
  assert.deepEqual(p.acquire(T0 + 1011), { allowed: true, retryInMs: 0, state: 'closed' });
  assert.equal(p.onOpen, 'defer');
  p.close();
  assert.throws(() => p.acquire(T0), /closed/);
});

test('acquire: now_ms defaults to the clock; 0 on a stateful policy is an InputError', async () => {
  const st = await loadPolicy({ circuit_breaker: {}, on_open: 'dead_letter' });
  const sl = await loadPolicy('default');
  assert.equal(st.onOpen, 'dead_letter');
  assert.deepEqual(st.acquire(), { allowed: true, retryInMs: 0, state: 'closed' });
  assert.deepEqual(sl.acquire(0), { allowed: true, retryInMs: 0, state: 'closed' });
  assert.throws(() => st.acquire(0), (e) => e instanceof InputError && e.field === 'now_ms' && /must be set/.test(e.message));
  assert.throws(() => sl.acquire(-1), (e) => e instanceof InputError && e.message === 'now_ms: must be >= 0 (got -1)');
  assert.throws(() => st.acquire('soon'), (e) => e instanceof InputError && e.field === 'now_ms');
  st.close();
  sl.close();
});

test('budgetTokens reads the budget without changing it; null without one', async () => {
  const policy = await loadPolicy({ retry_budget: { max_tokens: 10, token_ratio: 0.5 } });
  assert.equal(policy.budgetTokens(T0), 10);
  policy.decide(retry503());
  assert.equal(policy.budgetTokens(T0), 9);
  assert.equal(policy.budgetTokens(T0), 9);
  policy.recordSuccess(T0 + 1);
  assert.equal(policy.budgetTokens(T0 + 1), 9.5);
  assert.throws(() => policy.budgetTokens(-1), { name: 'InputError', message: /now_ms/ });
  assert.equal((await loadPolicy({ circuit_breaker: {} })).budgetTokens(T0), null);
  assert.equal((await loadPolicy('default')).budgetTokens(), null);
});

test('attemptTimeout: attempt_timeout cut to what max_elapsed leaves; 0 none; bad input an InputError', async () => {
  const policy = await loadPolicy({ attempt_timeout: '2s', max_elapsed: '5s' });
  assert.equal(policy.attemptTimeout(0), 2000);
  assert.equal(policy.attemptTimeout(4000.7), 1000); // a fraction (performance.now) is dropped
  assert.equal(policy.attemptTimeout(9000n), 1);
  assert.equal((await loadPolicy({ max_attempts: 3 })).attemptTimeout(10), 0);
  assert.throws(() => policy.attemptTimeout(-5), (e) => e instanceof InputError && e.message === 'elapsed_ms: must be >= 0 (got -5)');
  for (const bad of [undefined, 'soon', NaN, 2n ** 63n]) {
    assert.throws(() => policy.attemptTimeout(bad), (e) => e instanceof InputError && e.field === 'elapsed_ms');
  }
  policy.close();
  assert.throws(() => policy.attemptTimeout(0), /closed/);
});

test('a closed policy refuses to decide', async () => {
  const p = await loadPolicy('default');
  p.close();
  p.close();
  assert.throws(() => p.decide(retry503()), /closed/);
  assert.throws(() => p.circuitState(), /closed/);
});

// Policies are cut one byte past the module's limit (policy.MaxFileBytes)
// before they are copied in: any oversized input gets the module's own
// PolicyError, never a buffer error, and costs no more than the limit.
test('an oversized policy is a PolicyError at any size, and the limit is the module\'s', async () => {
  const { MAX_POLICY_BYTES } = await import('../lib/host/policy.js');
  const fits = '{}' + ' '.repeat(MAX_POLICY_BYTES - 2);
  const p = await loadPolicy(fits);
  p.close();
  for (const config of [fits + ' ', Buffer.alloc(65 << 20, 0x20)]) {
    await assert.rejects(loadPolicy(config), (err) => err instanceof PolicyError && /must be at most 65536 bytes/.test(err.message));
  }
});

// The encoder keeps one scratch record between calls: a failure refused
// part-way (its status already converted), or a call that uses the scratch
// for an int64 parameter, must leave nothing in the next failure.
test('a failure refused part-way leaves nothing in the next one', async () => {
  const p = await loadPolicy('default');
  const timeout = { attempt: 1, errorKind: 'timeout', random: 0.5, nowMs: T0 };
  const want = p.decide(timeout);
  assert.equal(want.reason, 'transient');
  for (const bad of [
    { attempt: 1, httpStatus: 400, grpcCode: 'NOPE' },
    { attempt: 1, httpStatus: 400, retryAfter: '100', method: 'GET', serverDeclined: 1 },
  ]) {
    assert.throws(() => p.decide(bad), InputError);
    assert.deepEqual(p.decide(timeout), want);
    assert.throws(() => p.decideMany([bad]), InputError);
    assert.deepEqual(p.decideMany([timeout]), [want]);
  }
  p.attemptTimeout(12345);
  assert.throws(() => p.decide({ httpStatus: 503 }), /attempt: must be >= 1 \(got 0\)/);
  p.close();
});
