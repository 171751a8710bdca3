// The package's modules import one another without a cycle (issue 29): the
// host layer (lib/host/) imports nothing outside it, the broker-neutral
// runner no broker, and no module any module that imports it back.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { test } from 'node:test';

const root = new URL('../', import.meta.url);

// lib/ and index.js: module path (from the package root) → what it imports of the package.
function graph() {
  const files = ['index.js', ...readdirSync(new URL('lib/', root), { recursive: true }).filter((f) => f.endsWith('.js')).map((f) => `lib/${f}`)];
  const g = new Map();
  for (const f of files) {
    const src = readFileSync(new URL(f, root), 'utf8');
    const deps = [...src.matchAll(/(?:^|\n)\s*(?:import|export)\s[^;]*?from\s+'(\.{1,2}\/[^']+)'/g), ...src.matchAll(/import\(\s*'(\.{1,2}\/[^']+)'\s*\)/g)]
      .map((m) => new URL(m[1], new URL(f, root)).href.slice(root.href.length));
    g.set(f, [...new Set(deps)]);
  }
  return g;
}

test('no module imports one that imports it back', () => {
  const g = graph();
  const cycles = [];
  const state = new Map(); // 1: on the path, 2: done
  const path = [];
  const visit = (f) => {
    state.set(f, 1);
    path.push(f);
    for (const d of g.get(f) ?? []) {
      if (state.get(d) === 1) cycles.push([...path.slice(path.indexOf(d)), d].join(' -> '));
      else if (!state.has(d)) visit(d);
    }
    path.pop();
    state.set(f, 2);
  };
  for (const f of g.keys()) if (!state.has(f)) visit(f);
  assert.deepEqual(cycles, []);
});

test('the host layer imports nothing outside lib/host/', () => {
  for (const [f, deps] of graph()) {
    if (!f.startsWith('lib/host/')) continue;
    assert.deepEqual(deps.filter((d) => !d.startsWith('lib/host/')), [], f);
  }
});

test('the runner imports no broker', () => {
  const deps = graph().get('lib/runner.js');
  assert.ok(deps.length > 0);
  assert.deepEqual(deps.filter((d) => /queue|rabbitmq|redis/.test(d)), []);
});
