// backstop-policy/rabbitmq against a real rabbitmq-server (one private broker
// for this file, test-support/rabbitmq-server.js): the topology, the moves
// of queue/rabbitmq/README.md, malformed messages, crash loops, early
// re-delay, deferral, replay to the original queue only, metrics and
// graceful shutdown. Restarts are in rabbitmq-restart.test.js.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import amqp from 'amqplib';
import promClient from 'prom-client';
import { createMetrics, loadPolicy } from '../index.js';
import { connect, delayRoutingKey, holdName, levelName } from '../lib/rabbitmq.js';
import { until } from '../test-support/eventually.js';
import { startRabbit } from '../test-support/rabbitmq-server.js';

// A hang fails its test instead of the run (a worker that never stops).
const LIMIT = { timeout: 180_000 };

let server;
let broker;
let raw; // a plain amqplib connection, to look and to publish what the library would not
const policies = {};

before(async () => {
  server = await startRabbit();
  broker = await connect(server.url, { onError: () => {} });
  raw = await amqp.connect(server.url);
  const constant = (base) => ({ strategy: 'constant', base, cap: base });
  policies.fast = await loadPolicy({ max_attempts: 3, backoff: constant('1ms'), jitter: { mode: 'none' } });
  policies.second = await loadPolicy({ max_attempts: 3, backoff: constant('1s'), jitter: { mode: 'none' } });
});

after(async () => {
  await raw?.close().catch(() => {});
  await broker?.close();
  await server?.stop();
});

const refused = () => Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' });
const permanent = () => Object.assign(new Error('bad input'), { status: 400 });

// Runs q's worker; returns {outcomes, seen, stop()}.
function work(q, policy, handler, options = {}) {
  const ac = new AbortController();
  const outcomes = [];
  const seen = [];
  const done = q.work(policy, async (job, ctx) => {
    seen.push(job);
    return handler(job, ctx);
  }, { signal: ac.signal, onError: () => {}, onOutcome: (o, job) => outcomes.push({ ...o, job }), ...options });
  return {
    outcomes,
    seen,
    done,
    stop: async () => {
      ac.abort();
      await done;
    },
  };
}

async function depth(name) {
  const ch = await raw.createChannel();
  try {
    return (await ch.checkQueue(name)).messageCount;
  } finally {
    await ch.close();
  }
}

// Publishes a message as another client might, straight to queue.
async function publishRaw(queue, body, props) {
  const ch = await raw.createConfirmChannel();
  try {
    await new Promise((resolve, reject) =>
      ch.publish('', queue, Buffer.from(body), { persistent: true, ...props }, (err) => (err ? reject(err) : resolve())));
  } finally {
    await ch.close();
  }
}

test('delayRoutingKey: whole seconds rounded up (at most 2^11 - 1), 18 bits, most significant first', LIMIT, () => {
  assert.equal(delayRoutingKey(0), Array(18).fill('0').join('.'));
  assert.equal(delayRoutingKey(1), `${Array(17).fill('0').join('.')}.1`);
  assert.equal(delayRoutingKey(10_000), '0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.1.0');
  assert.equal(delayRoutingKey(10_001), '0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.1.1');
  assert.equal(delayRoutingKey(2_047_000), `${Array(7).fill('0').join('.')}.${Array(11).fill('1').join('.')}`);
  assert.equal(delayRoutingKey(2 ** 40), delayRoutingKey(2_047_000)); // the cap: arrives early, delayed again for the rest
  assert.throws(() => delayRoutingKey(-1), /`delayMs`/);
});

test('declare makes the topology, idempotently; other arguments on Q are refused naming the queue', LIMIT, async () => {
  const q = broker.queue('topo', { maxDeliveries: 3 });
  await q.declare();
  await q.declare();
  const ch = await raw.createChannel();
  for (const name of ['topo', 'topo.dlq', holdName(0), holdName(10), levelName(0), levelName(17)]) await ch.checkQueue(name);
  for (const name of ['topo.delay', 'topo.due', 'backstop.delay.deliver', levelName(0), levelName(17)]) await ch.checkExchange(name);
  await ch.close();
  // The same queue with another delivery limit: the broker refuses it.
  await assert.rejects(broker.queue('topo', { maxDeliveries: 4 }).declare(), /rabbitmq queue topo: declare: .*PRECONDITION_FAILED/);
  // A worker cannot mend that: work() rejects instead of retrying.
  await assert.rejects(broker.queue('topo', { maxDeliveries: 4 }).work(policies.fast, () => {}, { onError: () => {} }), /PRECONDITION_FAILED/);
  assert.throws(() => broker.queue('q', { maxDeliveries: 0 }), /`maxDeliveries`/);
  assert.throws(() => broker.queue(''), /`name`/);
});

test('a success is acked once; the job carries id, attempt, payload and job type', LIMIT, async () => {
  const q = broker.queue('ok');
  await q.enqueue('job-1', Buffer.from([0, 255, 1]), { jobType: 'send_email', contentType: 'application/octet-stream' });
  const w = work(q, policies.fast, () => {});
  await until('the outcome', () => w.outcomes.length === 1);
  await w.stop();
  const [job] = w.seen;
  assert.equal(job.id, 'job-1');
  assert.equal(job.attempt, 1);
  assert.deepEqual([...job.payload], [0, 255, 1]);
  assert.equal(job.jobType, 'send_email');
  assert.equal(job.contentType, 'application/octet-stream');
  assert.ok(job.firstEnqueuedMs > 0);
  assert.equal(w.outcomes[0].action, 'ack');
  assert.deepEqual(await q.stats(), { ready: 0, consumers: 0, dlq: 0, delayLevels: 0 });
});

test('a retry goes through the delay levels: attempt + 1, last reason and error, never early', LIMIT, async () => {
  const q = broker.queue('retry');
  await q.enqueue('job-r', 'p', { jobType: 't' });
  const w = work(q, policies.second, (job) => {
    if (job.attempt === 1) throw refused();
  });
  await until('the second attempt', () => w.outcomes.length === 2);
  await w.stop();
  const [first, second] = w.seen;
  assert.equal(w.outcomes[0].action, 'retry');
  assert.equal(w.outcomes[0].reason, 'transient');
  assert.equal(second.attempt, 2);
  assert.equal(second.id, 'job-r');
  assert.equal(second.jobType, 't');
  assert.equal(second.payload.toString(), 'p');
  assert.equal(second.lastReason, 'transient');
  assert.match(second.lastError, /ECONNREFUSED/);
  assert.equal(second.prevDelayMs, 1000);
  assert.equal(second.firstEnqueuedMs, first.firstEnqueuedMs);
  assert.ok(second.dueMs !== null && second.dueMs >= first.firstEnqueuedMs + 1000);
  assert.equal(w.outcomes[1].action, 'ack');
});

test('a permanent error and max attempts dead-letter with the reason, the error and the attempt; inspect peeks', LIMIT, async () => {
  const q = broker.queue('dead');
  await q.enqueue('perm', 'a');
  await q.enqueue('max', 'b', { jobType: 'x' });
  const w = work(q, policies.fast, (job) => {
    throw job.id === 'perm' ? permanent() : refused();
  }, { prefetch: 1 });
  await until('both dead-lettered', () => w.outcomes.filter((o) => o.action === 'dead_letter').length === 2);
  await w.stop();
  const dls = await q.inspect(10);
  assert.equal(dls.length, 2);
  const byId = Object.fromEntries(dls.map((d) => [d.id, d]));
  assert.equal(byId.perm.reason, 'permanent_error');
  assert.equal(byId.perm.attempt, 1);
  assert.match(byId.perm.error, /bad input/);
  assert.equal(byId.max.reason, 'max_attempts_reached');
  assert.equal(byId.max.attempt, 3);
  assert.equal(byId.max.jobType, 'x');
  assert.equal(byId.max.payload.toString(), 'b');
  assert.equal(byId.max.destination, 'dead');
  assert.ok(byId.max.deadLetteredMs >= byId.max.firstEnqueuedMs);
  // A peek: both are still there. The broker counts a message the peek
  // handed back (nack, requeue) only once it is ready again: wait for it.
  await until('both dead letters back in the count', async () => (await q.stats()).dlq === 2);
  assert.equal((await q.inspect(1)).length, 1);
});

test('malformed messages are dead-lettered with reason malformed, headers and body kept, never run', LIMIT, async () => {
  const q = broker.queue('bad');
  await q.declare();
  const now = String(Date.now());
  await publishRaw('bad', 'no id', { headers: { 'backstop-attempt': '1', 'backstop-first-enqueued-ms': now } });
  await publishRaw('bad', 'garbage attempt', { messageId: 'g', headers: { 'backstop-attempt': 'abc', 'backstop-first-enqueued-ms': now, keep: 'me' } });
  await publishRaw('bad', 'zero attempt', { messageId: 'z', headers: { 'backstop-attempt': '0', 'backstop-first-enqueued-ms': now } });
  await publishRaw('bad', 'no first', { messageId: 'f', headers: { 'backstop-attempt': '1' } });
  // An AMQP integer is as good as a string of digits.
  await publishRaw('bad', 'integers', { messageId: 'i', headers: { 'backstop-attempt': 1, 'backstop-first-enqueued-ms': Date.now() } });
  const w = work(q, policies.fast, () => {});
  await until('five outcomes', () => w.outcomes.length === 5);
  await w.stop();
  assert.deepEqual(w.seen.map((j) => j.id), ['i']);
  const dls = await q.inspect(10);
  assert.deepEqual(dls.map((d) => d.payload.toString()).sort(), ['garbage attempt', 'no first', 'no id', 'zero attempt']);
  for (const d of dls) {
    assert.equal(d.reason, 'malformed');
    assert.equal(d.error, 'malformed message: needs message_id, backstop-attempt >= 1 and backstop-first-enqueued-ms');
  }
  const g = dls.find((d) => d.id === 'g');
  assert.equal(g.headers.keep, 'me');
  assert.equal(g.headers['backstop-attempt'], 'abc');
});

test('a message delivered maxDeliveries times without an outcome is dead-lettered crash_loop, not run', LIMIT, async () => {
  const q = broker.queue('crash', { maxDeliveries: 3 });
  await q.enqueue('poison', 'p');
  // Three consumers that die holding it (a channel closed without an ack).
  // It is alone in the queue: where the broker puts a returned message
  // among others is not promised, so with another one there a consumer
  // could get that one instead (and its x-delivery-count would grow).
  for (let i = 0; i < 3; i++) {
    const ch = await raw.createChannel();
    await ch.prefetch(1);
    const got = await new Promise((resolve) => ch.consume('crash', (msg) => resolve(msg), { noAck: false }));
    assert.equal(got.properties.messageId, 'poison');
    await ch.close();
  }
  await q.enqueue('fine', 'f'); // in the queue with the crash loop: the worker is not blocked by it
  const w = work(q, policies.fast, () => {}, { prefetch: 1 });
  await until('two outcomes', () => w.outcomes.length === 2);
  await w.stop();
  assert.deepEqual(w.seen.map((j) => j.id), ['fine']); // not blocked, and the poison never ran
  const [dl] = await q.inspect(5);
  assert.equal(dl.id, 'poison');
  assert.equal(dl.reason, 'crash_loop');
  assert.equal(dl.error, 'crash loop: delivered 4 times without an outcome (max deliveries 3)');
});

test("the broker's x-delivery-limit dead-letters a crash loop no worker could; inspect names it crash_loop", LIMIT, async () => {
  const q = broker.queue('limit', { maxDeliveries: 1 }); // x-delivery-limit 3
  await q.enqueue('poison', 'p');
  const ch = await raw.createChannel();
  let deliveries = 0;
  await ch.consume('limit', (msg) => {
    deliveries++;
    ch.nack(msg, false, true);
  }, { noAck: false });
  await until('the broker to dead-letter it', async () => (await q.stats()).dlq === 1);
  await ch.close();
  assert.ok(deliveries >= 3, `deliveries ${deliveries}`);
  const [dl] = await q.inspect(1);
  assert.equal(dl.id, 'poison');
  assert.equal(dl.reason, 'crash_loop');
  assert.equal(await q.replay({ reason: 'crash_loop' }), 1);
  assert.equal(await depth('limit'), 1);
});

test('a message that arrives before its due time is delayed again for the rest, its attempt unchanged', LIMIT, async () => {
  const q = broker.queue('early');
  await q.declare();
  const due = Date.now() + 2500;
  await publishRaw('early', 'e', {
    messageId: 'early-1',
    headers: { 'backstop-attempt': '2', 'backstop-first-enqueued-ms': String(Date.now()), 'backstop-due-ms': String(due), 'backstop-destination': 'early' },
  });
  let ranAt = 0;
  const w = work(q, policies.fast, () => {
    ranAt = Date.now();
  });
  await until('the job to run', () => w.outcomes.length === 1);
  await w.stop();
  assert.ok(ranAt >= due, `ran ${due - ranAt} ms early`);
  assert.equal(w.seen.length, 1);
  assert.equal(w.seen[0].attempt, 2);
});

test('a short delay is not held behind a long one (no head-of-line blocking)', LIMIT, async () => {
  const q = broker.queue('hol');
  await q.declare();
  const ch = await raw.createConfirmChannel();
  const now = Date.now();
  for (const [id, ms] of [['hour', 3_600_000], ['two', 2000]]) {
    await new Promise((resolve, reject) => ch.publish('hol.delay', delayRoutingKey(ms), Buffer.from(id), {
      messageId: id, persistent: true,
      headers: { 'backstop-attempt': '1', 'backstop-first-enqueued-ms': String(now), 'backstop-due-ms': String(now + ms), 'backstop-destination': 'hol' },
    }, (err) => (err ? reject(err) : resolve())));
  }
  await ch.close();
  const w = work(q, policies.fast, () => {});
  await until('the 2 s job', () => w.outcomes.length === 1);
  await w.stop();
  assert.deepEqual(w.seen.map((j) => j.id), ['two']);
  assert.ok(Date.now() >= now + 2000);
});

test('an open breaker: the job that opened it is deferred, no job starts until it may half-open, no attempt spent', LIMIT, async () => {
  const policy = await loadPolicy({
    max_attempts: 3, backoff: { strategy: 'constant', base: '1ms', cap: '1ms' }, jitter: { mode: 'none' },
    circuit_breaker: { failure_threshold: 1, open_for: '1s' },
  });
  const q = broker.queue('breaker');
  await q.enqueue('a', '');
  let openedAt = 0;
  const runs = [];
  const w = work(q, policy, (job) => {
    runs.push({ id: job.id, attempt: job.attempt, lastReason: job.lastReason, at: Date.now() });
    if (openedAt === 0) {
      openedAt = Date.now();
      throw refused(); // opens the breaker
    }
  }, { prefetch: 2 });
  await until('a to fail', () => w.outcomes.length === 1);
  await q.enqueue('b', '');
  await until('both acked', () => w.outcomes.filter((o) => o.action === 'ack').length === 2);
  await w.stop();
  assert.deepEqual(w.outcomes.map((o) => `${o.job.id} ${o.action} ${o.reason}`).slice(0, 1), ['a defer circuit_open']);
  const a2 = runs.find((r) => r.id === 'a' && r !== runs[0]);
  assert.equal(a2.attempt, 1); // the deferral spent no attempt
  assert.equal(a2.lastReason, 'circuit_open');
  const b = runs.filter((r) => r.id === 'b');
  assert.equal(b.length, 1);
  assert.equal(b[0].attempt, 1);
  // b arrived while the breaker was open: it did not start before it could half-open.
  assert.ok(b[0].at >= openedAt + 1000, `b started ${openedAt + 1000 - b[0].at} ms before the breaker could half-open`);
});

test('replay moves at most limit dead letters of a reason to the original queue only', LIMIT, async () => {
  const q = broker.queue('rep');
  await q.declare();
  // Another consumer's queue on a shared topic exchange that also feeds rep:
  // a replay must reach neither through it.
  const ch = await raw.createChannel();
  await ch.assertExchange('rep.topic', 'topic', { durable: false, autoDelete: true });
  await ch.assertQueue('rep.other', { exclusive: true });
  await ch.bindQueue('rep.other', 'rep.topic', '#');
  await ch.bindQueue('rep', 'rep.topic', '#');
  const dl = (id, reason, attempt) => publishRaw('rep.dlq', id, {
    messageId: id,
    headers: {
      'backstop-attempt': String(attempt), 'backstop-first-enqueued-ms': '1000', 'backstop-destination': 'rep',
      'backstop-reason': reason, 'backstop-error': 'e', 'backstop-dead-lettered-ms': '2000',
    },
  });
  for (let i = 0; i < 5; i++) await dl(`p${i}`, 'permanent_error', 3);
  await dl('m0', 'max_attempts_reached', 5);
  await publishRaw('rep.dlq', 'anonymous', { headers: { 'backstop-reason': 'permanent_error' } }); // no id: stays
  assert.equal(await q.replay({ limit: 2, reason: 'permanent_error', actor: 'ann@ops1' }), 2);
  // Each recorded first in rep.audit with the actor, as Go's replay (issue 46).
  for (let i = 0; i < 2; i++) {
    const rec = await ch.get('rep.audit', { noAck: true });
    assert.ok(rec, 'an audit record');
    assert.equal(rec.content.length, 0);
    assert.match(rec.properties.messageId, /^p\d$/);
    const h = rec.properties.headers;
    assert.deepEqual([String(h['backstop-audit-action']), String(h['backstop-audit-actor']), String(h['backstop-reason'])],
      ['replay', 'ann@ops1', 'permanent_error']);
  }
  assert.equal(await ch.get('rep.audit', { noAck: true }), false);
  await assert.rejects(q.replay({ limit: 1, actor: 'x'.repeat(257) }), { name: 'TypeError', message: /actor/ });
  assert.equal(await depth('rep'), 2);
  assert.equal(await depth('rep.other'), 0);
  assert.equal((await q.stats()).dlq, 5);
  assert.equal(await q.replay({ limit: 1, reason: 'max_attempts_reached', keepAttempts: true }), 1);
  assert.equal(await q.replay({ limit: 100, reason: 'permanent_error' }), 3);
  const left = await q.inspect(10);
  assert.deepEqual(left.map((d) => d.id), ['']);
  const w = work(q, policies.fast, () => {});
  await until('six jobs', () => w.outcomes.length === 6);
  await w.stop();
  const m0 = w.seen.find((j) => j.id === 'm0');
  assert.equal(m0.attempt, 5); // kept
  assert.equal(m0.firstEnqueuedMs, 1000);
  assert.equal(m0.lastReason, 'max_attempts_reached');
  const p0 = w.seen.find((j) => j.id === 'p0');
  assert.equal(p0.attempt, 1); // afresh
  assert.ok(p0.firstEnqueuedMs > 2000);
  assert.equal(p0.lastReason, 'permanent_error');
  assert.equal(await depth('rep.other'), 0);
  await ch.close();
  await assert.rejects(q.replay({ limit: 0 }), /`limit`/);
});

test('metrics: the backstop_client_* families and the queue families, with queue and job_type', LIMIT, async () => {
  const registry = new promClient.Registry();
  const metrics = createMetrics(promClient, { policy: 'p', target: 'met', registry });
  const q = broker.queue('met');
  await q.enqueue('s', '', { jobType: 'send_email' });
  await q.enqueue('r', '', { jobType: 'send_email' });
  await q.enqueue('d', '');
  const w = work(q, policies.fast, (job) => {
    if (job.id === 'r' && job.attempt === 1) throw refused();
    if (job.id === 'd') throw permanent();
  }, { metrics });
  await until('four outcomes', () => w.outcomes.length === 4);
  await w.stop();
  const text = await registry.metrics();
  const has = (line) => assert.ok(text.includes(line), `missing ${line} in\n${text}`);
  has('backstop_attempts_total{queue="met",job_type="send_email",outcome="success"} 2');
  has('backstop_attempts_total{queue="met",job_type="send_email",outcome="retry"} 1');
  has('backstop_retries_total{queue="met",job_type="send_email",reason="transient"} 1');
  has('backstop_dead_letters_total{queue="met",job_type="",reason="permanent_error"} 1');
  has('backstop_job_attempts_bucket{le="1",queue="met",job_type="send_email",outcome="success"} 1');
  has('backstop_job_attempts_bucket{le="2",queue="met",job_type="send_email",outcome="success"} 2');
  has('backstop_client_attempts_total{policy="p",target="met",outcome="success"} 2');
  has('backstop_client_attempts_total{policy="p",target="met",outcome="dead_letter"} 1');
  await assert.rejects(q.work(policies.fast, () => {}, { metrics: createMetrics(promClient, { policy: 'p', target: 'other', registry }) }), /`metrics` to have target "met"/);
});

test('graceful shutdown: work() resolves after the job in hand finished and was acked, and takes no other', LIMIT, async () => {
  const q = broker.queue('graceful');
  await q.enqueue('slow', '');
  await q.enqueue('next', '');
  let release;
  const gate = new Promise((resolve) => {
    release = resolve;
  });
  const events = [];
  const w = work(q, policies.fast, async (job) => {
    events.push(`start ${job.id}`);
    await gate;
    events.push(`end ${job.id}`);
  }, { prefetch: 1 });
  await until('the handler to start', () => events.length === 1);
  const stopping = w.stop().then(() => events.push('stopped'));
  release();
  await stopping;
  assert.deepEqual(events, ['start slow', 'end slow', 'stopped']);
  assert.equal(w.outcomes.length, 1);
  assert.equal(w.outcomes[0].action, 'ack');
  // (A quorum queue counts a cancelled consumer until its deliveries are
  // acked, and its statistics lag a moment behind: waited for.)
  const { ready, consumers, dlq } = await until('the consumer gone', async () => {
    const st = await q.stats(); // (the delay levels hold other tests' messages)
    return st.consumers === 0 && st;
  });
  assert.deepEqual({ ready, consumers, dlq }, { ready: 1, consumers: 0, dlq: 0 });
});

test('a worker whose queue is deleted declares it again and goes on', LIMIT, async () => {
  const q = broker.queue('deleted');
  await q.enqueue('one', '');
  const w = work(q, policies.fast, () => {});
  await until('the first job', () => w.outcomes.length === 1);
  const ch = await raw.createChannel();
  await ch.deleteQueue('deleted');
  await ch.close();
  await until('the queue to be declared again', async () => {
    const c = await raw.createChannel();
    c.on('error', () => {});
    try {
      return (await c.checkQueue('deleted')).consumerCount === 1;
    } catch {
      return false;
    } finally {
      await c.close().catch(() => {});
    }
  });
  await q.enqueue('two', '');
  await until('the second job', () => w.outcomes.length === 2);
  await w.stop();
});

test('enqueue with delayMs: the first attempt waits in the delay levels, never early', LIMIT, async () => {
  const q = broker.queue('later');
  const before = Date.now();
  await q.enqueue('later-1', 'x', { delayMs: 1500 });
  let ranAt = 0;
  const w = work(q, policies.fast, () => {
    ranAt = Date.now();
  });
  await until('the job to run', () => w.outcomes.length === 1);
  await w.stop();
  assert.ok(ranAt >= before + 1500, `ran ${before + 1500 - ranAt} ms early`);
  assert.equal(w.seen[0].attempt, 1);
});

test('policies: a job type with its own policy is decided by it', LIMIT, async () => {
  const once = await loadPolicy({ max_attempts: 1 });
  const q = broker.queue('typed');
  await q.enqueue('plain', '', { jobType: 'plain' });
  await q.enqueue('strict', '', { jobType: 'send_email' });
  const w = work(q, policies.fast, (job) => {
    if (job.attempt === 1) throw refused();
  }, { policies: { send_email: once } });
  await until('three outcomes', () => w.outcomes.length === 3);
  await w.stop();
  const by = (id) => w.outcomes.filter((o) => o.job.id === id).map((o) => `${o.action} ${o.reason}`);
  assert.deepEqual(by('strict'), ['dead_letter max_attempts_reached']);
  assert.deepEqual(by('plain'), ['retry transient', 'ack success']);
});

test('arguments are validated with messages that name them', LIMIT, async () => {
  const q = broker.queue('args');
  await assert.rejects(q.enqueue('', 'x'), /`id`/);
  await assert.rejects(q.enqueue('a', 5), /`payload`/);
  await assert.rejects(q.work({}, () => {}), /`policy`/);
  await assert.rejects(q.work(policies.fast, () => {}, { prefetch: 0 }), /`prefetch`/);
  await assert.rejects(q.inspect(-1), /`n`/);
  await assert.rejects(q.enqueue('a', '', { jobType: 'has space' }), /`jobType` to be a job type/);
  await assert.rejects(q.enqueue('a', '', { delayMs: -1 }), /`delayMs`/);
  await assert.rejects(q.replay({ reason: 'has space' }), /`reason`/);
  await assert.rejects(q.work(policies.fast, () => {}, { policies: { 'bad type': policies.fast } }), /`policies key` to be a job type/);
  await assert.rejects(connect(''), /`url`/);
});

// What a stalled mover delivers shows in the measured retry latency (as Go's
// TestRetryLatencyShowsStalledMover): attempt 2 of a job that failed 5 s ago
// with a 10 ms delay; a job deferred since its failure (last reason
// circuit_open) is not measured.
test('a stalled mover shows in the measured retry latency, a deferred job does not', LIMIT, async () => {
  const q = broker.queue('latency');
  await q.declare();
  const due = Date.now() - 5000;
  for (const [id, reason] of [['deferred', 'circuit_open'], ['stalled', 'transient']]) {
    await publishRaw('latency', '', {
      messageId: id,
      headers: {
        'backstop-attempt': '2', 'backstop-first-enqueued-ms': String(due - 10), 'backstop-due-ms': String(due),
        'backstop-prev-delay-ms': '10', 'backstop-last-reason': reason, 'backstop-destination': 'latency',
      },
    });
  }
  const registry = new promClient.Registry();
  const metrics = createMetrics(promClient, { policy: 'payments', target: 'latency', registry });
  const w = work(q, policies.fast, () => {}, { metrics });
  await until('both jobs', () => w.outcomes.length === 2);
  await w.stop();
  const values = (await registry.getSingleMetric('backstop_client_retry_latency_seconds').get()).values;
  const count = values.find((v) => v.metricName.endsWith('_count'))?.value;
  const sum = values.find((v) => v.metricName.endsWith('_sum'))?.value;
  assert.equal(count, 1);
  assert.ok(sum >= 5, `measured latency ${sum} s; want at least the 5 s stall`);
});
