// testdata/vectors/inputs.json: bad (and odd) inputs, and the answer every
// backstop host gives, byte for byte: through decide, decideMany and
// bin/backstop-decide.js.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { InputError, loadPolicy } from '../index.js';
import { parseJSON } from '../lib/json.js';

const bin = fileURLToPath(new URL('../bin/backstop-decide.js', import.meta.url));
const path = new URL('../../../testdata/vectors/inputs.json', import.meta.url);
const file = parseJSON(readFileSync(path, 'utf8'));

// The library-only values a line cannot hold: {"$bytes": hex}, {"$float":
// "NaN"}, {"$int": digits}.
function revive(v) {
  if (v === null || typeof v !== 'object') return v;
  if (Array.isArray(v)) return v.map(revive);
  const keys = Object.keys(v);
  if (keys.length === 1 && keys[0] === '$bytes') return Buffer.from(v.$bytes, 'hex');
  if (keys.length === 1 && keys[0] === '$float') return Number(v.$float);
  if (keys.length === 1 && keys[0] === '$int') return BigInt(v.$int);
  return Object.fromEntries(keys.map((k) => [k, revive(v[k])]));
}

// The answer line for a decision or an InputError, as the command writes it.
const line = (d) =>
  JSON.stringify(d.error !== undefined ? d : { action: d.action, delay_ms: d.delayMs, reason: d.reason, class: d.class }).replace(
    /[\u2028\u2029]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16)}`,
  );

// A failure as the command decides it: absent (or null) random and now_ms
// are 0, not a draw and the clock.
function failure(v) {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return v;
  return { ...v, random: v.random ?? 0, now_ms: v.now_ms ?? 0 };
}

// The library cases: every value, and every line that holds a value (not a
// line-level error) and is not for the commands only.
const cases = file.cases.filter((c) => c.value !== undefined || (c.line !== undefined && !c.cli && !c.output.startsWith('{"error":"invalid input line: ')));

test('inputs: decide gives every case its answer', async () => {
  const p = await loadPolicy(file.policy);
  for (const [i, c] of cases.entries()) {
    const v = failure(c.value !== undefined ? revive(c.value) : parseJSON(c.line));
    let got;
    try {
      got = line(p.decide(v));
    } catch (err) {
      if (!(err instanceof InputError)) throw err;
      got = line({ error: err.message });
    }
    assert.equal(got, c.output, `case ${i} (${c.note}): ${(c.line ?? JSON.stringify(c.value)).slice(0, 200)}`);
  }
  p.close();
});

test('inputs: in decideMany, a bad failure gets its error and the others are decided', async () => {
  const p = await loadPolicy(file.policy);
  const good = { attempt: 2, httpStatus: 503, random: 0.5, nowMs: 0 };
  const goodLine = line(p.decide(good));
  for (const [i, c] of cases.entries()) {
    const v = failure(c.value !== undefined ? revive(c.value) : parseJSON(c.line));
    const what = `case ${i} (${c.note})`;
    let ds;
    let got;
    try {
      ds = p.decideMany([good, v, good]);
      got = line(ds[1]);
    } catch (err) {
      if (!(err instanceof InputError)) throw err;
      assert.equal(err.index, 1, what);
      assert.ok(err.message.startsWith('failures[1]: '), what);
      assert.equal(err.decisions[1], null, what);
      ds = err.decisions;
      got = line({ error: err.message.slice('failures[1]: '.length) });
    }
    assert.equal(got, c.output, what);
    assert.equal(line(ds[0]), goodLine, what);
    assert.equal(line(ds[2]), goodLine, what);
  }
  p.close();
});

test('inputs: backstop-decide answers every line case, byte for byte', async () => {
  const lines = file.cases.filter((c) => c.value === undefined);
  const input = Buffer.concat(lines.map((c) => Buffer.concat([c.line_hex !== undefined ? Buffer.from(c.line_hex, 'hex') : Buffer.from(c.line), Buffer.from('\n')])));
  const child = spawn(process.execPath, [bin, '--policy', file.policy], { stdio: ['pipe', 'pipe', 'inherit'] });
  const chunks = [];
  child.stdout.on('data', (d) => chunks.push(d));
  child.stdin.end(input);
  assert.equal(await new Promise((resolve) => child.on('close', resolve)), 0);
  const got = Buffer.concat(chunks).toString('utf8').split('\n');
  assert.equal(got.pop(), '');
  assert.equal(got.length, lines.length);
  for (const [i, c] of lines.entries()) assert.equal(got[i], c.output, `line ${i} (${c.note})`);
});

test('inputs: a stateful policy counts exactly the valid failures of a batch, in order', async () => {
  const config = { retry_budget: { type: 'token_bucket', max_tokens: 3, token_ratio: 0.5 }, circuit_breaker: { failure_threshold: 4, open_for: '1s', half_open_successes: 1 } };
  const bad = [{ attempt: 1, http_stauts: 503 }, { attempt: 1, idempotencyKey: 0 }, { attempt: 1, method: 'x'.repeat(70000) }, { attempt: 0 }, null];
  const failures = [];
  for (let i = 0; i < 24; i++) failures.push(i % 3 === 1 ? bad[i % bad.length] : { attempt: 1 + (i % 4), httpStatus: 503, random: 0.5, nowMs: 1767225600000 + 1000 * i });
  const batch = await loadPolicy(config);
  const one = await loadPolicy(config);
  const err = (() => {
    try {
      batch.decideMany(failures);
    } catch (e) {
      return e;
    }
  })();
  assert.ok(err instanceof InputError && err.index === 1, String(err));
  const want = failures.map((f, i) => (i % 3 === 1 ? null : one.decide(f)));
  assert.deepEqual(err.decisions, want);
  batch.close();
  one.close();
});
