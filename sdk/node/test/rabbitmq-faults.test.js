// Issue 40's RabbitMQ faults against a real rabbitmq-server (a private broker
// for this file): a memory alarm runs no attempt twice and loses nothing;
// a huge handler error or a message near frame_max never closes the
// connection (header bounds); a deleted work queue does not stall the
// delays of another; a foreign x-delivery-count or an absurd due time; the
// pure bounds (boundError, fitHeaders).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import amqp from 'amqplib';
import { loadPolicy } from '../index.js';
import { connect, delayRoutingKey, levelName } from '../lib/rabbitmq.js';
import { boundError, fitHeaders, MAX_ERROR_BYTES, MAX_TABLE_BYTES, tableSize } from '../lib/rabbitmq/message.js';
import { publishFrames } from '../test-support/amqp-frames.js';
import { until } from '../test-support/eventually.js';
import { publishRaw, work } from '../test-support/rabbitmq-work.js';
import { startRabbit } from '../test-support/rabbitmq-server.js';

// A hang fails its test instead of the run (a worker that never stops).
const LIMIT = { timeout: 240_000 };
const MARKER = / …\[truncated: (\d+) bytes\]$/;

let server;
let raw; // a plain amqplib connection, to look and to publish what the library would not
const brokers = []; // closed at the end even when a test fails (their workers stop)
let fast; // 2 attempts, the retry 1 s later (the levels' least)

before(async () => {
  server = await startRabbit();
  raw = await amqp.connect(server.url);
  fast = await loadPolicy({ max_attempts: 2, backoff: { strategy: 'constant', base: '1ms', cap: '1ms' }, jitter: { mode: 'none' } });
});

after(async () => {
  for (const b of brokers) await b.close();
  fast?.close();
  await raw?.close().catch(() => {});
  await server?.stop();
});

const refused = (message = 'connect ECONNREFUSED') => Object.assign(new Error(message), { code: 'ECONNREFUSED' });

// A Broker whose connections are counted (conns) and errors kept (errors).
async function counted() {
  const conns = [];
  const errors = [];
  const amqplib = {
    connect: async (...args) => {
      const c = await amqp.connect(...args);
      conns.push(c);
      return c;
    },
  };
  const broker = await connect(server.url, { amqplib, onError: (err) => errors.push(err) });
  brokers.push(broker);
  return { broker, conns, errors };
}

async function drain(queue) {
  const ch = await raw.createChannel();
  const out = [];
  try {
    for (;;) {
      const msg = await ch.get(queue, { noAck: true });
      if (msg === false) return out;
      out.push(msg);
    }
  } finally {
    await ch.close();
  }
}

// -- the bounds ------------------------------------------------------------------------

test('boundError: at most 8192 bytes of UTF-8, cut on a character boundary, the marker inside', () => {
  assert.equal(boundError('short'), 'short');
  const exact = 'x'.repeat(MAX_ERROR_BYTES);
  assert.equal(boundError(exact), exact);
  for (const s of ['y'.repeat(MAX_ERROR_BYTES + 1), '€'.repeat(100_000), `a${'☃'.repeat(5000)}`]) {
    const b = boundError(s);
    assert.ok(Buffer.byteLength(b) <= MAX_ERROR_BYTES, `${Buffer.byteLength(b)} bytes`);
    assert.equal(Number(b.match(MARKER)[1]), Buffer.byteLength(s));
    const kept = b.replace(MARKER, '');
    assert.ok(s.startsWith(kept) && !kept.includes('\uFFFD'));
    assert.ok(Buffer.byteLength(b) > MAX_ERROR_BYTES - 3, 'cut at most a character short');
    assert.equal(boundError(b), b, 'bounded twice: the same');
  }
});

test('fitHeaders: a table over 65536 bytes loses foreign headers, largest first, listed; backstop-* and x-death stay', () => {
  const small = { 'backstop-attempt': '2', other: 'x', 'x-delivery-count': 3 };
  assert.deepEqual(fitHeaders(small), { 'backstop-attempt': '2', other: 'x' });
  const h = {
    'backstop-attempt': '1',
    'backstop-last-error': 'e'.repeat(200_000),
    'backstop-custom': 'c'.repeat(30_000),
    'x-death': [{ count: 1, reason: 'rejected', queue: 'q' }],
    big: 'b'.repeat(40_000),
    bigger: 'B'.repeat(50_000),
    mid: Buffer.alloc(10_000),
    tiny: 1,
  };
  const out = fitHeaders(h);
  assert.ok(tableSize(out) <= MAX_TABLE_BYTES, `${tableSize(out)} bytes`);
  assert.equal(out['backstop-dropped-headers'], 'bigger,big');
  // An earlier list first; whole names within 1024 bytes.
  const again = fitHeaders({ ...out, more: 'm'.repeat(70_000) });
  assert.equal(again['backstop-dropped-headers'], 'bigger,big,more');
  const many = Object.fromEntries(Array.from({ length: 200 }, (_, i) => [`header-${String(i).padStart(3, '0')}`, 'v'.repeat(400)]));
  const list = fitHeaders(many)['backstop-dropped-headers'];
  assert.ok(Buffer.byteLength(list) <= 1024 && list.startsWith('header-000,header-001,') && /header-\d{3}$/.test(list), list);
  assert.deepEqual(Object.keys(out).sort(), ['backstop-attempt', 'backstop-custom', 'backstop-dropped-headers', 'backstop-last-error', 'mid', 'tiny', 'x-death']);
  assert.match(out['backstop-last-error'], MARKER);
  assert.equal(h.big.length, 40_000, 'the headers given are not changed');
});

// -- faults on a real broker -------------------------------------------------------------

// Issue 40 (3): a confirm taken as "not published" after a timeout: the
// message was published once the alarm cleared, and published again.
test('a memory alarm while jobs retry: no attempt runs twice, none is lost', LIMIT, async () => {
  const { broker, errors } = await counted();
  const q = broker.queue('alarm');
  const N = 200;
  await Promise.all(Array.from({ length: N }, (_, i) => q.enqueue(`a${i}`, 'x')));
  // Slow enough that jobs are still in hand when the alarm comes (rabbitmqctl takes a second or two).
  const w = work(q, fast, async (job) => {
    await new Promise((resolve) => setTimeout(resolve, 100));
    if (job.attempt === 1) throw refused();
  }, { prefetch: 8 });
  await until('a quarter of the first attempts', () => w.runs.length >= N / 4);
  await server.ctl('set_vm_memory_high_watermark', '0.0001');
  try {
    await until('the connection blocked', () => errors.some((e) => /rabbitmq connection blocked/.test(e.message)));
    await new Promise((resolve) => setTimeout(resolve, 8000)); // the alarm lasts (what the test is about, not a wait for a condition)
  } finally {
    await server.ctl('set_vm_memory_high_watermark', '0.4');
  }
  await until('every job to succeed', () => w.outcomes.filter((o) => o.action === 'ack').length >= N, 120_000);
  await w.stop();
  const runs = new Map();
  for (const { job } of w.runs) runs.set(`${job.id}/${job.attempt}`, (runs.get(`${job.id}/${job.attempt}`) ?? 0) + 1);
  const twice = [...runs].filter(([, n]) => n > 1);
  assert.deepEqual(twice, [], 'attempts run twice');
  assert.equal(runs.size, 2 * N, 'every job ran attempts 1 and 2');
  assert.equal(w.outcomes.filter((o) => o.action === 'ack').length, N);
  const stats = await q.stats();
  assert.deepEqual([stats.ready, stats.dlq], [0, 0]);
  assert.ok(errors.some((e) => /rabbitmq connection unblocked/.test(e.message)));
});

// Issue 40 (4): the error became backstop-last-error whole; the retry's
// header frame exceeded frame_max and the broker closed the connection:
// the jobs in hand were delivered again, good ones dead-lettered as crash loops.
test('a 200 KB handler error beside short jobs: no connection lost, no good job dead-lettered, the error bounded', LIMIT, async () => {
  const { broker, conns } = await counted();
  const q = broker.queue('huge-error');
  const N = 100;
  await q.enqueue('big', 'b');
  await Promise.all(Array.from({ length: N }, (_, i) => q.enqueue(`s${i}`, 's')));
  const text = `upstream said: ${'€'.repeat(70_000)}`; // > 200 KB of UTF-8
  const w = work(q, fast, (job) => {
    if (job.id === 'big') throw refused(text);
  });
  await until('every job done', () => w.outcomes.length === N + 2, 60_000);
  await w.stop();
  assert.equal(conns.length, 1, 'connections made');
  assert.deepEqual(w.outcomes.filter((o) => o.action === 'dead_letter').map((o) => o.job.id), ['big']);
  assert.equal(w.outcomes.filter((o) => o.action === 'ack').length, N);
  const second = w.runs.find((r) => r.job.id === 'big' && r.job.attempt === 2).job;
  for (const e of [second.lastError, (await q.inspect(5))[0].error]) {
    assert.ok(Buffer.byteLength(e) <= MAX_ERROR_BYTES, `${Buffer.byteLength(e)} bytes`);
    assert.ok(Number(e.match(MARKER)[1]) >= Buffer.byteLength(text));
  }
  assert.equal((await q.stats()).dlq, 1);
});

test('a plain message with headers near frame_max is retried: foreign headers dropped and named, no connection lost', LIMIT, async () => {
  const { broker, conns } = await counted();
  const q = broker.queue('fat');
  await q.declare();
  // The worker's retry adds its headers: over frame_max (128 KiB) unbounded.
  await publishFrames(raw, 'fat', { messageId: 'fat', headers: { big1: 'a'.repeat(66_000), big2: 'b'.repeat(58_000), small: 'kept' } }, Buffer.from('f'));
  const w = work(q, fast, (job) => {
    if (job.attempt === 1) throw refused(`failed: ${'x'.repeat(4000)}`);
  });
  await until('the retry to succeed', () => w.outcomes.some((o) => o.action === 'ack'), 60_000);
  await w.stop();
  assert.equal(conns.length, 1, 'connections made');
  assert.deepEqual(w.runs.map((r) => r.job.attempt), [1, 2]);
  const h = w.runs[1].job.headers;
  assert.equal(h['backstop-dropped-headers'], 'big1');
  assert.equal(h.big1, undefined);
  assert.equal(h.big2.length, 58_000);
  assert.equal(h.small, 'kept');
});

// Issue 40 (5): 1,200 unroutable moves filled the mover's prefetch of
// hold.L0 and were tried every 10 s for ever: no other queue's delay moved.
test('a deleted work queue: its delayed jobs are dead-lettered unroutable, another queue\'s delays stay on time', LIMIT, async () => {
  const { broker } = await counted();
  const gone = broker.queue('gone');
  const victim = broker.queue('victim');
  await victim.declare();
  for (let i = 0; i < 1200; i += 100) {
    await Promise.all(Array.from({ length: 100 }, (_, j) => gone.enqueue(`g${i + j}`, 'g', { delayMs: 1000 })));
  }
  const ch = await raw.createChannel();
  await ch.deleteQueue('gone');
  await ch.close();
  const w = work(victim, fast, () => {}); // its mover finds the 1,200 first in hold.L0
  const due = new Map();
  for (let i = 0; i < 50; i++) {
    due.set(`v${i}`, Date.now() + 1000);
    await victim.enqueue(`v${i}`, 'v', { delayMs: 1000 });
  }
  await until('the 50 victim jobs', () => w.runs.length === 50, 60_000);
  // On time: never early; late by far less than the 10 s the unroutable
  // moves were held before (generous: a loaded machine).
  for (const { job, at } of w.runs) {
    assert.ok(at >= due.get(job.id), `${job.id} ran ${due.get(job.id) - at} ms early`);
    assert.ok(at - due.get(job.id) < 8000, `${job.id} ran ${at - due.get(job.id)} ms late`);
  }
  const dead = async () => (await raw.createChannel().then(async (c) => {
    const n = (await c.checkQueue('gone.dlq')).messageCount + (await c.checkQueue('backstop.unroutable')).messageCount;
    await c.close();
    return n;
  }));
  await until('the 1,200 dead-lettered', async () => (await dead()) === 1200, 60_000);
  await w.stop();
  const letters = [...await drain('gone.dlq'), ...await drain('backstop.unroutable')];
  assert.equal(letters.length, 1200);
  for (const m of letters) {
    assert.equal(m.properties.headers['backstop-reason'], 'unroutable');
    assert.equal(m.properties.headers['backstop-error'], 'no route to queue "gone": it was deleted or never declared');
  }
});

test('a move the broker refuses (a full work queue) re-enters the delay for 10 s, counted; at the 30th it is dead-lettered', LIMIT, async () => {
  const { broker, errors } = await counted();
  const q = broker.queue('full');
  await q.declare();
  // Full: at its max-length, with reject-publish (the work queue's own x-overflow).
  await server.ctl('set_policy', 'full', '^full$', '{"max-length":1}', '--apply-to', 'queues');
  // (The policy and the queue's length take effect a little later: filled until a publish is refused.)
  await until('the queue full', () => publishRaw(raw, '', 'full', 'filler', { messageId: 'filler' }).then(() => false, () => true));
  const w = work(broker.queue('mover-only'), fast, () => {}); // a mover
  try {
    const now = Date.now();
    const job = (id, refusals) => ({
      messageId: id,
      headers: {
        'backstop-attempt': '1', 'backstop-first-enqueued-ms': String(now), 'backstop-due-ms': String(now),
        'backstop-destination': 'full', ...(refusals === undefined ? {} : { 'backstop-move-refusals': refusals }),
      },
    });
    await publishRaw(raw, levelName(0), delayRoutingKey(1), 'last', job('last', '29'));
    await until('the 30th refusal dead-lettered', async () => (await q.stats()).dlq === 1);
    const [dl] = await q.inspect(1);
    assert.deepEqual([dl.id, dl.reason, dl.destination], ['last', 'unroutable', 'full']);
    assert.match(dl.error, /^the broker refused the delayed message's move 30 times \(a full queue or delay level\): /);
    assert.equal(dl.headers['backstop-move-refusals'], undefined);

    const at = Date.now();
    await publishRaw(raw, levelName(0), delayRoutingKey(1), 'first', job('first'));
    // Refused, it waits in the levels again, not in the mover: once the
    // queue takes messages, it arrives with its refusal counted.
    await until('the refusal', () => errors.some((e) => /job "first" to queue "full" was refused; delayed again/.test(e.message)));
    // (A quorum queue of RabbitMQ 3.10 keeps refusing after clear_policy: a higher max-length instead.)
    await server.ctl('set_policy', 'full', '^full$', '{"max-length":1000}', '--apply-to', 'queues');
    const ch = await raw.createChannel();
    const msg = await until('the job in its queue', async () => {
      const m = await ch.get('full', { noAck: true });
      return m && m.properties.messageId !== 'filler' ? m : false;
    }, 60_000);
    await ch.close();
    assert.equal(msg.properties.messageId, 'first');
    assert.equal(msg.properties.headers['backstop-move-refusals'], '1');
    assert.ok(Number(msg.properties.headers['backstop-due-ms']) >= at + 10_000);
    assert.equal((await q.stats()).dlq, 1);
  } finally {
    await server.ctl('clear_policy', 'full').catch(() => {});
    await w.stop();
  }
});

// Issue 40 (8): a shovel copies x-delivery-count; the job was dead-lettered
// crash_loop without running. A due time 10^17 cycled through the levels.
test('a foreign x-delivery-count on a first delivery is ignored; an absurd backstop-due-ms is malformed', LIMIT, async () => {
  const { broker } = await counted();
  const q = broker.queue('foreign');
  await q.declare();
  const now = String(Date.now());
  await publishRaw(raw, '', 'foreign', 'p', { messageId: 'plain', headers: { 'x-delivery-count': 99 } });
  await publishRaw(raw, '', 'foreign', 'j', { messageId: 'job', headers: { 'x-delivery-count': 99, 'backstop-attempt': '1', 'backstop-first-enqueued-ms': now } });
  await publishRaw(raw, '', 'foreign', 'd', { messageId: 'far', headers: { 'backstop-attempt': '1', 'backstop-first-enqueued-ms': now, 'backstop-due-ms': '100000000000000000' } });
  const w = work(q, fast, () => {});
  await until('three outcomes', () => w.outcomes.length === 3);
  await w.stop();
  assert.deepEqual(w.runs.map((r) => r.job.id).sort(), ['job', 'plain']);
  const [dl] = await q.inspect(5);
  assert.deepEqual([dl.id, dl.reason, dl.destination], ['far', 'malformed', 'foreign']); // a dead letter like any other
  assert.equal(dl.error, 'malformed message: backstop-due-ms is more than 30 days ahead');
  await assert.rejects(q.enqueue('later', '', { delayMs: 2_592_000_001 }), /`delayMs`.*30 days/);
  await q.enqueue('month', '', { delayMs: 2_592_000_000 });
});

// Issue 40 (10): each inspect raised the dead letters' x-delivery-count;
// at a quorum queue's delivery limit (20 by default on 4.x) a look dropped one.
test('25 inspects and 25 replays that take nothing leave a dead letter in place, unchanged, on a DLQ with a delivery limit of 20', LIMIT, async () => {
  const { broker } = await counted();
  const ch = await raw.createChannel();
  // Declared before the library would: the limit 4.x quorum queues have by default.
  await ch.assertQueue('looked.dlq', { durable: true, arguments: { 'x-queue-type': 'quorum', 'x-delivery-limit': 20 } });
  await ch.close();
  const headers = { 'backstop-attempt': '3', 'backstop-first-enqueued-ms': '1700000000000', 'backstop-reason': 'max_attempts_reached', 'backstop-error': 'boom', other: 'kept' };
  await publishRaw(raw, '', 'looked.dlq', 'one', { messageId: 'dead-1', headers });
  await publishRaw(raw, '', 'looked.dlq', 'two', { messageId: 'dead-2', headers });
  const q = broker.queue('looked');
  const first = await q.inspect(10);
  assert.deepEqual(first.map((d) => [d.id, d.reason, d.headers.other, d.headers['x-delivery-count']]), [
    ['dead-1', 'max_attempts_reached', 'kept', undefined],
    ['dead-2', 'max_attempts_reached', 'kept', undefined],
  ]);
  for (let i = 0; i < 25; i++) assert.deepEqual(await q.inspect(10), first);

  // A replay's dead letters that do not match, on the library's own DLQ.
  const r = broker.queue('replayed');
  await r.declare();
  await publishRaw(raw, '', 'replayed.dlq', 'x', { messageId: 'dead-3', headers });
  for (let i = 0; i < 25; i++) assert.equal(await r.replay({ reason: 'crash_loop' }), 0);
  const [msg] = await drain('replayed.dlq');
  assert.equal(msg.properties.messageId, 'dead-3');
  assert.ok((msg.properties.headers['x-delivery-count'] ?? 0) < 10, `x-delivery-count ${msg.properties.headers['x-delivery-count']}`);
});

test('a worker stopped during a memory alarm stops after the apply timeout; once the alarm is over, no job is lost', LIMIT, async () => {
  const { broker, errors } = await counted();
  const q = broker.queue('alarm-stop');
  const N = 20;
  await Promise.all(Array.from({ length: N }, (_, i) => q.enqueue(`s${i}`, 'x')));
  await server.ctl('set_vm_memory_high_watermark', '0.0001');
  try {
    // Their retries wait for confirms the blocked connection does not give.
    const w = work(q, fast, () => {
      throw refused();
    }, { prefetch: 4 });
    await until('the connection blocked', () => errors.some((e) => /rabbitmq connection blocked/.test(e.message)));
    await until('the jobs in hand run', () => w.runs.length === 4);
    await w.stop(); // resolves: the pending confirms are given up after 10 s
    await broker.close();
  } finally {
    await server.ctl('set_vm_memory_high_watermark', '0.4');
  }
  const { broker: after } = await counted();
  const succeeded = new Set();
  const w2 = work(after.queue('alarm-stop'), fast, (job) => {
    succeeded.add(job.id);
  });
  await until('every job to succeed', () => succeeded.size === N, 60_000);
  await w2.stop();
});

test('an outcome the broker refuses (a full DLQ) is handed back after a pause and applied once it can be, the job not run again', LIMIT, async () => {
  const { broker } = await counted();
  // Each hand-back counts in x-delivery-count: a delivery limit (22) the pauses do not reach here.
  const q = broker.queue('dlq-full', { maxDeliveries: 20 });
  await q.declare();
  await server.ctl('set_policy', 'dlq-full', '^dlq-full\\.dlq$', '{"max-length":1,"overflow":"reject-publish"}', '--apply-to', 'queues');
  try {
    await until('the DLQ full', () => publishRaw(raw, '', 'dlq-full.dlq', 'filler', { messageId: 'filler' }).then(() => false, () => true));
    await q.enqueue('bad', 'b');
    const refusals = [];
    const w = work(q, fast, () => {
      throw Object.assign(new Error('bad input'), { status: 400 });
    }, { onError: (err) => refusals.push(err) });
    // Refused, handed back, delivered again (its kept outcome applied, not run) and refused again.
    await until('the dead letter refused twice', () => refusals.filter((e) => /outcome dead_letter of job bad not applied/.test(e.message)).length >= 2);
    await server.ctl('set_policy', 'dlq-full', '^dlq-full\\.dlq$', '{"max-length":1000,"overflow":"reject-publish"}', '--apply-to', 'queues');
    await until('the dead letter applied', () => w.outcomes.length === 1, 60_000);
    await w.stop();
    assert.equal(w.runs.length, 1, 'runs');
    assert.deepEqual(w.outcomes.map((o) => [o.action, o.reason]), [['dead_letter', 'permanent_error']]);
    const ids = (await drain('dlq-full.dlq')).map((m) => m.properties.messageId).filter((id) => id !== 'filler');
    assert.deepEqual(ids, ['bad']);
  } finally {
    await server.ctl('clear_policy', 'dlq-full').catch(() => {});
  }
});

// The mover publishes its moves side by side on one channel and matches a
// basic.return to its move by exchange, routing key and message id: one
// job id delayed on two queues, one of them deleted, must land in the
// other queue and in the deleted one's DLQ, never swapped (a routable
// move dead-lettered unroutable, a returned one acked as moved: lost).
test('moves of one message id do not take each other\'s return', LIMIT, async () => {
  const { broker } = await counted();
  const n = 20;
  const gone = broker.queue('swap-gone');
  const alive = broker.queue('swap-alive');
  await gone.declare();
  await alive.declare();
  const ch = await raw.createConfirmChannel();
  await ch.deleteQueue('swap-gone');
  // Each pair in the last level, due at one instant: the mover publishes
  // them side by side, the routable move first.
  const due = String(Date.now() + 1000);
  for (let i = 0; i < n; i++) {
    for (const dest of ['swap-alive', 'swap-gone']) {
      const headers = { 'backstop-attempt': '1', 'backstop-first-enqueued-ms': due, 'backstop-due-ms': due, 'backstop-destination': dest };
      ch.publish(levelName(0), delayRoutingKey(1), Buffer.from(dest), { persistent: true, messageId: `same${i}`, headers });
    }
  }
  await ch.waitForConfirms();
  await ch.close();
  const depths = async () => {
    const c = await raw.createChannel();
    try {
      const out = [];
      for (const name of ['swap-gone.dlq', 'swap-alive', 'swap-alive.dlq']) out.push((await c.checkQueue(name)).messageCount);
      return out;
    } finally {
      await c.close();
    }
  };
  const w = work(broker.queue('swap-mover'), fast, () => {}); // a mover
  try {
    // A swapped pair loses a job: then the 2n never all arrive, and the depths say how many swapped.
    await until('every move', async () => (await depths()).reduce((a, b) => a + b) >= 2 * n).catch(() => {});
  } finally {
    await w.stop();
  }
  assert.deepEqual(await depths(), [n, n, 0], '[swap-gone.dlq, swap-alive, swap-alive.dlq]');
  for (const m of await drain('swap-alive')) assert.equal(m.content.toString(), 'swap-alive');
  for (const m of await drain('swap-gone.dlq')) assert.equal(m.content.toString(), 'swap-gone');
});
