// A policy's lints (docs/policy.md, "Lints"): the module answers bits, the
// schema's table spells them out, and each is a process warning at load.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { loadPolicy } from '../index.js';

test('jitter none warns with BP002, and policy.lints lists it', async () => {
  const warned = once(process, 'warning');
  const p = await loadPolicy({ jitter: { mode: 'none' } });
  assert.deepEqual(p.lints.map((l) => [l.code, l.field]), [['BP002', 'jitter.mode']]);
  assert.match(p.lints[0].message, /backoff without jitter/);
  const [w] = await warned;
  assert.equal(w.name, 'BackstopLintWarning');
  assert.equal(w.code, 'BP002');
  assert.match(w.message, /^jitter\.mode: BP002: jitter none: /);
  p.close();
});

test('a lint the policy ignores neither warns nor is listed', async () => {
  const seen = [];
  const listen = (w) => seen.push(w);
  process.on('warning', listen);
  try {
    const p = await loadPolicy({ jitter: { mode: 'none' }, lint_ignore: { BP002: 'a test of the herd' } });
    assert.deepEqual(p.lints, []);
    const preset = await loadPolicy('batch');
    assert.deepEqual(preset.lints, []);
    // Warnings are emitted on the next tick: wait for it.
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen.filter((w) => w.name === 'BackstopLintWarning'), []);
    p.close();
    preset.close();
  } finally {
    process.off('warning', listen);
  }
});

test('the same lint warns once per process, however often a policy is loaded', async () => {
  // As Node's own deprecations (once per code): a service that loads a
  // policy per tenant or per request must not print a warning each time.
  const seen = [];
  const listen = (w) => seen.push(w);
  process.on('warning', listen);
  try {
    for (let i = 0; i < 3; i++) {
      const p = await loadPolicy({ attempt_timeout: '500ms', connect_timeout: '500ms' });
      assert.deepEqual(p.lints.map((l) => l.code), ['BP006']);
      p.close();
    }
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(seen.filter((w) => w.code === 'BP006').length, 1);
  } finally {
    process.off('warning', listen);
  }
});

test('every policy of testdata/lints/cases.json reports exactly its lints', async () => {
  const file = JSON.parse(readFileSync(new URL('../../../testdata/lints/cases.json', import.meta.url), 'utf8'));
  assert.ok(file.cases.length > 0);
  for (const c of file.cases) {
    const p = await loadPolicy(c.policy);
    assert.deepEqual(p.lints.map((l) => ({ ...l })), c.lints, c.name);
    p.close();
  }
});
