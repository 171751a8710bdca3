// testdata/vectors/one_call.json: the one-call methods on a stateless
// policy, where the host answers without the module, throw in the same
// precedence as Python's and Java's: a wrong type, then a closed policy,
// then the module's refusal of a negative argument.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { InputError, loadPolicy } from '../index.js';

const file = JSON.parse(readFileSync(new URL('../../../testdata/vectors/one_call.json', import.meta.url), 'utf8'));
const camel = (s) => s.replace(/_(.)/g, (_, c) => c.toUpperCase());

for (const c of file.cases) {
  test(`${c.method}(${JSON.stringify(c.arg)})${c.closed ? ' closed' : ''}`, async () => {
    const p = await loadPolicy(file.policy);
    assert.equal(p.stateful, false);
    if (c.closed) p.close();
    const call = () => p[camel(c.method)](c.arg);
    if (c.error === 'input') {
      assert.throws(call, (e) => e instanceof InputError && e.message === c.message);
    } else if (c.error === 'closed') {
      assert.throws(call, /the policy is closed/);
    } else {
      assert.equal(call() ?? null, c.answer);
    }
  });
}
