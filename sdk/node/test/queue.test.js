// backstop-policy/redis against a real redis-server: every script of the
// queue contract through every supported client (test-support/queue-suite.js),
// and the client adapter's own behaviour.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { createQueue, keysFor, scriptSource } from '../lib/redis.js';
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
  const names = ['enqueue', 'ack', 'retry', 'defer', 'dead_letter', 'promote', 'reclaim', 'replay', 'hold', 'run', 'discard'];
  const contract = (name) => readFileSync(new URL(`../../../contract/scripts/${name}.lua`, import.meta.url), 'utf8');
  const shipped = (name) => readFileSync(new URL(`../scripts/${name}.lua`, import.meta.url), 'utf8');
  // idempotency.lua ships beside them (lib/idempotency.js loads it), and
  // idempotency.sql (lib/idempotency-pg.js runs it).
  assert.deepEqual(readdirSync(new URL('../scripts/', import.meta.url)).sort(),
    [...[...names, 'lib', 'idempotency'].map((n) => `${n}.lua`), 'idempotency.sql'].sort());
  for (const name of [...names, 'lib', 'idempotency']) {
    assert.equal(shipped(name), contract(name), `scripts/${name}.lua differs from contract/scripts`);
  }
  const sql = (dir) => readFileSync(new URL(`${dir}idempotency.sql`, import.meta.url), 'utf8');
  assert.equal(sql('../scripts/'), sql('../../../contract/scripts/'), 'scripts/idempotency.sql differs from contract/scripts');
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

test('run moves delayed jobs now, by id or due before a bound, and counts them', async () => {
  const q = createQueue(raw.client, 'run-now');
  await q.ensureGroup();
  for (const [i, id] of ['a', 'b', 'c'].entries()) {
    await q.enqueue(id, 'p');
    const [job] = await q.read('c1', { count: 1 });
    await q.retry(job, (i + 1) * 3_600_000, 'transient', 'e');
  }
  await raw('ZADD', q.keys.delayed, '1', '{"id":"x","attempt":2.5}');
  assert.deepEqual(await q.run({ id: 'b' }), { moved: 1, left: 0 });
  assert.deepEqual(await q.run({ id: 'nope' }), { moved: 0, left: 0 }); // unknown id: nothing moved
  assert.deepEqual(await q.run({ id: 'x' }), { moved: 1, left: 0 }); // malformed: moved raw
  const bound = new Date(Date.now() + 5 * 3_600_000);
  assert.deepEqual(await q.run({ dueBefore: bound, limit: 1 }), { moved: 1, left: 1 });
  assert.deepEqual(await q.run({ dueBefore: bound.getTime() }), { moved: 1, left: 0 });
  const jobs = await q.read('c2', { count: 10 });
  assert.deepEqual(jobs.map((j) => j.id), ['b', '', 'a', 'c']);
  assert.equal(jobs[1].malformed, true);
  assert.equal((await q.stats()).counters.force_run, 4);
  for (const bad of [{}, { id: 'a', dueBefore: 1 }, { id: '' }, { dueBefore: bound, limit: 0 }, { dueBefore: bound, limit: 10001 }, { dueBefore: -1 }]) {
    await assert.rejects(q.run(bad), { name: 'TypeError' }, JSON.stringify(bad));
  }
});

// Issue 46: given an actor, replay and run record each job they move in the
// audit stream, by the same scripts as Go's CLI and console; without one
// nothing is recorded.
test('replay and run with an actor record in the audit', async () => {
  const q = createQueue(raw.client, 'aud-node');
  await q.ensureGroup();
  const audit = '{aud-node}:audit';
  await q.enqueue('d', 'p');
  const [d] = await q.read('c1', { count: 1 });
  await q.retry(d, 3_600_000, 'transient', 'e');
  for (const id of ['a', 'b']) {
    await q.enqueue(id, 'p');
    const [job] = await q.read('c1', { count: 1 });
    await q.deadLetter(job, 'permanent_error', 'boom');
  }
  assert.equal(await q.replay({ limit: 1 }), 1); // no actor: not recorded
  assert.equal(Number(await raw('XLEN', audit)), 0);
  assert.equal(await q.replay({ reason: 'permanent_error', actor: 'ann@ops1' }), 1);
  assert.deepEqual(await q.run({ id: 'd', actor: 'bob@ops2' }), { moved: 1, left: 0 });
  const recs = (await raw('XRANGE', audit, '-', '+')).map(([, f]) => {
    const o = {};
    for (let i = 0; i < f.length; i += 2) o[String(f[i])] = String(f[i + 1]);
    return o;
  });
  assert.deepEqual(recs.map((r) => [r.action, r.actor, r.id, r.reason]),
    [['replay', 'ann@ops1', 'b', 'permanent_error'], ['run', 'bob@ops2', 'd', 'transient']]);
  assert.equal(recs[0].at_ms.length, 13);
  await assert.rejects(q.replay({ limit: 1, actor: 'x'.repeat(257) }), { name: 'TypeError', message: /actor/ });
});

test('run by id goes on through a set too large for one call', async () => {
  const q = createQueue(raw.client, 'run-big');
  const args = [];
  for (let i = 0; i < 30000; i++) args.push(String(1e13 + i), `{"id":"job-${i}","attempt":2,"first_enqueued_ms":"1"}`);
  await raw('ZADD', q.keys.delayed, ...args);
  const first = await raw('EVAL', scriptSource('run'), '3', q.keys.delayed, q.keys.jobs, q.keys.stats, 'id', 'nope', '0');
  assert.notEqual(String(first[1]), '0', 'one call reads a bounded part');
  assert.deepEqual(await q.run({ id: 'job-29999' }), { moved: 1, left: 0 });
  assert.deepEqual(await q.run({ id: 'job-29999' }), { moved: 0, left: 0 });
  assert.equal(Number(await raw('ZCARD', q.keys.delayed)), 29999);
});
