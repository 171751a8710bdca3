// backstop-policy/rabbitmq: the queue contract on RabbitMQ
// (queue/rabbitmq/README.md in the backstop repository) for Node.js workers,
// over amqplib (an optional peer dependency). The topology, the headers and
// the moves are the ones the Go and Python workers use, so they can share a
// queue; the policy decides locally (backstop.wasm, through outcome.js, as
// the Redis worker does), only the moves talk to the broker.
import { createHash } from 'node:crypto';
import { hostname } from 'node:os';
import { checkString, checkWhole, show } from './args.js';
import { checkJobType, JOB_TYPE, typedPolicies } from './jobtypes.js';
import { metricsOrigin } from './metrics.js';
import { checkPolicy, countPlan, jitter, pause, planOutcome, refusedFor, refusedPlan, runHandler } from './outcome.js';

const LEVELS = 18; // the routing key's bits; exchanges (and the first topology's TTL queues) backstop.delay.L0..L17
// backstop.hold.L0..L10: the levels a delay hops, moved by the workers'
// movers, which hold a message 2^10 s at most (under the broker's 30 min
// consumer timeout). A longer delay than 2^11 - 1 s (34 min) arrives early
// and is delayed again for the rest.
const HOLDS = 11;
const MAX_DELAY_S = 2 ** HOLDS - 1;
// A mover's deliveries in hand per level, and its pause before a move the
// broker refused (or returned) is tried again.
const MOVE_PREFETCH = 1000;
const MOVE_RETRY_MS = 10_000;
// work()'s option (test only, as Go's WithoutMover) for the shared cases,
// which look at what the levels hold: no mover.
const NO_MOVER = Symbol.for('backstop-policy/rabbitmq without mover');
const DELIVER = 'backstop.delay.deliver';
// A delayed message enters at its highest set bit's level, not L17: each
// exchange-to-exchange hop costs the publishing channel a topic match.
const ENTER = 'backstop.delay.enter';
const MAX_ATTEMPT = 1e14 - 1;
const MALFORMED = 'malformed message: needs message_id, backstop-attempt >= 1 and backstop-first-enqueued-ms';
const H = Object.freeze({
  attempt: 'backstop-attempt',
  first: 'backstop-first-enqueued-ms',
  destination: 'backstop-destination',
  lastReason: 'backstop-last-reason',
  lastError: 'backstop-last-error',
  prevDelay: 'backstop-prev-delay-ms',
  due: 'backstop-due-ms',
  jobType: 'backstop-job-type',
  reason: 'backstop-reason',
  error: 'backstop-error',
  deadLettered: 'backstop-dead-lettered-ms',
});
// Outcomes known but not acked when a channel was lost, kept per worker: at most this many.
const KEPT_MAX = 10_000;
const BACKOFF_MIN_MS = 100;
// Dead letters replay and inspect look at, at most (as Go).
const MAX_SCAN = 100_000;
// Replays published before their confirms are awaited: one round trip per batch.
const CONFIRM_BATCH = 100;
// A reason as the scripts accept it: 1..128 printable ASCII characters without spaces.
const REASON = /^[!-~]{1,128}$/;
const BACKOFF_MAX_MS = 5000;
// A handler's deadline by default: well under the broker's consumer_timeout
// (30 min by default), past which it closes the channel of an unacked delivery.
const HANDLER_TIMEOUT_MS = 5 * 60_000;

/** The name of delay level n (0..17): a topic exchange and the first topology's TTL queue. */
export function levelName(n) {
  return `backstop.delay.L${n}`;
}

/** The queue of delay level n (0..10) the movers hold messages from. */
export function holdName(n) {
  return `backstop.hold.L${n}`;
}

/**
 * The routing key of a delay: its whole seconds (rounded up, at most
 * 2^11 - 1) as 18 words of one bit each, most significant first.
 */
export function delayRoutingKey(delayMs) {
  if (!Number.isFinite(delayMs) || delayMs < 0) {
    throw new TypeError(`Expected \`delayMs\` to be a finite number >= 0 (got ${show(delayMs)})`);
  }
  const s = Math.min(MAX_DELAY_S, Math.ceil(delayMs / 1000));
  const words = [];
  for (let bit = LEVELS - 1; bit >= 0; bit--) words.push(String(Math.floor(s / 2 ** bit) % 2));
  return words.join('.');
}

// The binding pattern of exchange L<n>: word for bit n is v, the others *.
function levelPattern(n, v) {
  const words = Array(LEVELS).fill('*');
  words[LEVELS - 1 - n] = v;
  return words.join('.');
}

// The binding pattern from the enter exchange to L<n>: the bits above n 0, bit n 1.
function enterPattern(n) {
  const words = Array(LEVELS).fill('*');
  for (let bit = LEVELS - 1; bit > n; bit--) words[LEVELS - 1 - bit] = '0';
  words[LEVELS - 1 - n] = '1';
  return words.join('.');
}

/**
 * Connects to the broker at url (`amqp://user:pass@host:port/vhost`):
 * resolves to a Broker once connected, rejects when the first connection
 * fails. Options: `amqplib` (the module; default: import('amqplib')),
 * `socketOptions` (passed to amqplib's connect), `onError(err)` (connection
 * errors; default: console.error).
 */
export async function connect(url, options = {}) {
  if (typeof url !== 'string' || url === '') throw new TypeError(`Expected \`url\` to be a non-empty string (got ${show(url)})`);
  if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
  const { socketOptions, onError = (err) => console.error('backstop rabbitmq:', err) } = options;
  if (typeof onError !== 'function') throw new TypeError('Expected `onError` to be a function');
  let amqp = options.amqplib;
  if (amqp === undefined) {
    try {
      amqp = await import('amqplib');
    } catch (err) {
      throw new Error('backstop-policy/rabbitmq needs amqplib: npm install amqplib', { cause: err });
    }
  }
  amqp = amqp?.default?.connect ? amqp.default : amqp;
  if (typeof amqp?.connect !== 'function') throw new TypeError('Expected `amqplib` to be the amqplib module');
  const core = new Core(amqp, url, socketOptions, onError);
  await core.connection();
  return new Broker(core);
}

// The connection (one per Broker, made again when lost), the declared
// topologies and the publishing channel; shared by the Broker's queues.
class Core {
  constructor(amqp, url, socketOptions, onError) {
    this.amqp = amqp;
    this.url = url;
    this.socketOptions = socketOptions;
    this.onError = onError;
    this.conn = null;
    this.connecting = null;
    this.closed = false;
    this.closing = new AbortController(); // ends the workers' reconnection loops
    this.pub = null; // the confirm channel of enqueue, a promise
    this.shared = null; // the shared delay levels, declared once per Broker (a promise)
    this.movers = 0; // work() calls running: the delay mover runs while there is one
    this.mover = null; // {stop, done} of the running mover
  }

  report(err) {
    try {
      this.onError(err);
    } catch {
      // A failing logger must not stop anything.
    }
  }

  // The live connection: one attempt at connecting when there is none.
  connection() {
    if (this.closed) return Promise.reject(new Error('rabbitmq: the broker connection is closed'));
    if (this.conn !== null) return Promise.resolve(this.conn);
    this.connecting ??= (async () => {
      try {
        const conn = await this.amqp.connect(this.url, this.socketOptions);
        conn.on('error', (err) => this.report(err));
        conn.on('close', () => {
          if (this.conn === conn) this.conn = null;
          this.pub = null;
        });
        if (this.closed) {
          await conn.close().catch(() => {});
          throw new Error('rabbitmq: the broker connection is closed');
        }
        this.conn = conn;
        return conn;
      } finally {
        this.connecting = null;
      }
    })();
    return this.connecting;
  }

  // A new channel (in confirm mode when confirm), its errors reported
  // through its 'close' (a channel error closes it).
  async channel(confirm) {
    const conn = await this.connection();
    const ch = confirm ? await conn.createConfirmChannel() : await conn.createChannel();
    ch.on('error', () => {}); // the failing operation rejects with it
    return ch;
  }

  // The confirm channel enqueue publishes on.
  publisher() {
    if (this.pub === null) {
      const p = this.channel(true).then((ch) => {
        ch.on('close', () => {
          if (this.pub === p) this.pub = null;
        });
        return ch;
      });
      p.catch(() => {
        if (this.pub === p) this.pub = null;
      });
      this.pub = p;
    }
    return this.pub;
  }

  // The shared delay levels, declared once per Broker (again after a failure).
  levels() {
    if (this.shared === null) {
      const p = (async () => {
        const ch = await this.channel(false);
        try {
          await declareShared(ch);
        } finally {
          await ch.close().catch(() => {});
        }
      })();
      p.catch(() => {
        if (this.shared === p) this.shared = null;
      });
      this.shared = p;
    }
    return this.shared;
  }

  async declare(name, maxDeliveries) {
    await this.levels();
    const ch = await this.channel(false);
    try {
      await declareQueue(ch, name, maxDeliveries);
    } finally {
      await ch.close().catch(() => {});
    }
  }

  // Runs the delay mover (move()) for this connection while a work() runs:
  // returns what that work() calls when it stops, which stops the mover
  // when no other needs it and resolves once its channel is closed (what
  // it held back in the levels).
  useMover() {
    if (this.movers++ === 0) {
      const stop = new AbortController();
      const { signal, dispose } = anySignal(stop.signal, this.closing.signal);
      this.mover = { stop, done: move(this, signal).catch((err) => this.report(err)).finally(dispose) };
    }
    let released = false;
    return async () => {
      if (released) return;
      released = true;
      if (--this.movers > 0) return;
      const { stop, done } = this.mover;
      this.mover = null;
      stop.abort();
      await done;
    };
  }

  async close() {
    this.closed = true;
    this.closing.abort();
    await this.connecting?.catch(() => {});
    const conn = this.conn;
    this.conn = null;
    if (conn !== null) await conn.close().catch(() => {});
  }
}

// The delay levels every work queue of a virtual host shares: exchange
// L<n> routes a message whose bit n is 1 to queue hold.L<n> (a mover holds
// it 2^n s, then publishes it to exchange L<n-1>), else on to exchange
// L<n-1> at once; L0's next is the deliver exchange, by destination. The
// first topology's TTL queues L<n> are still declared, so that messages
// delayed before an upgrade drain, but no longer bound for n < 11:
// RabbitMQ 3.10 can lose the process that dead-letters them (README, "The
// moves between levels are the workers'").
async function declareShared(ch) {
  await ch.assertExchange(DELIVER, 'headers', { durable: true });
  for (let n = 0; n < LEVELS; n++) {
    await ch.assertExchange(levelName(n), 'topic', { durable: true });
    await ch.assertQueue(levelName(n), {
      durable: true,
      arguments: {
        'x-queue-type': 'quorum',
        'x-message-ttl': 2 ** n * 1000,
        'x-dead-letter-exchange': n === 0 ? DELIVER : levelName(n - 1),
        'x-dead-letter-strategy': 'at-least-once',
        'x-overflow': 'reject-publish',
      },
    });
  }
  for (let n = 0; n < HOLDS; n++) await ch.assertQueue(holdName(n), { durable: true, arguments: { 'x-queue-type': 'quorum' } });
  for (let n = 0; n < LEVELS; n++) {
    if (n < HOLDS) {
      // Bit n set: to the hold queue, which the movers empty; the TTL queue
      // is unbound only after, so a message routed meanwhile goes to both
      // (a duplicate), never to neither.
      await ch.bindQueue(holdName(n), levelName(n), levelPattern(n, '1'));
      await ch.unbindQueue(levelName(n), levelName(n), levelPattern(n, '1'));
    } else {
      await ch.bindQueue(levelName(n), levelName(n), levelPattern(n, '1')); // no delay routes here since the cap
    }
    await ch.bindExchange(n === 0 ? DELIVER : levelName(n - 1), levelName(n), levelPattern(n, '0'));
  }
  await ch.assertExchange(ENTER, 'topic', { durable: true });
  for (let n = 0; n < LEVELS; n++) await ch.bindExchange(levelName(n), ENTER, enterPattern(n));
  await ch.bindExchange(DELIVER, ENTER, delayRoutingKey(0)); // no bit set: straight to the queue
}

async function declareQueue(ch, name, maxDeliveries) {
  await ch.assertQueue(name, {
    durable: true,
    arguments: {
      'x-queue-type': 'quorum',
      'x-delivery-limit': maxDeliveries + 2,
      'x-dead-letter-exchange': '',
      'x-dead-letter-routing-key': `${name}.dlq`,
      'x-dead-letter-strategy': 'at-least-once',
      'x-overflow': 'reject-publish',
    },
  });
  await ch.assertQueue(`${name}.dlq`, { durable: true, arguments: { 'x-queue-type': 'quorum' } });
  await ch.assertExchange(`${name}.delay`, 'fanout', { durable: true });
  await ch.bindExchange(ENTER, `${name}.delay`, '');
  await ch.unbindExchange(levelName(LEVELS - 1), `${name}.delay`, ''); // the first topology's binding
  await ch.assertExchange(`${name}.due`, 'fanout', { durable: true });
  await ch.bindQueue(name, `${name}.due`, '');
  await ch.bindExchange(`${name}.due`, DELIVER, '', { 'x-match': 'all', [H.destination]: name });
}

// Returns every unacked message of ch to its queue (a lost channel does it anyway).
function returnAll(ch) {
  try {
    ch.nackAll(true);
  } catch {
    // The channel is gone: the broker returned them.
  }
}

// A negative publisher confirm: the broker refused the message (a full
// queue's x-overflow = reject-publish).
class Rejected extends Error {}

// Publishes on a confirm channel and resolves once the broker confirmed.
function publish(ch, exchange, routingKey, body, props) {
  return new Promise((resolve, reject) => {
    try {
      ch.publish(exchange, routingKey, body, props, (err) => {
        if (err === null || err === undefined) resolve();
        // amqplib fails the unconfirmed messages of a closed channel too ('channel closed'): only a nack is a refusal.
        else if (err?.message === 'message nacked') {
          reject(new Rejected(`the broker rejected the message to ${JSON.stringify(exchange || routingKey)}`, { cause: err }));
        } else reject(err);
      });
    } catch (err) {
      reject(err);
    }
  });
}

// -- the delay mover ----------------------------------------------------------------

// The moves between delay levels (README, "The moves between levels are the
// workers', not the broker's"): on a confirm channel of its own, the mover
// consumes hold.L0..L10, holds each delivery until its time (releaseAt),
// publishes it unchanged to the next exchange (mandatory), and acks it once
// confirmed. A move the broker refuses or returns (no route) is tried again
// after 10 s; a lost channel returns what it held to the levels, and the
// mover consumes again (with backoff, as work()) until stop aborts.
async function move(core, stop) {
  for (let backoff = BACKOFF_MIN_MS; !stop.aborted; backoff = Math.min(2 * backoff, BACKOFF_MAX_MS)) {
    let ch;
    try {
      await core.levels();
      ch = await core.channel(true);
    } catch {
      // work() reports the connection's failures; both make it again.
      await core.connection().catch(() => {});
      await pause(jitter(backoff), stop);
      continue;
    }
    if (await moveSession(core, ch, stop)) backoff = BACKOFF_MIN_MS;
    if (!stop.aborted) await pause(jitter(backoff), stop);
  }
}

// One channel's moves until it is lost or stop aborts; true when it consumed.
async function moveSession(core, ch, stop) {
  let gone = false; // the channel closed: what it held is back in the levels
  let ending = false;
  const lost = new Promise((resolve) => ch.once('close', () => {
    gone = true;
    resolve();
  }));
  const timers = new Set();
  const moving = new Set(); // moves awaiting their confirm
  // Mandatory moves the broker could not route, matched to the move by
  // exchange, routing key and job id (a return comes before its confirm).
  const unconfirmed = new Map();
  const idOf = (exchange, key, p) => `${exchange}\u0000${key}\u0000${p.messageId ?? ''}`;
  ch.on('return', (msg) => {
    const m = unconfirmed.get(idOf(msg.fields.exchange, msg.fields.routingKey, msg.properties))?.find((x) => !x.returned);
    if (m) m.returned = true;
  });
  const hold = (n, msg, at) => {
    if (gone || ending) return; // still unacked: back to its level with the channel
    const t = setTimeout(() => {
      timers.delete(t);
      const p = moveOne(n, msg).finally(() => moving.delete(p));
      moving.add(p);
    }, Math.max(0, at - Date.now()));
    t.unref?.();
    timers.add(t);
  };
  const moveOne = async (n, msg) => {
    const exchange = n === 0 ? DELIVER : levelName(n - 1);
    const key = msg.fields.routingKey;
    const p = msg.properties ?? {};
    const headers = { ...(p.headers ?? {}) };
    // The hold queue's own count of redeliveries: the work queue's worker
    // reads x-delivery-count as its own (crash loops).
    delete headers['x-delivery-count'];
    const id = idOf(exchange, key, p);
    const m = { returned: false };
    const list = unconfirmed.get(id) ?? [];
    list.push(m);
    unconfirmed.set(id, list);
    try {
      const extra = { priority: p.priority, replyTo: p.replyTo };
      for (const k of Object.keys(extra)) if (extra[k] === undefined) delete extra[k];
      await publish(ch, exchange, key, msg.content, { ...props(msg), ...extra, headers, mandatory: true });
      if (m.returned) throw new Error(`no route from ${exchange} (its work queue ${JSON.stringify(text(headers[H.destination]))} was deleted?)`);
      ch.ack(msg);
    } catch (err) {
      if (gone) return;
      core.report(new Error(`rabbitmq delay mover: the move of job ${JSON.stringify(text(p.messageId))} from ${holdName(n)} failed; trying again in 10 s: ${err?.message ?? err}`, { cause: err }));
      hold(n, msg, Date.now() + MOVE_RETRY_MS);
    } finally {
      list.splice(list.indexOf(m), 1);
      if (list.length === 0) unconfirmed.delete(id);
    }
  };
  let consumed = false;
  try {
    await ch.prefetch(MOVE_PREFETCH, false); // per consumer: per level
    for (let n = 0; n < HOLDS && !stop.aborted; n++) {
      await ch.consume(holdName(n), (msg) => {
        if (msg === null) {
          // Cancelled by the broker (the queue was deleted): declare the
          // levels again and consume on a new channel.
          core.shared = null;
          ch.close().catch(() => {});
          return;
        }
        hold(n, msg, releaseAt(n, msg, Date.now()));
      }, { noAck: false });
    }
    consumed = true;
    await lostOrAborted(lost, stop);
  } catch (err) {
    if (!gone) core.report(new Error(`rabbitmq delay mover: consume: ${err?.message ?? err}`, { cause: err }));
    if (amqpCode(err, 404)) core.shared = null; // a hold queue deleted: declared again
  }
  ending = true;
  for (const t of timers) clearTimeout(t);
  // The moves under way finish (confirmed and acked, or not) before the
  // channel closes, for 10 s at most: fewer duplicates.
  let timer;
  await Promise.race([Promise.all([...moving]), new Promise((resolve) => {
    timer = setTimeout(resolve, MOVE_RETRY_MS);
  })]);
  clearTimeout(timer);
  if (!gone) await ch.close().catch(() => {});
  return consumed;
}

// When a delivery of hold.L<n> received at now (unix ms) leaves its level:
// 2^n s later, or earlier when its due time says it entered the level
// before (it waited there for a mover): due less the delay still to go
// below n, the routing key's lower bits. A routing key that is not the 18
// words of bits, or no valid backstop-due-ms: by the receipt alone.
function releaseAt(n, msg, now) {
  const at = now + 2 ** n * 1000;
  const due = digits(msg.properties?.headers?.[H.due]);
  const words = text(msg.fields?.routingKey).split('.');
  if (due === null || due <= 0 || words.length !== LEVELS) return at;
  let low = 0;
  for (let bit = 0; bit < n; bit++) {
    const w = words[LEVELS - 1 - bit];
    if (w === '1') low += 2 ** bit;
    else if (w !== '0') return at;
  }
  return Math.min(at, due - low * 1000);
}

// A declaration the broker refused because the queue exists with other
// arguments (AMQP 406), as amqplib reports it (possibly wrapped by #error).
function preconditionFailed(err) {
  return amqpCode(err, 406);
}

// Whether err (or one it wraps) is the broker's AMQP reply code.
function amqpCode(err, code) {
  for (let e = err; e; e = e.cause) if (e.code === code) return true;
  return false;
}

function checkSignal(signal) {
  if (signal !== undefined && !(typeof signal?.aborted === 'boolean' && typeof signal.addEventListener === 'function')) {
    throw new TypeError('Expected `signal` to be an AbortSignal');
  }
}

/** A connection to one broker (connect()): its queues share it. */
class Broker {
  #core;
  #queues = new Map();

  constructor(core) {
    this.#core = core;
  }

  /** The work queue name: options `maxDeliveries` (deliveries without an outcome before crash_loop, default 5). */
  queue(name, options = {}) {
    checkName('name', name);
    if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
    const { maxDeliveries = 5 } = options;
    checkWhole('maxDeliveries', maxDeliveries, 1, 1000);
    return new Queue(this.#core, name, maxDeliveries, this.#queues);
  }

  /** Closes the connection; workers stop reconnecting (stop them first: abort their signal). */
  close() {
    return this.#core.close();
  }
}

class Queue {
  #core;
  #declared; // name and max deliveries → a promise, per Broker

  constructor(core, name, maxDeliveries, declared) {
    this.#core = core;
    this.#declared = declared;
    this.name = name;
    this.dlq = `${name}.dlq`;
    this.maxDeliveries = maxDeliveries;
    Object.freeze(this);
  }

  // The declaration's identity: the same name with another delivery limit is
  // another declaration (which the broker refuses).
  get #key() {
    return `${this.name}\u0000${this.maxDeliveries}`;
  }

  #error(what, err) {
    return new Error(`rabbitmq queue ${this.name}: ${what}: ${err?.message ?? err}`, { cause: err });
  }

  /** Declares the topology (idempotent); enqueue() and work() call it too, once per Broker. */
  async declare() {
    try {
      await this.#core.declare(this.name, this.maxDeliveries);
      this.#declared.set(this.#key, Promise.resolve());
    } catch (err) {
      throw this.#error('declare', err);
    }
  }

  #ensure() {
    let p = this.#declared.get(this.#key);
    if (p === undefined) {
      p = this.declare();
      this.#declared.set(this.#key, p);
      p.catch(() => this.#declared.delete(this.#key));
    }
    return p;
  }

  /**
   * Publishes a job (attempt 1) with confirms; id is its stable identity (the
   * idempotency key). Options: `jobType`, `contentType`, `delayMs` (the
   * first attempt waits, rounded up to whole seconds), `signal` (until it
   * aborts, a lost connection is made again and the job published again).
   */
  async enqueue(id, payload = '', options = {}) {
    checkString('id', id);
    const body = bytes(payload);
    if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
    const { jobType, contentType, delayMs = 0, signal } = options;
    if (jobType !== undefined) checkJobType('jobType', jobType);
    if (contentType !== undefined) checkString('contentType', contentType);
    checkWhole('delayMs', delayMs, 0);
    checkSignal(signal);
    const now = Date.now();
    const headers = { [H.attempt]: '1', [H.first]: String(now), [H.destination]: this.name };
    if (jobType !== undefined) headers[H.jobType] = jobType;
    let exchange = '';
    let routingKey = this.name;
    if (delayMs > 0) {
      exchange = `${this.name}.delay`;
      routingKey = delayRoutingKey(delayMs);
      headers[H.due] = String(now + delayMs);
    }
    const props = { messageId: id, persistent: true, contentType, headers, timestamp: Math.floor(now / 1000) };
    // With a signal, a lost connection is made again and the job published
    // again until it aborts: enqueued at least once.
    for (let backoff = BACKOFF_MIN_MS; ; backoff = Math.min(2 * backoff, BACKOFF_MAX_MS)) {
      try {
        await this.#ensure();
        const ch = await this.#core.publisher();
        await publish(ch, exchange, routingKey, body, props);
        return;
      } catch (err) {
        if (signal === undefined || signal.aborted || this.#core.closed || err instanceof Rejected) {
          throw this.#error(`enqueue ${id}`, err);
        }
      }
      await pause(jitter(backoff), signal);
    }
  }

  /**
   * The sizes of the queue, read live (passive declares: it declares
   * nothing): {ready, consumers, dlq, delayLevels}. delayLevels counts the
   * ready messages in the shared delay levels (hold.L0..L10 and the first
   * topology's L0..L17; not those a mover holds), for every queue of the
   * virtual host: one queue's delayed messages cannot be counted apart.
   */
  async stats() {
    let ch;
    try {
      ch = await this.#core.channel(false);
      const q = await ch.checkQueue(this.name);
      const d = await ch.checkQueue(this.dlq);
      let delayLevels = 0;
      for (let n = 0; n < HOLDS; n++) delayLevels += (await ch.checkQueue(holdName(n))).messageCount;
      for (let n = 0; n < LEVELS; n++) delayLevels += (await ch.checkQueue(levelName(n))).messageCount;
      return { ready: q.messageCount, consumers: q.consumerCount, dlq: d.messageCount, delayLevels };
    } catch (err) {
      throw this.#error('stats', err);
    } finally {
      await ch?.close().catch(() => {});
    }
  }

  /**
   * Peeks at up to n (0..100000) dead letters, oldest first: every message is
   * returned to the DLQ. Each: {id, reason, error, attempt, firstEnqueuedMs,
   * deadLetteredMs, jobType, destination, payload, contentType, headers}.
   */
  async inspect(n = 20) {
    checkWhole('n', n, 0, MAX_SCAN);
    let ch;
    try {
      ch = await this.#core.channel(false);
      const held = [];
      try {
        while (held.length < n) {
          const msg = await ch.get(this.dlq, { noAck: false });
          if (msg === false) break;
          held.push(msg);
        }
        return held.map((m) => deadLetterOf(m));
      } finally {
        if (held.length > 0) returnAll(ch);
      }
    } catch (err) {
      throw this.#error('inspect', err);
    } finally {
      await ch?.close().catch(() => {});
    }
  }

  /**
   * Moves at most limit dead letters (with reason, unless '') back to their
   * work queue (the default exchange, routing key backstop-destination or the
   * queue's name: never a shared exchange), looking at no more than scan
   * (default 10 × limit). A replayed job starts afresh (attempt 1, a new
   * first-enqueued time) unless keepAttempts. Returns how many moved.
   */
  async replay(options = {}) {
    if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
    const { limit = 1000, reason = '', keepAttempts = false } = options;
    checkWhole('limit', limit, 1, Number.MAX_SAFE_INTEGER);
    const { scan = Math.max(limit, Math.min(MAX_SCAN, 10 * Math.min(limit, MAX_SCAN))) } = options;
    checkWhole('scan', scan, limit, Math.max(limit, MAX_SCAN));
    if (typeof reason !== 'string' || (reason !== '' && !REASON.test(reason))) {
      throw new TypeError(`Expected \`reason\` to be '' (any) or 1..128 printable ASCII characters without spaces (got ${show(reason)})`);
    }
    if (typeof keepAttempts !== 'boolean') throw new TypeError(`Expected \`keepAttempts\` to be a boolean (got ${show(keepAttempts)})`);
    await this.#ensure();
    let ch;
    let moved = 0;
    try {
      ch = await this.#core.channel(true);
      let refused = null;
      let held = false; // looked at, not moved: returned to the DLQ at the end
      const exists = new Map(); // destination → whether the queue exists
      let batch = [];
      // Waits for the batch's confirms and only then acks its dead letters:
      // a crash in between leaves a duplicate, never a loss.
      const flush = async () => {
        const results = await Promise.allSettled(batch.map((b) => b.confirmed));
        for (const [i, r] of results.entries()) {
          if (r.status === 'rejected') {
            held = true;
            refused ??= new Error(`the broker refused (nack) the replay of job ${JSON.stringify(batch[i].id)}`, { cause: r.reason });
            continue;
          }
          ch.ack(batch[i].msg);
          moved++;
        }
        batch = [];
      };
      try {
        for (let seen = 0; moved + batch.length < limit && seen < scan && refused === null; seen++) {
          const msg = await ch.get(this.dlq, { noAck: false });
          if (msg === false) break;
          const dl = deadLetterOf(msg);
          // A dead letter without a job id stays for a person: a replay
          // would give it a new identity.
          if (dl.id === '' || (reason !== '' && dl.reason !== reason)) {
            held = true;
            continue;
          }
          const to = dl.destination || this.name;
          // The default exchange drops a message for a missing queue and the
          // confirm says nothing of it: check once.
          if (!exists.has(to)) exists.set(to, await this.#exists(to));
          if (!exists.get(to)) {
            held = true;
            refused = new Error(`job ${JSON.stringify(dl.id)}: its queue ${JSON.stringify(to)} (backstop-destination) does not exist`);
            break;
          }
          const headers = moveHeaders(msg.properties.headers);
          for (const k of [H.reason, H.error, H.deadLettered, H.due, H.prevDelay, H.lastError]) delete headers[k];
          headers[H.destination] = to;
          if (!keepAttempts) {
            headers[H.attempt] = '1';
            headers[H.first] = String(Date.now());
          }
          if (dl.reason !== '') headers[H.lastReason] = dl.reason;
          const confirmed = publish(ch, '', to, msg.content, { ...props(msg), headers });
          confirmed.catch(() => {}); // awaited in flush
          batch.push({ msg, id: dl.id, confirmed });
          if (batch.length === CONFIRM_BATCH) await flush();
        }
        await flush();
      } finally {
        if (held) returnAll(ch);
      }
      if (refused !== null) throw refused;
      return moved;
    } catch (err) {
      throw this.#error(`replay (${moved} moved)`, err);
    } finally {
      await ch?.close().catch(() => {});
    }
  }

  // Whether queue name exists, on a channel of its own: a passive declare of
  // a missing queue closes its channel.
  async #exists(name) {
    let ch;
    try {
      ch = await this.#core.channel(false);
      await ch.checkQueue(name);
      return true;
    } catch {
      return false;
    } finally {
      await ch?.close().catch(() => {});
    }
  }

  /**
   * Consumes the queue until signal aborts: runs handler(job, {signal}) for
   * each delivery (at most prefetch at once) and applies the outcome with
   * publisher confirms, then acks. Reconnects with backoff when the
   * connection or the channel is lost. Resolves once stopped, the jobs in
   * hand finished and applied.
   */
  async work(policy, handler, options = {}) {
    checkPolicy(policy);
    if (typeof handler !== 'function') throw new TypeError('Expected `handler` to be a function');
    if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
    const {
      signal, prefetch = 16, classify, metrics, policies, onOutcome,
      onError = (err) => console.error(`backstop rabbitmq queue ${this.name}:`, err),
      consumerTag = `${hostname()}-${process.pid}-${Math.random().toString(36).slice(2, 8)}`,
      handlerTimeoutMs = HANDLER_TIMEOUT_MS,
    } = options;
    checkSignal(signal);
    checkWhole('prefetch', prefetch, 1, 65535);
    checkWhole('handlerTimeoutMs', handlerTimeoutMs, 1);
    if (classify !== undefined && typeof classify !== 'function') throw new TypeError('Expected `classify` to be a function');
    if (onOutcome !== undefined && typeof onOutcome !== 'function') throw new TypeError('Expected `onOutcome` to be a function');
    if (typeof onError !== 'function') throw new TypeError('Expected `onError` to be a function');
    checkString('consumerTag', consumerTag);
    let families;
    if (metrics !== undefined) {
      if (typeof metrics?.attempt !== 'function') throw new TypeError('Expected `metrics` to be the result of createMetrics()');
      if (metrics.target !== this.name) {
        throw new TypeError(`Expected \`metrics\` to have target ${JSON.stringify(this.name)}, the queue's name (got ${JSON.stringify(metrics.target)})`);
      }
      const origin = metricsOrigin(metrics);
      if (origin !== undefined) families = queueRecorder(origin.promClient, origin.registry, this.name);
    }
    const typed = typedPolicies(policies, metrics);
    const report = (err, job) => {
      try {
        onError(err, job);
      } catch {
        // A failing logger must not stop the worker.
      }
    };
    const name = this.name;
    const { signal: stop, dispose } = anySignal(signal, this.#core.closing.signal);
    // Outcomes decided but not acked when the channel was lost, by job id
    // and attempt: applied when the message comes back, the job not run again.
    const kept = new Map();
    let pausedUntil = 0; // unix ms: the breaker refused a job; none starts before

    // The headers, exchange and routing key a plan publishes (none for an ack).
    const next = (job, msg, plan, now) => {
      const headers = plan.action === 'dead_letter' && plan.reason === 'malformed'
        ? { ...(msg.properties.headers ?? {}) } // every original header kept
        : moveHeaders(msg.properties.headers);
      if (!job.malformed && plain(msg.properties.headers ?? {})) {
        // A plain delivery's job moves with the headers every job carries:
        // the next delivery is not plain (the same id, enqueued time).
        headers[H.attempt] = String(job.attempt);
        headers[H.first] = String(job.firstEnqueuedMs);
      }
      if (plan.action === 'dead_letter') {
        if (!(H.destination in headers) && !job.malformed) headers[H.destination] = name;
        headers[H.reason] = plan.reason;
        headers[H.error] = plan.msg ?? '';
        headers[H.deadLettered] = String(now);
        return { exchange: '', routingKey: this.dlq, headers };
      }
      // retry, defer, early: through the delay levels.
      headers[H.destination] = name;
      if (plan.action !== 'early') headers[H.due] = String(now + plan.delayMs); // early: the same due time
      if (plan.action === 'retry') {
        headers[H.attempt] = String(job.attempt + 1);
        headers[H.prevDelay] = String(plan.delayMs);
        headers[H.lastReason] = plan.reason;
        if (plan.msg) headers[H.lastError] = plan.msg;
      } else if (plan.action === 'defer') {
        headers[H.lastReason] = plan.reason;
        if (plan.msg) headers[H.lastError] = plan.msg;
      }
      return { exchange: `${name}.delay`, routingKey: delayRoutingKey(plan.delayMs), headers };
    };

    // Publishes the plan's message (confirmed), then acks msg.
    const settle = async (ch, msg, job, plan) => {
      let published = plan.published === true;
      try {
        if (plan.action !== 'ack' && !published) {
          const { exchange, routingKey, headers } = next(job, msg, plan, Date.now());
          // The message_id is the job's id (a plain delivery's may have had none).
          const id = job.malformed ? {} : { messageId: job.id };
          await publish(ch, exchange, routingKey, msg.content, { ...props(msg), ...id, headers });
          published = true;
        }
        ch.ack(msg);
        return true;
      } catch (err) {
        if (job.key !== null) {
          if (kept.size >= KEPT_MAX) kept.delete(kept.keys().next().value);
          kept.set(job.key, { ...plan, published });
        }
        report(this.#error(`outcome ${plan.action} of job ${job.id || '(no id)'} not applied (kept for its redelivery)`, err), job);
        return false;
      }
    };

    const handle = async (ch, msg) => {
      const job = jobOf(msg, name);
      let plan;
      const keptPlan = job.key !== null && msg.fields.redelivered ? kept.get(job.key) : undefined;
      if (keptPlan !== undefined) {
        kept.delete(job.key);
        plan = keptPlan; // in the client metrics when it was decided; in the queue families once applied
      } else if (job.malformed) {
        plan = planOutcome(job, null, policy, { malformed: MALFORMED });
      } else if (job.deliveryCount >= this.maxDeliveries) {
        plan = {
          action: 'dead_letter', reason: 'crash_loop', decision: null,
          msg: `crash loop: delivered ${job.deliveryCount + 1} times without an outcome (max deliveries ${this.maxDeliveries})`,
        };
      } else if (job.dueMs !== null && job.dueMs > Date.now()) {
        // Early (a delay past the levels' range): the rest, nothing counted.
        plan = { action: 'early', reason: 'early', decision: null, delayMs: job.dueMs - Date.now() };
      } else {
        // A job type with its own policy (policies) runs with it, and its
        // metrics (policy=<type>), as on Redis.
        const own = typed.get(job.jobType);
        const jobPolicy = own?.policy ?? policy;
        const jobMetrics = own ? own.metrics : metrics;
        // The worker's breaker refused a job: start none until it may
        // half-open (as Go and the Redis worker); stopped meanwhile, the
        // delivery goes back to the queue with the channel.
        while (!own && pausedUntil > Date.now() && !stop.aborted) await pause(pausedUntil - Date.now(), stop);
        if (stop.aborted && !own && pausedUntil > Date.now()) return;
        const retryInMs = refusedFor(jobPolicy, Date.now(), jobMetrics);
        if (retryInMs !== null) {
          jobMetrics?.refused('circuit_open');
          if (!own) pausedUntil = Math.max(pausedUntil, Date.now() + retryInMs);
          plan = refusedPlan(jobPolicy, retryInMs);
        } else {
          const error = await runHandler(handler, job, stop, handlerTimeoutMs, (err) => report(this.#error(`job ${job.id}`, err), job));
          try {
            plan = planOutcome(job, error, jobPolicy, { classify, malformed: MALFORMED });
          } catch (err) {
            report(err, job);
            try {
              ch.nack(msg, false, true); // delivered again: a crash loop in the end
            } catch {
              // The channel is gone: the broker returns it.
            }
            return;
          }
          if (jobMetrics !== undefined) countPlan(jobMetrics, plan, jobPolicy);
          if (!own && plan.action === 'defer' && plan.reason === 'circuit_open') {
            pausedUntil = Math.max(pausedUntil, Date.now() + plan.delayMs);
          }
        }
      }
      const applied = await settle(ch, msg, job, plan);
      // The queue families count what the broker has (as Go): published and acked.
      if (applied && families !== undefined) countQueue(families, job, plan);
      if (applied && plan.action !== 'early') {
        try {
          await onOutcome?.({ action: plan.action, reason: plan.reason, decision: plan.decision, applied, delayMs: plan.delayMs }, job);
        } catch (err) {
          report(err, job);
        }
      }
    };

    // The delay levels' moves, for the jobs of every worker of the virtual
    // host: one mover per connection, while a work() runs.
    const stopMover = options[NO_MOVER] ? async () => {} : this.#core.useMover();
    let backoff = BACKOFF_MIN_MS;
    while (!stop.aborted) {
      let ch;
      try {
        await this.#ensure();
        ch = await this.#core.channel(true);
      } catch (err) {
        if (preconditionFailed(err)) {
          // Q exists with other arguments: no retry mends that (as Go's Work).
          dispose();
          await stopMover();
          throw err;
        }
        report(this.#error('connect', err));
        await this.#core.connection().catch(() => {}); // one more attempt at a lost connection
        await pause(jitter(backoff), stop);
        backoff = Math.min(2 * backoff, BACKOFF_MAX_MS);
        continue;
      }
      const inflight = new Set();
      const lost = new Promise((resolve) => ch.once('close', resolve));
      let lostYet = false;
      lost.then(() => {
        lostYet = true;
      });
      try {
        await ch.prefetch(prefetch);
        const { consumerTag: tag } = await ch.consume(name, (msg) => {
          if (msg === null) {
            // Cancelled by the broker (the queue was deleted): declare it
            // again and consume on a new channel.
            this.#declared.delete(this.#key);
            ch.close().catch(() => {});
            return;
          }
          const t = handle(ch, msg).catch((err) => report(err)).finally(() => inflight.delete(t));
          inflight.add(t);
        }, { noAck: false, consumerTag });
        backoff = BACKOFF_MIN_MS;
        await lostOrAborted(lost, stop);
        if (!lostYet) await ch.cancel(tag).catch(() => {});
      } catch (err) {
        if (!lostYet) report(this.#error('consume', err));
      }
      // The jobs in hand finish and are applied (or kept) before the channel closes.
      while (inflight.size > 0) await Promise.all([...inflight]);
      if (!lostYet) await ch.close().catch(() => {});
      if (!stop.aborted) {
        await pause(jitter(backoff), stop);
        backoff = Math.min(2 * backoff, BACKOFF_MAX_MS);
      }
    }
    dispose();
    await stopMover(); // what it held goes back to the levels
  }
}

// -- messages ----------------------------------------------------------------------

// The job of a delivery, as the handler sees it.
function jobOf(msg, queue) {
  const p = msg.properties ?? {};
  const h = p.headers ?? {};
  let id = typeof p.messageId === 'string' ? p.messageId : text(p.messageId);
  let attempt;
  let first;
  const isPlain = plain(h);
  if (isPlain) {
    // A producer that knows nothing of backstop (README, "Plain producers"):
    // attempt 1 of the job called by its message_id, else by its body's
    // SHA-256, enqueued at its timestamp, else now.
    if (id === '') id = `sha256:${createHash('sha256').update(msg.content ?? Buffer.alloc(0)).digest('hex')}`;
    attempt = 1;
    first = timestampMs(p.timestamp) ?? Date.now();
  } else {
    const attemptRaw = digits(h[H.attempt]);
    // '01' is not an attempt: the Redis scripts and Go read digits without a leading zero.
    const leadingZero = typeof h[H.attempt] === 'string' && /^0./.test(h[H.attempt]);
    attempt = attemptRaw !== null && attemptRaw >= 1 && attemptRaw <= MAX_ATTEMPT && !leadingZero ? attemptRaw : null;
    first = digits(h[H.first]);
  }
  const malformed = id === '' || attempt === null || first === null;
  return {
    id,
    attempt: attempt ?? 0,
    firstEnqueuedMs: first ?? 0,
    payload: msg.content,
    contentType: p.contentType,
    jobType: text(h[H.jobType]),
    lastReason: text(h[H.lastReason]),
    lastError: text(h[H.lastError]),
    prevDelayMs: isPlain ? 0 : digits(h[H.prevDelay]) ?? 0,
    dueMs: digits(h[H.due]),
    deliveryCount: digits(h['x-delivery-count']) ?? 0,
    queue,
    headers: h,
    malformed,
    key: malformed ? null : `${id}\u0000${attempt}`,
  };
}

// A delivery is plain when it has neither of the headers every job carries.
function plain(h) {
  return !Object.hasOwn(h, H.attempt) && !Object.hasOwn(h, H.first);
}

// The timestamp property (unix seconds) in ms; null when unset or 0.
function timestampMs(ts) {
  const s = typeof ts === 'bigint' ? Number(ts) : ts;
  if (typeof s !== 'number' || !Number.isSafeInteger(s) || s <= 0 || !Number.isSafeInteger(s * 1000)) return null;
  return s * 1000;
}

// A dead letter as inspect() and replay() see it.
function deadLetterOf(msg) {
  const p = msg.properties ?? {};
  const h = p.headers ?? {};
  // backstop's reason, else the broker's (its latest x-death): its
  // delivery_limit is a crash loop no worker could dead-letter.
  let reason = text(h[H.reason]);
  if (reason === '' && Array.isArray(h['x-death']) && h['x-death'].length > 0) reason = text(h['x-death'][0]?.reason);
  if (reason === '') reason = text(h['x-first-death-reason']);
  if (reason === 'delivery_limit') reason = 'crash_loop';
  return {
    id: typeof p.messageId === 'string' ? p.messageId : text(p.messageId),
    reason,
    error: text(h[H.error]),
    attempt: digits(h[H.attempt]),
    firstEnqueuedMs: digits(h[H.first]),
    deadLetteredMs: digits(h[H.deadLettered]),
    jobType: text(h[H.jobType]),
    destination: text(h[H.destination]),
    payload: msg.content,
    contentType: p.contentType,
    headers: h,
  };
}

// The broker's own headers: they describe the old place (x-death counts
// per queue) and are not moved, except with a malformed message.
const BROKER_HEADERS = new Set([
  'x-death', 'x-first-death-exchange', 'x-first-death-queue', 'x-first-death-reason',
  'x-last-death-exchange', 'x-last-death-queue', 'x-last-death-reason', 'x-delivery-count',
]);

// The headers a moved message keeps: every one (the job type, others'),
// less the broker's.
function moveHeaders(h) {
  const out = {};
  for (const [k, v] of Object.entries(h ?? {})) if (!BROKER_HEADERS.has(k)) out[k] = v;
  return out;
}

// The properties a moved message keeps.
function props(msg) {
  const p = msg.properties ?? {};
  const out = { persistent: true };
  if (p.messageId !== undefined) out.messageId = p.messageId;
  if (p.contentType !== undefined) out.contentType = p.contentType;
  if (p.contentEncoding !== undefined) out.contentEncoding = p.contentEncoding;
  if (p.correlationId !== undefined) out.correlationId = p.correlationId;
  if (p.type !== undefined) out.type = p.type;
  if (p.appId !== undefined) out.appId = p.appId;
  if (p.timestamp !== undefined) out.timestamp = p.timestamp;
  return out;
}

// A header as a whole number >= 0: a string of digits or an AMQP integer.
function digits(v) {
  if (typeof v === 'number') return Number.isSafeInteger(v) && v >= 0 ? v : null;
  if (typeof v === 'bigint') return v >= 0n && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : null;
  // Bytes are not digits (as Go reads them): a binary attempt is malformed.
  if (typeof v !== 'string' || !/^\d{1,18}$/.test(v)) return null;
  return Number(v); // past 2^53 only for absurd times, which stay absurd
}

function text(v) {
  if (typeof v === 'string') return v;
  if (Buffer.isBuffer(v)) return v.toString('utf8');
  return v === null || v === undefined ? '' : String(v);
}

// -- metrics -----------------------------------------------------------------------

// The attempt histogram's bounds, as the exporter's backstop_job_attempts.
const ATTEMPT_BUCKETS = [1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50];
// Go's internal/queuemetrics families: names, help, labels (queue, job_type
// first) and buckets.
const QUEUE_FAMILIES = [
  ['attempts', 'Counter', 'backstop_attempts_total',
    'Attempts by outcome (success, retry, dead_letter; deferred: a job the breaker or the budget refused, its attempt not spent), counted by the workers.', ['outcome']],
  ['retries', 'Counter', 'backstop_retries_total', "Retries scheduled, by the policy's reason.", ['reason']],
  ['deferrals', 'Counter', 'backstop_deferrals_total',
    'Jobs deferred without spending an attempt, by reason (circuit_open, budget_exhausted).', ['reason']],
  ['deadLetters', 'Counter', 'backstop_dead_letters_total', 'Jobs dead-lettered, by reason.', ['reason']],
  ['maxAttempts', 'Counter', 'backstop_max_attempts_reached_total', 'Jobs dead-lettered because they used up their attempts.', []],
  ['finished', 'Histogram', 'backstop_job_attempts', 'The attempt on which each job finished, by outcome (success, dead_letter).', ['outcome']],
];
// How many job types a queue labels by name; the others are "other" (as Go's
// internal/queuemetrics and the Redis stats hash).
const TYPE_LIMIT = 50;
const queueRegistries = new WeakMap(); // registry → {fam, recorders: queue → recorder}

// The recorder of queue on registry: the queue families, registered once
// per registry (reused when another copy of this package registered the
// same), and the job types it labels by name, shared by the queue's workers.
function queueRecorder(promClient, registry, queue) {
  let reg = queueRegistries.get(registry);
  if (!reg) {
    reg = { fam: queueFamilies(promClient, registry), recorders: new Map() };
    queueRegistries.set(registry, reg);
  }
  let r = reg.recorders.get(queue);
  if (!r) {
    r = { fam: reg.fam, queue, types: new Set() };
    reg.recorders.set(queue, r);
  }
  return r;
}

function queueFamilies(promClient, registry) {
  const fam = {};
  for (const [key, kind, name, help, extra] of QUEUE_FAMILIES) {
    const labelNames = ['queue', 'job_type', ...extra];
    const existing = registry.getSingleMetric(name);
    if (existing) {
      const same = existing instanceof promClient[kind] && JSON.stringify(existing.labelNames) === JSON.stringify(labelNames);
      if (!same) throw new Error(`rabbitmq work: register ${name}: the registry holds another metric of that name`);
      fam[key] = existing;
      continue;
    }
    const opts = { name, help, labelNames, registers: [registry] };
    if (kind === 'Histogram') opts.buckets = ATTEMPT_BUCKETS;
    fam[key] = new promClient[kind](opts);
  }
  return fam;
}

// The job_type label of t: '' untyped, t for the first TYPE_LIMIT valid
// types of the queue, else "other".
function typeLabel(r, t) {
  if (t === '') return '';
  if (!JOB_TYPE.test(t)) return 'other';
  if (r.types.has(t)) return t;
  if (r.types.size >= TYPE_LIMIT) return 'other';
  r.types.add(t);
  return t;
}

// Counts an applied plan (not an early message) in the queue families.
function countQueue(r, job, plan) {
  if (plan.action === 'early') return;
  const fam = r.fam;
  const labels = { queue: r.queue, job_type: typeLabel(r, job.jobType) };
  if (plan.action === 'ack') {
    fam.attempts.inc({ ...labels, outcome: 'success' });
    fam.finished.observe({ ...labels, outcome: 'success' }, job.attempt);
  } else if (plan.action === 'retry') {
    fam.attempts.inc({ ...labels, outcome: 'retry' });
    fam.retries.inc({ ...labels, reason: plan.reason });
  } else if (plan.action === 'defer') {
    fam.attempts.inc({ ...labels, outcome: 'deferred' });
    fam.deferrals.inc({ ...labels, reason: plan.reason });
  } else if (plan.action === 'dead_letter') {
    fam.attempts.inc({ ...labels, outcome: 'dead_letter' });
    fam.deadLetters.inc({ ...labels, reason: plan.reason });
    if (plan.reason === 'max_attempts_reached') fam.maxAttempts.inc(labels);
    if (job.attempt >= 1 && !job.malformed) fam.finished.observe({ ...labels, outcome: 'dead_letter' }, job.attempt);
  }
}

// -- arguments ---------------------------------------------------------------------

// A signal that aborts when any of signals does; dispose() forgets them.
function anySignal(...signals) {
  const c = new AbortController();
  const abort = () => c.abort();
  const on = signals.filter((s) => s !== undefined);
  for (const s of on) {
    if (s.aborted) c.abort();
    else s.addEventListener('abort', abort, { once: true });
  }
  return { signal: c.signal, dispose: () => on.forEach((s) => s.removeEventListener('abort', abort)) };
}

function bytes(payload) {
  if (payload === null || payload === undefined) return Buffer.alloc(0);
  if (typeof payload === 'string') return Buffer.from(payload, 'utf8');
  if (Buffer.isBuffer(payload)) return payload;
  if (ArrayBuffer.isView(payload)) return Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength);
  throw new TypeError(`Expected \`payload\` to be a string, a Buffer or a Uint8Array (got ${show(payload)})`);
}

// A queue name: AMQP allows 255 bytes; Q.dlq and Q.delay must fit too.
function checkName(what, v) {
  checkString(what, v);
  if (Buffer.byteLength(v) > 250) throw new TypeError(`Expected \`${what}\` to be at most 250 bytes (got ${Buffer.byteLength(v)})`);
  if (v.startsWith('amq.')) throw new TypeError(`Expected \`${what}\` not to start with "amq." (reserved by RabbitMQ)`);
}

// Resolves when the channel is lost or stop is aborted, whichever is first,
// leaving no listener on stop.
async function lostOrAborted(lost, stop) {
  let onAbort;
  const aborted = new Promise((resolve) => {
    onAbort = resolve;
    if (stop.aborted) resolve();
    stop.addEventListener('abort', resolve, { once: true });
  });
  await Promise.race([lost, aborted]);
  stop.removeEventListener('abort', onAbort);
}
