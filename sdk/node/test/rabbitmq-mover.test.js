// backstop-policy/rabbitmq's delay mover against a real rabbitmq-server (a
// private broker for this file): the hops between delay levels are the
// workers' (queue/rabbitmq/README.md, "The moves between levels are the
// workers', not the broker's"): through backstop.hold.L<n>, never early,
// the first topology's TTL queues unbound; the routing cap (2^11 - 1 s);
// nothing lost when a mover's channel goes; a move without a route
// dead-lettered (unroutable); stats() counting the hold queues. (A deleted
// work queue and refused moves: rabbitmq-faults.test.js.)
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import amqp from 'amqplib';
import { loadPolicy } from '../index.js';
import { connect, delayRoutingKey, holdName, levelName } from '../lib/rabbitmq.js';
import { until } from '../test-support/eventually.js';
import { publishRaw, work } from '../test-support/rabbitmq-work.js';
import { startRabbit } from '../test-support/rabbitmq-server.js';

// A hang fails its test instead of the run (a worker that never stops).
const LIMIT = { timeout: 180_000 };

let server;
let broker;
let raw; // a plain amqplib connection, to look and to publish what the library would not
const others = []; // the tests' other Brokers: closed at the end even when a test fails (their workers stop)
let fast;
let threeSeconds;

before(async () => {
  server = await startRabbit();
  broker = await connect(server.url, { onError: () => {} });
  raw = await amqp.connect(server.url);
  const constant = (base) => ({ strategy: 'constant', base, cap: base });
  fast = await loadPolicy({ max_attempts: 3, backoff: constant('1ms'), jitter: { mode: 'none' } });
  threeSeconds = await loadPolicy({ max_attempts: 3, backoff: constant('3s'), jitter: { mode: 'none' } });
});

after(async () => {
  for (const b of others) await b.close();
  await raw?.close().catch(() => {});
  await broker?.close();
  await server?.stop();
});

async function depth(name) {
  const ch = await raw.createChannel();
  try {
    return (await ch.checkQueue(name)).messageCount;
  } finally {
    await ch.close();
  }
}

// Samples the first topology's TTL queues L0..L10 until stopped: resolves to
// the most messages seen in any of them.
function watchOldLevels() {
  let on = true;
  const seen = (async () => {
    let most = 0;
    const ch = await raw.createChannel();
    while (on) {
      for (let n = 0; n < 11; n++) most = Math.max(most, (await ch.checkQueue(levelName(n))).messageCount);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    await ch.close();
    return most;
  })();
  return async () => {
    on = false;
    return seen;
  };
}

const bits = (key) => parseInt(key.split('.').join(''), 2);

test('stats() counts the hold queues and the first topology\'s level queues', LIMIT, async () => {
  const q = broker.queue('counted');
  await q.declare();
  const before = (await q.stats()).delayLevels;
  await q.enqueue('later', '', { delayMs: 60_000 }); // no worker: it waits in hold.L5
  assert.equal(await depth(holdName(5)), 1);
  assert.equal((await q.stats()).delayLevels, before + 1);
  await publishRaw(raw, '', levelName(12), 'old', { messageId: 'old' }); // delayed before an upgrade
  assert.equal((await q.stats()).delayLevels, before + 2);
});

test('a retry hops the hold queues, moved by the worker\'s mover, never early; the TTL queues get nothing', LIMIT, async () => {
  const q = broker.queue('hops');
  const watch = watchOldLevels();
  await q.enqueue('r', 'p', { jobType: 't' });
  const w = work(q, threeSeconds, (job) => {
    if (job.attempt === 1) throw Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' });
  });
  await until('the second attempt', () => w.outcomes.length === 2, 60_000);
  await w.stop();
  assert.equal(await watch(), 0);
  assert.deepEqual(w.runs.map((r) => r.job.attempt), [1, 2]);
  const second = w.runs[1];
  assert.equal(second.job.prevDelayMs, 3000);
  assert.ok(second.job.dueMs !== null && second.at >= second.job.dueMs, `ran ${second.job.dueMs - second.at} ms early`);
  assert.equal(second.job.payload.toString(), 'p');
  assert.equal(second.job.jobType, 't');
  assert.equal(second.job.deliveryCount, 0); // the hold queues' counts are not the work queue's

  // Without a worker (no mover), a delayed job waits in its hold queue, not in a TTL queue.
  const before = Date.now();
  await q.enqueue('d', 'x', { delayMs: 3000 }); // bits 1 and 0: hold.L1, then hold.L0
  assert.equal(await depth(holdName(1)), 1);
  assert.equal(await depth(levelName(1)), 0);
  await new Promise((resolve) => setTimeout(resolve, 3500)); // due, and nothing moved it
  assert.equal(await depth(holdName(1)), 1);
  const w2 = work(q, fast, () => {});
  await until('the delayed job', () => w2.outcomes.length === 1, 60_000);
  await w2.stop();
  assert.ok(w2.runs[0].at >= before + 3000);
  assert.equal(w2.runs[0].job.id, 'd');
});

test('the cap: a delay above 2^11 - 1 s routes as 2047 s, and arrives early to be delayed again for the rest', LIMIT, async () => {
  const q = broker.queue('capped');
  const now = Date.now();
  await q.enqueue('long', '', { delayMs: 3_000_000 });
  const ch = await raw.createChannel();
  const got = await ch.get(holdName(10), { noAck: true }); // its highest bit: hold.L10
  assert.equal(got.properties.messageId, 'long');
  assert.equal(bits(got.fields.routingKey), 2047);
  assert.ok(Number(got.properties.headers['backstop-due-ms']) >= now + 3_000_000);

  // A job due in 1 h, arriving now (as after its 2047 s): delayed again, capped, not run.
  const headers = { 'backstop-attempt': '2', 'backstop-first-enqueued-ms': String(now), 'backstop-due-ms': String(now + 3_600_000), 'backstop-destination': 'capped' };
  await publishRaw(raw, '', 'capped', 'h', { messageId: 'hour', headers });
  const w = work(q, fast, () => {});
  await until('the hour job re-delayed', async () => (await ch.checkQueue('capped')).messageCount === 0 && (await depth(holdName(10))) === 0);
  await new Promise((resolve) => setTimeout(resolve, 500));
  await w.stop(); // the mover's holds go back to hold.L10
  assert.equal(w.runs.length, 0);
  const back = await until('the hour job back in hold.L10', () => ch.get(holdName(10), { noAck: true }));
  assert.equal(back.properties.messageId, 'hour');
  assert.equal(bits(back.fields.routingKey), 2047);
  assert.equal(back.properties.headers['backstop-due-ms'], headers['backstop-due-ms']);
  assert.equal(back.properties.headers['backstop-attempt'], '2');

  // The same path, short: the key 2 s, the due time 4.5 s away. It hops for 2 s,
  // arrives early, is delayed again for the rest and runs once, never early.
  const due = Date.now() + 4500;
  await publishRaw(raw, 'capped.delay', delayRoutingKey(2000), 's', { messageId: 'short', headers: { ...headers, 'backstop-due-ms': String(due) } });
  const w2 = work(q, fast, () => {});
  await until('the short job', () => w2.outcomes.length === 1, 60_000);
  await w2.stop();
  assert.equal(w2.runs.length, 1);
  assert.equal(w2.runs[0].job.attempt, 2);
  assert.ok(w2.runs[0].at >= due, `ran ${due - w2.runs[0].at} ms early`);
  await ch.close();
});

test('a mover that loses its channel while holding a message loses nothing: the reconnected one, or another, moves it', LIMIT, async () => {
  // A connection the test can break as a crash would (its socket destroyed).
  const conns = [];
  const amqplib = {
    connect: async (...args) => {
      const c = await amqp.connect(...args);
      conns.push(c);
      return c;
    },
  };
  const a = await connect(server.url, { amqplib, onError: () => {} });
  others.push(a);
  const q = a.queue('lossy');
  const w = work(q, fast, () => {});
  const due = Date.now() + 4000;
  await q.enqueue('held', '', { delayMs: 4000 }); // hold.L2
  await until('the mover to hold it', async () => (await depth(holdName(2))) === 0);
  conns.at(-1).connection.stream.destroy(new Error('a crash')); // (amqplib notices a socket's error or end, not its close)
  await until('the job', () => w.outcomes.length === 1, 60_000);
  assert.ok(conns.length >= 2, 'reconnected');
  assert.deepEqual(w.runs.map((r) => r.job.id), ['held']);
  assert.ok(w.runs[0].at >= due, `ran ${due - w.runs[0].at} ms early`);

  // Two workers' movers (two connections): the one holding it stops, the other moves it.
  const due2 = Date.now() + 4000;
  await q.enqueue('again', '', { delayMs: 4000 });
  await until("a's mover to hold it", async () => (await depth(holdName(2))) === 0);
  const b = await connect(server.url, { onError: () => {} });
  others.push(b);
  const w2 = work(b.queue('lossy'), fast, () => {});
  await w.stop(); // a's mover returns it to hold.L2
  await until('the second job', () => w.outcomes.length + w2.outcomes.length === 2, 60_000);
  await w2.stop();
  const ran = [...w.runs, ...w2.runs].filter((r) => r.job.id === 'again');
  assert.equal(ran.length, 1);
  assert.ok(ran[0].at >= due2, `ran ${due2 - ran[0].at} ms early`);
  await a.close();
  await b.close();
});

test('a move the broker returns (no route: no work queue, no DLQ) is dead-lettered to backstop.unroutable at once', LIMIT, async () => {
  const b = await connect(server.url, { onError: () => {} });
  others.push(b);
  await b.queue('elsewhere').declare(); // the levels too
  const w = work(b.queue('elsewhere'), fast, () => {});
  const now = Date.now();
  // Due now, for a queue that does not exist: hold.L0 and straight on.
  await publishRaw(raw, levelName(0), delayRoutingKey(1), 'g', {
    messageId: 'ghost',
    headers: { 'backstop-attempt': '1', 'backstop-first-enqueued-ms': String(now), 'backstop-due-ms': String(now), 'backstop-destination': 'ghost' },
  });
  await until('the dead letter', async () => (await depth('backstop.unroutable')) === 1);
  await w.stop();
  const ch = await raw.createChannel();
  const msg = await ch.get('backstop.unroutable', { noAck: true });
  await ch.close();
  assert.equal(msg.properties.messageId, 'ghost');
  assert.equal(msg.properties.headers['backstop-reason'], 'unroutable');
  assert.equal(msg.properties.headers['backstop-error'], 'no route to queue "ghost": it was deleted or never declared');
  assert.equal(msg.properties.headers['backstop-destination'], 'ghost');
  await b.close();
});
