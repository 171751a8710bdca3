// Plain producers on RabbitMQ (issue 27), against a real rabbitmq-server: a
// delivery with neither backstop-attempt nor backstop-first-enqueued-ms is
// attempt 1 of the job called by its message_id (else "sha256:" and its
// body's SHA-256), enqueued at its timestamp (else when received); every
// republish carries the job's id and headers, so the next delivery is not
// plain.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
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

const sha = (body) => `sha256:${createHash('sha256').update(body).digest('hex')}`;

test('plain deliveries are jobs on attempt 1: message_id or the body\'s SHA-256, timestamp or the receipt time', LIMIT, async () => {
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
  assert.deepEqual([two.id, two.attempt, two.malformed], [sha('two'), 1, false]);
  assert.match(two.id, /^sha256:[0-9a-f]{64}$/);
  assert.ok(two.firstEnqueuedMs >= before && two.firstEnqueuedMs <= after, `${two.firstEnqueuedMs} in [${before}, ${after}]`);
  assert.deepEqual([three.id, three.attempt, three.malformed], [sha('three'), 1, false]);
  assert.ok(three.firstEnqueuedMs >= before && three.firstEnqueuedMs <= after);
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
  assert.deepEqual(w.seen.map((j) => [j.id, j.attempt, j.firstEnqueuedMs, j.malformed]), [
    [sha('body'), 1, 1700000000000, false],
    [sha('body'), 2, 1700000000000, false],
  ]);
  const [dl] = await q.inspect(10);
  assert.deepEqual([dl.id, dl.attempt, dl.firstEnqueuedMs, dl.reason, dl.destination], [sha('body'), 2, 1700000000000, 'max_attempts_reached', 'plain-retry']);
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
  assert.deepEqual([dl.id, dl.attempt, dl.reason], [sha('x'), 1, 'permanent_error']);
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
