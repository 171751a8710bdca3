// backstop-policy/queue against a real redis-server: every script of the
// queue contract through every supported client (test-support/queue-suite.js),
// and the client adapter's own behaviour.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { createQueue, keysFor, scriptSource } from '../lib/queue.js';
import { inspector, standalone } from '../test-support/clients.js';
import { scriptSuite } from '../test-support/queue-suite.js';
import { startRedis } from '../test-support/redis-server.js';

const server = await startRedis();
const raw = inspector(server);
after(async () => {
  await raw.close();
  await server.stop();
});

for (const [name, kind] of Object.entries(standalone)) {
  scriptSuite(name, kind, server, () => ({ raw, each: async (...args) => [await raw(...args)] }));
}

test('the shipped scripts are the contract’s', async () => {
  const { readdirSync, readFileSync } = await import('node:fs');
  const names = ['enqueue', 'ack', 'retry', 'dead_letter', 'promote', 'reclaim', 'replay', 'hold'];
  const contract = (name) => readFileSync(new URL(`../../../queue/scripts/${name}.lua`, import.meta.url), 'utf8');
  const shipped = (name) => readFileSync(new URL(`../scripts/${name}.lua`, import.meta.url), 'utf8');
  assert.deepEqual(readdirSync(new URL('../scripts/', import.meta.url)).sort(), [...names, 'lib'].map((n) => `${n}.lua`).sort());
  for (const name of [...names, 'lib']) {
    assert.equal(shipped(name), contract(name), `scripts/${name}.lua differs from queue/scripts`);
  }
  // Each script is sent after lib.lua, the helpers they share.
  for (const name of names) {
    assert.equal(scriptSource(name), `${contract('lib')}\n${contract(name)}`, name);
  }
  assert.throws(() => scriptSource('lib'), { name: 'TypeError' });
  assert.throws(() => scriptSource('nope'), { name: 'TypeError', message: /one of enqueue, ack/ });
});

test('keys and options', () => {
  assert.deepEqual(keysFor('orders'), { jobs: '{orders}:jobs', delayed: '{orders}:delayed', dlq: '{orders}:dlq', stats: '{orders}:stats' });
  const q = createQueue(raw.client, 'orders');
  assert.deepEqual([q.name, q.group, q.keys], ['orders', 'workers', keysFor('orders')]);
  assert.ok(Object.isFrozen(q) && Object.isFrozen(q.keys));
  assert.throws(() => createQueue(raw.client, ''), { name: 'TypeError', message: /`name`/ });
  assert.throws(() => createQueue(raw.client, 'q', { group: '' }), { name: 'TypeError', message: /`group`/ });
  assert.throws(() => createQueue(raw.client, 'q', { keys: { jobs: 'j' } }), { name: 'TypeError', message: /`keys.delayed`/ });
});

test('a client that is neither ioredis nor node-redis is refused', () => {
  for (const client of [null, {}, { get() {} }, { sendCommand() {} }, 'redis://127.0.0.1']) {
    assert.throws(() => createQueue(client, 'q'), { name: 'TypeError', message: /ioredis client .* node-redis v4\+ client/ });
  }
});

test('a Redis error names the queue and the step, and keeps the client error as its cause', async () => {
  await raw('SET', '{wrongtype}:jobs', 'x');
  const q = createQueue(raw.client, 'wrongtype');
  await assert.rejects(q.enqueue('job-1', 'p'), (err) => {
    assert.match(err.message, /^queue wrongtype: enqueue job-1: ERR backstop enqueue: \{wrongtype\}:jobs is a string, not a stream/);
    assert.equal(err.cause?.name, 'ReplyError');
    return true;
  });
  await assert.rejects(q.ensureGroup(), /^Error: queue wrongtype: create group workers: WRONGTYPE/);
  await assert.rejects(q.stats(), /^Error: queue wrongtype: stats: WRONGTYPE/);
});
