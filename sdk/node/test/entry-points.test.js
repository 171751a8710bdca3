// The package's entry points, as an installed package resolves them
// (package.json "exports"): backstop-policy/queue is broker-neutral, the
// Redis queue is backstop-policy/redis, and the Redis names the queue entry
// point had at first still work there (deprecated aliases).
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { test } from 'node:test';
import * as queue from 'backstop-policy/queue';
import * as redis from 'backstop-policy/redis';

const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'));

test('backstop-policy/queue still exports the Redis queue (deprecated aliases)', () => {
  for (const name of ['createQueue', 'keysFor', 'scriptSource', 'sender']) {
    assert.equal(typeof redis[name], 'function', name);
    assert.equal(queue[name], redis[name], name);
  }
  assert.deepEqual(queue.keysFor('orders'), { jobs: '{orders}:jobs', delayed: '{orders}:delayed', dlq: '{orders}:dlq', stats: '{orders}:stats' });
});

test('backstop-policy/queue: the broker-neutral names', () => {
  assert.deepEqual(queue.ACTIONS, ['ack', 'retry', 'defer', 'dead_letter']);
  assert.ok(queue.isJobType('charge_card'));
  assert.ok(queue.isJobType('a'.repeat(queue.MAX_JOB_TYPE_LENGTH)));
  for (const bad of ['', 'a'.repeat(queue.MAX_JOB_TYPE_LENGTH + 1), 't:x', 'café', 7, null]) assert.equal(queue.isJobType(bad), false, String(bad));
  assert.equal(redis.ACTIONS, undefined, 'the broker-neutral names are not Redis ones');
});

test('every entry point has its types, and every type file ships', () => {
  for (const [entry, target] of Object.entries(pkg.exports)) {
    if (typeof target === 'string') continue;
    assert.ok(existsSync(new URL(`../${target.types}`, import.meta.url)), `${entry}: ${target.types}`);
  }
  // The entry points' types import the others (contract.gen.d.ts among them).
  for (const f of readdirSync(new URL('../', import.meta.url)).filter((n) => n.endsWith('.d.ts'))) {
    assert.ok(pkg.files.includes(f), `${f} not in package.json files`);
  }
});
