// The shared RabbitMQ cases (testdata/rabbitmq/cases.json, see its README)
// replayed through the Node.js worker against a real rabbitmq-server: each
// case's delivery handled by work() (or its dead letters replayed), then the
// work queue, the DLQ, the delay levels and the counters compared with what
// the Go worker left.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, test } from 'node:test';
import amqp from 'amqplib';
import promClient from 'prom-client';
import { createMetrics, loadPolicy } from '../index.js';
import { errorText } from '../lib/outcome.js';
import { connect, holdName } from '../lib/rabbitmq.js';
import { tableSize } from '../lib/rabbitmq/message.js';
import { canonical, caseError, classify, deadlineError, FIELDS, timesAsOffsets } from '../test-support/cases.js';
import { publishFrames } from '../test-support/amqp-frames.js';
import { until } from '../test-support/eventually.js';
import { startRabbit } from '../test-support/rabbitmq-server.js';

// A hang fails its test instead of the run (a worker that never stops).
const LIMIT = { timeout: 180_000 };

const FILE = JSON.parse(
  readFileSync(process.env.BACKSTOP_RABBITMQ_CASES ?? new URL('../../../testdata/rabbitmq/cases.json', import.meta.url), 'utf8'),
);
const NOW = /\{now([+-][0-9]+)?\}/g;
// The hold levels (hold.L0..L10), the words of a delay's routing key (18
// bits) and the longest delay routed (s).
const LEVELS = Array.from({ length: 11 }, (_, n) => holdName(n));
const KEY_WORDS = 18;
const MAX_ROUTED = 2 ** 11 - 1;
// A `deadline` case's handler overruns the worker's deadline (50 ms, as
// Go's replay); the text the worker writes for it is {deadline_error} in
// the cases.
const DEADLINE_MS = 50;
const DEADLINE_TEXT = errorText(await deadlineError(DEADLINE_MS));
// work() without the delay mover (as Go's WithoutMover): the cases look at what the levels hold.
const NO_MOVER = Symbol.for('backstop-policy/rabbitmq without mover');

let server;
let broker;
let conn; // the harness's own connection
let ch; // its confirm channel
let policy;
before(async () => {
  server = await startRabbit();
  broker = await connect(server.url, { onError: () => {} });
  conn = await amqp.connect(server.url);
  ch = await conn.createConfirmChannel();
  policy = await loadPolicy(FILE.policy);
});
after(async () => {
  policy?.close();
  await conn?.close().catch(() => {});
  await broker?.close();
  await server?.stop();
});

// -- messages as the README writes them ---------------------------------------------

// A header value of the cases' JSON as amqplib publishes it.
function toAmqp(v) {
  if (v === null || typeof v !== 'object') return v;
  const [[type, x]] = Object.entries(v);
  switch (type) {
    case 'int':
      return { '!': 'long', value: x };
    case 'float':
      return { '!': 'double', value: x };
    case 'bytes':
      return Buffer.from(x, 'base64');
    case 'timestamp':
      return { '!': 'timestamp', value: x };
    case 'table':
      return Object.fromEntries(Object.entries(x).map(([k, y]) => [k, toAmqp(y)]));
    case 'array':
      return x.map(toAmqp);
  }
  throw new Error(`header value type ${type}: unknown`);
}

// A header value as amqplib decodes it, in the cases' JSON.
function fromAmqp(v) {
  if (v === null || typeof v === 'string' || typeof v === 'boolean') return v;
  if (typeof v === 'number') return Number.isInteger(v) ? { int: String(v) } : { float: v };
  if (Buffer.isBuffer(v)) return { bytes: v.toString('base64') };
  if (Array.isArray(v)) return { array: v.map(fromAmqp) };
  if (v['!'] === 'timestamp') return { timestamp: v.value };
  if (v['!'] === 'decimal') return { decimal: `${v.value.digits}/${v.value.places}` };
  return { table: Object.fromEntries(Object.entries(v).map(([k, y]) => [k, fromAmqp(y)])) };
}

const PROPS = [['message_id', 'messageId'], ['content_type', 'contentType'], ['content_encoding', 'contentEncoding'],
  ['correlation_id', 'correlationId'], ['type', 'type'], ['app_id', 'appId'], ['delivery_mode', 'deliveryMode'], ['priority', 'priority']];

function publishArgs(m) {
  const props = {};
  for (const [k, p] of PROPS) if (m[k] !== undefined) props[p] = m[k];
  // timestamp (unix seconds) is read, never written (as Go's): a publish's own would not normalise.
  if (m.timestamp !== undefined) props.timestamp = m.timestamp;
  if (m.headers) props.headers = Object.fromEntries(Object.entries(m.headers).map(([k, v]) => [k, toAmqp(v)]));
  const body = m.body_base64 !== undefined ? Buffer.from(m.body_base64, 'base64') : Buffer.from(m.body ?? '', 'utf8');
  return { body, props };
}

function encodeMessage(msg) {
  const m = {};
  const p = msg.properties;
  for (const [k, prop] of PROPS) {
    const v = p[prop];
    if (v !== undefined && v !== '' && v !== 0) m[k] = v;
  }
  const h = {};
  for (const [k, v] of Object.entries(p.headers ?? {})) if (k !== 'x-delivery-count') h[k] = fromAmqp(v);
  if (Object.keys(h).length > 0) m.headers = h;
  const text = new TextDecoder('utf-8', { fatal: true });
  try {
    m.body = text.decode(msg.content);
  } catch {
    m.body_base64 = msg.content.toString('base64');
  }
  return m;
}

function publish(queue, m) {
  const { body, props } = publishArgs(m);
  // Headers over amqplib's 64 KiB buffer (the bounds/* cases): the frames by hand.
  if (tableSize(props.headers) > 65536) return publishFrames(conn, queue, props, body);
  return new Promise((resolve, reject) => ch.publish('', queue, body, props, (err) => (err ? reject(err) : resolve())));
}

async function drain(queue) {
  const out = [];
  for (;;) {
    const msg = await ch.get(queue, { noAck: true });
    if (msg === false) return out;
    out.push(msg);
  }
}

// By message_id, then by the JSON (as Go sorts them).
const sortBy = (list, msgOf) =>
  list
    .map((v) => [`${msgOf(v).message_id ?? ''}\u0000${JSON.stringify(v)}`, v])
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([, v]) => v);

// -- the counters: every counter sample not 0, histograms by _count and _sum ---------

async function counters(registry) {
  const out = {};
  const labels = (l) => {
    const parts = Object.entries(l).filter(([k]) => k !== 'le').map(([k, v]) => `${k}=${JSON.stringify(String(v))}`).sort();
    return parts.length === 0 ? '' : `{${parts.join(',')}}`;
  };
  for (const m of await registry.getMetricsAsJSON()) {
    if (m.type === 'counter') {
      for (const v of m.values) if (v.value !== 0) out[m.name + labels(v.labels)] = v.value;
    } else if (m.type === 'histogram' && !m.name.endsWith('_seconds')) {
      for (const v of m.values) {
        if (v.metricName === `${m.name}_count` && v.value !== 0) out[`${m.name}_count${labels(v.labels)}`] = v.value;
      }
      for (const v of m.values) {
        const count = out[`${m.name}_count${labels(v.labels)}`];
        if (v.metricName === `${m.name}_sum` && count !== undefined) out[`${m.name}_sum${labels(v.labels)}`] = v.value;
      }
    }
  }
  return out;
}

// -- one case -------------------------------------------------------------------------

// The policy, reporting the failure it was asked about and its decision
// (the outcome's: a retry, else a dead letter with its reason); with
// refuse, its breaker refuses every job.
function spy(refuse) {
  const s = {
    asked: null,
    decision: null,
    outcome(e) {
      if (e.event === 'before' && refuse) {
        return { action: 'defer', reason: 'circuit_open', delayMs: refuse.retry_in_ms, pause: true, count: 'refused', invalid: false };
      }
      const o = policy.outcome(e);
      if (e.event !== 'failure') return o;
      s.asked = { attempt: e.attempt };
      for (const [k, f2] of [...FIELDS, ['prev_delay_ms', 'prevDelayMs']]) if (e[f2]) s.asked[k] = e[f2];
      s.decision = { action: o.action === 'retry' ? 'retry' : 'dead_letter', reason: o.reason };
      if (o.action === 'retry') s.decision.delay_ms = o.delayMs;
      return o;
    },
  };
  return s;
}

async function anyReady(queues) {
  for (const name of queues) if ((await ch.checkQueue(name)).messageCount > 0) return true;
  return false;
}

// Whether key and level are those of a message delayed again for the rest of
// due by a worker that reached it between base and end: a delay of s seconds
// with ceil((due - end) / 1000) <= s <= ceil((due - base) / 1000) (at most
// MAX_ROUTED), level its highest set bit. How late the worker was changes the key, so the cases
// write it "{due}" (see the README).
function dueKeyFits(key, level, due, base, end) {
  const words = key.split('.');
  if (!/^[0-9]{13}$/.test(due) || words.length !== KEY_WORDS || words.some((w) => w !== '0' && w !== '1')) return false;
  const s = parseInt(words.join(''), 2);
  const rest = (at) => Math.min(Math.ceil((Number(due) - at) / 1000), MAX_ROUTED);
  return s > 0 && rest(end) <= s && s <= rest(base) && level === holdName(31 - Math.clz32(s));
}

// lateMs backdates the case's clock, as if the worker reached the delivery
// that much after the case started.
async function run(c, { lateMs = 0 } = {}) {
  const name = FILE.queue;
  for (const q of [name, `${name}.dlq`]) await ch.deleteQueue(q);
  for (const x of [`${name}.delay`, `${name}.due`]) await ch.deleteExchange(x);
  const q = broker.queue(name, { maxDeliveries: FILE.max_deliveries });
  await q.declare();
  for (const l of LEVELS) await ch.purgeQueue(l);

  const base = Date.now() - lateMs;
  const known = new Set([0]);
  const resolve = (m) =>
    JSON.parse(JSON.stringify(m).replace(NOW, (_, off) => {
      known.add(Number(off ?? 0));
      return String(base + Number(off ?? 0));
    }));
  for (const m of c.dlq ?? []) await publish(`${name}.dlq`, resolve(m));
  // The delivery's own due time: a re-delay for the rest of it keeps it.
  let ownDue;
  if (c.delivery) {
    const m = resolve(c.delivery.message);
    ownDue = m.headers?.['backstop-due-ms'];
    await publish(name, m);
    for (let i = 0; i < (c.delivery.returns ?? 0); i++) {
      const msg = await until('the delivery to return', async () => ch.get(name, { noAck: false }), 10_000);
      ch.nack(msg, false, true);
    }
  }

  let reply;
  const registry = new promClient.Registry();
  const ev = c.event;
  if (ev.type === 'handle') {
    const s = spy(ev.refuse);
    if (ev.refuse) known.add(ev.refuse.retry_in_ms);
    let ran = false;
    const ac = new AbortController();
    const done = q.work(s, () => {
      ran = true;
      if (ev.deadline) return new Promise(() => {}); // past the deadline: the worker's timer ends the attempt
      if (ev.error) throw caseError(ev.error);
    }, {
      signal: ac.signal, prefetch: 1, classify, onError: () => {}, [NO_MOVER]: true, handlerTimeoutMs: ev.deadline ? DEADLINE_MS : undefined,
      metrics: createMetrics(promClient, { policy: 'cases', target: name, registry }),
    });
    await until(`case ${c.name}: the worker to deal with the delivery`, async () => ran || anyReady([`${name}.dlq`, ...LEVELS]), 20_000);
    ac.abort();
    await done;
    reply = { ran };
    if (s.asked !== null) {
      reply.failure = s.asked;
      reply.decision = s.decision;
      if (s.decision.delay_ms !== undefined) known.add(s.decision.delay_ms);
    }
  } else if (ev.type === 'replay') {
    try {
      reply = { replayed: await q.replay({ limit: ev.limit ?? 0, reason: ev.reason ?? '', keepAttempts: ev.keep_attempts ?? false }) };
    } catch (err) {
      if (!(err instanceof TypeError)) throw err;
      reply = { refused: true };
    }
  } else {
    throw new Error(`case ${c.name}: event type ${ev.type} unknown`);
  }
  const end = Date.now();

  const state = { reply };
  state.work = sortBy((await drain(name)).map(encodeMessage), (m) => m);
  state.dlq = sortBy((await drain(`${name}.dlq`)).map(encodeMessage), (m) => m);
  const delayed = [];
  for (const l of LEVELS) {
    for (const msg of await drain(l)) {
      const entry = { queue: l, routing_key: msg.fields.routingKey, message: encodeMessage(msg) };
      const due = msg.properties.headers?.['backstop-due-ms'];
      if (typeof due === 'string' && due === ownDue && dueKeyFits(entry.routing_key, l, due, base, end)) {
        entry.queue = '{due}';
        entry.routing_key = '{due}';
      }
      delayed.push(entry);
    }
  }
  state.delayed = sortBy(delayed, (v) => v.message);
  state.counters = await counters(registry);
  // An adopted message's id is random (README, step 5), written before the times are.
  const adopted = canonical(state).replaceAll(DEADLINE_TEXT, '{deadline_error}').replace(/amqp-[0-9a-f]{32}/g, '{adopted_id}');
  return JSON.parse(timesAsOffsets(adopted, base, end, known));
}

test('the shared RabbitMQ cases', LIMIT, async (t) => {
  assert.ok(FILE.cases.length > 0);
  for (const c of FILE.cases) {
    await t.test(c.name, async () => {
      assert.deepStrictEqual(await run(c), JSON.parse(canonical(c.expect)));
    });
  }
  // The early cases again, the worker reaching the delivery more than a
  // second late (a loaded machine): the remainder it re-delays for is a
  // second shorter, and the case must still hold.
  for (const c of FILE.cases.filter((x) => x.name.startsWith('early/'))) {
    await t.test(`${c.name}, worker 1.5 s late`, async () => {
      assert.deepStrictEqual(await run(c, { lateMs: 1500 }), JSON.parse(canonical(c.expect)));
    });
  }
});
