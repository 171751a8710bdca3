// Plain producers on RabbitMQ (issue 27), against a real rabbitmq-server: a
// delivery with neither backstop-attempt nor backstop-first-enqueued-ms is
// attempt 1 of the job called by its message_id (one without is first
// adopted: published again with "amqp-" and 32 random hex characters),
// enqueued at its timestamp (else when received); every republish carries
// the job's id and headers, so the next delivery is not plain.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import amqp from 'amqplib';
import { loadPolicy } from '../index.js';
import { connect } from '../lib/rabbitmq.js';
import { until } from '../test-support/eventually.js';
import { startRabbit } from '../test-support/rabbitmq-server.js';

const LIMIT = { timeout: 180_000 };

let server;
let broker;
let raw;
let fast;
before(async () => {
  server = await startRabbit();
  broker = await connect(server.url, { onError: () => {} });
  raw = await amqp.connect(server.url);
  fast = await loadPolicy({ max_attempts: 2, backoff: { strategy: 'constant', base: '1ms', cap: '1ms' }, jitter: { mode: 'none' } });
});
after(async () => {
  fast?.close();
  await raw?.close().catch(() => {});
  await broker?.close();
  await server?.stop();
});

function work(q, handler) {
  const ac = new AbortController();
  const outcomes = [];
  const seen = [];
  const done = q.work(fast, async (job) => {
    seen.push(job);
    return handler(job);
  }, { signal: ac.signal, onError: () => {}, onOutcome: (o, job) => outcomes.push({ ...o, job }) });
  return { outcomes, seen, stop: async () => { ac.abort(); await done; } };
}

async function publishRaw(queue, body, props) {
  const ch = await raw.createConfirmChannel();
  try {
    await new Promise((resolve, reject) => ch.publish('', queue, Buffer.from(body), props, (err) => (err ? reject(err) : resolve())));
  } finally {
    await ch.close();
  }
}

const ADOPTED = /^amqp-[0-9a-f]{32}$/;

test('plain deliveries are jobs on attempt 1: message_id or an adopted one, timestamp or the receipt time', LIMIT, async () => {
  const q = broker.queue('plain-ok');
  await q.declare();
  const before = Date.now();
  await publishRaw('plain-ok', 'one', { messageId: 'm1', timestamp: 1700000000, headers: { 'backstop-job-type': 'send_email', other: 'x' } });
  await publishRaw('plain-ok', 'two', {});
  await publishRaw('plain-ok', 'three', { messageId: '', timestamp: 0 });
  const w = work(q, () => {});
  await until('three outcomes', () => w.outcomes.length === 3);
  await w.stop();
  const after = Date.now();
  assert.deepEqual(w.outcomes.map((o) => o.action), ['ack', 'ack', 'ack']);
  const [one, two, three] = w.seen;
  assert.deepEqual([one.id, one.attempt, one.firstEnqueuedMs, one.jobType, one.malformed], ['m1', 1, 1700000000000, 'send_email', false]);
  assert.equal(one.payload.toString(), 'one');
  assert.deepEqual([two.attempt, two.malformed, two.payload.toString()], [1, false, 'two']);
  assert.match(two.id, ADOPTED);
  assert.ok(two.firstEnqueuedMs >= before && two.firstEnqueuedMs <= after, `${two.firstEnqueuedMs} in [${before}, ${after}]`);
  assert.deepEqual([three.attempt, three.malformed, three.payload.toString()], [1, false, 'three']);
  assert.match(three.id, ADOPTED);
  assert.ok(three.firstEnqueuedMs >= before && three.firstEnqueuedMs <= after);
});

// Issue 40 (9): the id was the body's SHA-256, so two events with one body
// were one job to a handler guarding its side effect by job id.
test('two plain messages without message_id and with one body are two jobs with two ids, their headers kept', LIMIT, async () => {
  const q = broker.queue('plain-twins');
  await q.declare();
  await publishRaw('plain-twins', 'same', { timestamp: 1700000000, headers: { source: 'spring' } });
  await publishRaw('plain-twins', 'same', { timestamp: 1700000001, headers: { source: 'spring' } });
  const w = work(q, () => {});
  await until('two outcomes', () => w.outcomes.length === 2);
  await w.stop();
  assert.deepEqual(w.outcomes.map((o) => o.action), ['ack', 'ack']);
  const ids = w.seen.map((j) => j.id);
  for (const id of ids) assert.match(id, ADOPTED);
  assert.notEqual(ids[0], ids[1]);
  assert.deepEqual(w.seen.map((j) => [j.attempt, j.firstEnqueuedMs, j.headers.source, j.payload.toString()]).sort(), [
    [1, 1700000000000, 'spring', 'same'],
    [1, 1700000001000, 'spring', 'same'],
  ]);
  assert.equal((await q.stats()).ready, 0);
});

test('a plain job retried comes back with its id, attempt 2 and its enqueued time; dead-lettered with them', LIMIT, async () => {
  const q = broker.queue('plain-retry');
  await q.declare();
  await publishRaw('plain-retry', 'body', { timestamp: 1700000000, headers: { keep: 'me' } });
  const w = work(q, () => {
    throw Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' });
  });
  await until('two outcomes', () => w.outcomes.length === 2);
  await w.stop();
  assert.deepEqual(w.outcomes.map((o) => o.action), ['retry', 'dead_letter']);
  const id = w.seen[0].id;
  assert.match(id, ADOPTED);
  assert.deepEqual(w.seen.map((j) => [j.id, j.attempt, j.firstEnqueuedMs, j.malformed]), [
    [id, 1, 1700000000000, false],
    [id, 2, 1700000000000, false],
  ]);
  const [dl] = await q.inspect(10);
  assert.deepEqual([dl.id, dl.attempt, dl.firstEnqueuedMs, dl.reason, dl.destination], [id, 2, 1700000000000, 'max_attempts_reached', 'plain-retry']);
  assert.equal(dl.headers.keep, 'me');
});

test('a plain job dead-lettered at once carries message_id, attempt 1 and first enqueued time', LIMIT, async () => {
  const q = broker.queue('plain-dead');
  await q.declare();
  await publishRaw('plain-dead', 'x', {});
  const w = work(q, () => {
    throw Object.assign(new Error('bad input'), { status: 400 });
  });
  await until('one outcome', () => w.outcomes.length === 1);
  await w.stop();
  const [dl] = await q.inspect(10);
  assert.deepEqual([dl.id, dl.attempt, dl.reason], [w.seen[0].id, 1, 'permanent_error']);
  assert.match(dl.id, ADOPTED);
  assert.equal(dl.firstEnqueuedMs, w.seen[0].firstEnqueuedMs);
  assert.equal(dl.headers['backstop-attempt'], '1');
});

test('one of the two headers, or a bad value, stays malformed', LIMIT, async () => {
  const q = broker.queue('plain-bad');
  await q.declare();
  await publishRaw('plain-bad', 'a', { messageId: 'a', headers: { 'backstop-attempt': '1' } });
  await publishRaw('plain-bad', 'f', { messageId: 'f', headers: { 'backstop-first-enqueued-ms': '5' } });
  await publishRaw('plain-bad', 'n', { headers: { 'backstop-attempt': '1', 'backstop-first-enqueued-ms': '5' } });
  const w = work(q, () => {});
  await until('three outcomes', () => w.outcomes.length === 3);
  await w.stop();
  assert.deepEqual(w.seen, []);
  assert.deepEqual(w.outcomes.map((o) => o.reason), ['malformed', 'malformed', 'malformed']);
  const dls = await q.inspect(10);
  // A malformed message keeps what it had: no message_id made up for it.
  assert.deepEqual(dls.map((d) => d.id).sort(), ['', 'a', 'f']);
});
