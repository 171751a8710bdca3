// Issue 45: run() moves delayed jobs of a RabbitMQ queue now (Go's
// Queue.Run, `backstop queue run --amqp.url`), against a real
// rabbitmq-server: from a delay level's ready messages (no worker) and from
// a Node worker's mover (the backstop.run exchange), the attempt kept, the
// due time dropped, the limit holding across both; another queue's delayed
// jobs stay.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import amqp from 'amqplib';
import { loadPolicy } from '../index.js';
import { connect, holdName } from '../lib/rabbitmq.js';
import { until } from '../test-support/eventually.js';
import { work } from '../test-support/rabbitmq-work.js';
import { startRabbit } from '../test-support/rabbitmq-server.js';

let server;
let broker;
let raw;

before(async () => {
  server = await startRabbit();
  broker = await connect(server.url, { onError: () => {} });
  raw = await amqp.connect(server.url);
});

after(async () => {
  await raw?.close().catch(() => {});
  await broker?.close();
  await server?.stop();
});

async function ready(name) {
  const ch = await raw.createChannel();
  try {
    return (await ch.checkQueue(name)).messageCount;
  } finally {
    await ch.close();
  }
}

test('run takes delayed jobs from the levels and from a mover', { timeout: 120_000 }, async () => {
  const q = broker.queue('run-node');
  const other = broker.queue('run-node-other');
  const hour = 3_600_000;
  for (const id of ['a', 'b', 'c', 'd']) await q.enqueue(id, id, { delayMs: hour });
  await other.enqueue('a', 'other', { delayMs: hour });

  // No worker: the jobs wait ready in hold.L10.
  assert.deepEqual(await q.run({ id: 'a' }), { moved: 1, left: 0, silent: 0 });
  assert.deepEqual(await q.run({ id: 'zz' }), { moved: 0, left: 0, silent: 0 });

  const w = work(q, await loadPolicy({ max_attempts: 3 }), async () => {});
  try {
    await until('a ran', () => w.runs.some((r) => r.job.id === 'a'), 30_000);
    await until('the level held by the mover', async () => (await ready(holdName(10))) === 0, 30_000);
    assert.deepEqual(await q.run({ dueBefore: new Date(Date.now() + 2 * hour), limit: 2 }), { moved: 2, left: 1, silent: 0 });
    assert.deepEqual(await q.run({ dueBefore: Date.now(), limit: 10 }), { moved: 0, left: 0, silent: 0 });
    await until('two more ran', () => w.runs.length === 3, 30_000);
    assert.deepEqual(await q.run({ dueBefore: Date.now() + 2 * hour, limit: 10 }), { moved: 1, left: 0, silent: 0 });
    await until('all four ran', () => w.runs.length === 4, 30_000);
  } finally {
    await w.stop();
  }
  for (const r of w.runs) {
    assert.equal(r.job.attempt, 1);
    assert.equal(r.job.payload.toString(), r.job.id);
  }
  assert.deepEqual(w.runs.map((r) => r.job.id).sort(), ['a', 'b', 'c', 'd']);
  // The other queue's job stayed delayed.
  assert.deepEqual(await other.run({ id: 'a' }), { moved: 1, left: 0, silent: 0 });

  await assert.rejects(q.run({}), /Expected `id` or `dueBefore`/);
  await assert.rejects(q.run({ id: 'a', limit: 3 }), /Expected `limit` with `dueBefore`/);
  await assert.rejects(q.run({ dueBefore: Date.now(), limit: 10_001 }), /limit/);
  await assert.rejects(broker.queue('run-never-made').run({ id: 'a' }), /no queue "run-never-made"/);
});
