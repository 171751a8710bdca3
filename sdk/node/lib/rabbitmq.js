// backstop-policy/rabbitmq: the queue contract on RabbitMQ
// (queue/rabbitmq/README.md in the backstop repository) for Node.js workers,
// over amqplib (an optional peer dependency). The topology, the headers and
// the moves are the ones the Go and Python workers use, so they can share a
// queue; the policy decides locally (backstop.wasm, through the Runner,
// runner.js, as the Redis worker does), only the moves talk to the broker.
// Its parts are in rabbitmq/: the connection (core.js), the topology, the
// messages, the delay mover and the worker.
import { checkFunction, checkSignal, checkString, checkWhole, show } from './args.js';
import { checkJobType } from './jobtypes.js';
import { jitter, pause } from './outcome.js';
import { BACKOFF_MAX_MS, BACKOFF_MIN_MS, giveBack, publish, Rejected } from './rabbitmq/channel.js';
import { Core } from './rabbitmq/core.js';
import { deadLetterOf, digits, H, MAX_DUE_AHEAD_MS, moveHeaders, props, text } from './rabbitmq/message.js';
import { delayRoutingKey, HOLDS, holdName, LEVELS, levelName, RUN } from './rabbitmq/topology.js';
import { work } from './rabbitmq/worker.js';

export { delayRoutingKey, holdName, levelName };

// Dead letters replay and inspect look at, at most (as Go).
const MAX_SCAN = 100_000;
// The most delayed jobs one run() moves by due time (Go's queue.MaxRunLimit),
// and how long it waits for a mover's answer.
const MAX_RUN_LIMIT = 10_000;
const RUN_WAIT_MS = 5000;
// Replays published before their confirms are awaited: one round trip per batch.
const CONFIRM_BATCH = 100;
// A reason as the scripts accept it: 1..128 printable ASCII characters without spaces.
const REASON = /^[!-~]{1,128}$/;

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
  checkFunction('onError', onError);
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
   * first attempt waits, rounded up to whole seconds; at most 30 days), `signal` (until it
   * aborts, a lost connection is made again and the job published again).
   */
  async enqueue(id, payload = '', options = {}) {
    checkString('id', id);
    const body = bytes(payload);
    if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
    const { jobType, contentType, delayMs = 0, signal } = options;
    if (jobType !== undefined) checkJobType('jobType', jobType);
    if (contentType !== undefined) checkString('contentType', contentType);
    // A due time further ahead is malformed to every worker.
    if (Number.isSafeInteger(delayMs) && delayMs > MAX_DUE_AHEAD_MS) {
      throw new RangeError(`Expected \`delayMs\` to be at most 30 days (${MAX_DUE_AHEAD_MS} ms; got ${delayMs})`);
    }
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
   * given back to the DLQ, and looking does not use it up (giveBack: a
   * quorum queue's delivery limit). Each: {id, reason, error, attempt,
   * firstEnqueuedMs, deadLetteredMs, jobType, destination, payload,
   * contentType, headers}; the headers leave out x-delivery-count (the
   * broker's count of looks).
   */
  async inspect(n = 20) {
    checkWhole('n', n, 0, MAX_SCAN);
    let ch;
    try {
      ch = await this.#core.channel(true);
      const held = [];
      while (held.length < n) {
        const msg = await ch.get(this.dlq, { noAck: false });
        if (msg === false) break;
        held.push(msg);
      }
      const out = held.map((m) => deadLetterOf(m));
      // Given back at once, in order (not when the channel closes).
      await giveBack(ch, this.dlq, held);
      return out;
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
   * first-enqueued time) unless keepAttempts. Returns how many moved. With
   * actor (who, at most 256 bytes), each one is first recorded in the audit
   * queue Q.audit (its headers with backstop-audit-action replay, -actor,
   * -at-ms; no body), as the Go CLI's dlq replay records its own.
   */
  async replay(options = {}) {
    if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
    const { limit = 1000, reason = '', keepAttempts = false, actor = '' } = options;
    if (typeof actor !== 'string' || Buffer.byteLength(actor) > 256) {
      throw new TypeError(`Expected \`actor\` to be a string of at most 256 bytes (got ${show(actor)})`);
    }
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
      if (actor !== '') await this.#declareAudit();
      ch = await this.#core.channel(true);
      let refused = null;
      const held = []; // looked at, not moved: given back to the DLQ at the end
      const exists = new Map(); // destination → whether the queue exists
      let batch = [];
      // Waits for the batch's confirms and only then acks its dead letters:
      // a crash in between leaves a duplicate, never a loss.
      const flush = async () => {
        const results = await Promise.allSettled(batch.map((b) => b.confirmed));
        const records = await Promise.allSettled(batch.map((b) => b.recorded));
        for (const [i, r] of results.entries()) {
          if (r.status === 'rejected') {
            held.push(batch[i].msg);
            refused ??= new Error(`the broker refused (nack) the replay of job ${JSON.stringify(batch[i].id)}`, { cause: r.reason });
            continue;
          }
          ch.ack(batch[i].msg);
          moved++;
          if (records[i].status === 'rejected') {
            refused ??= new Error(`the broker refused (nack) the audit record of the replay of job ${JSON.stringify(batch[i].id)}`, { cause: records[i].reason });
          }
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
            held.push(msg);
            continue;
          }
          const to = dl.destination || this.name;
          // The default exchange drops a message for a missing queue and the
          // confirm says nothing of it: check once.
          if (!exists.has(to)) exists.set(to, await this.#exists(to));
          if (!exists.get(to)) {
            held.push(msg);
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
          // The audit record first: never a replay unrecorded.
          let recorded;
          if (actor !== '') {
            const rec = moveHeaders(msg.properties.headers);
            Object.assign(rec, { 'backstop-audit-action': 'replay', 'backstop-audit-actor': actor,
              'backstop-audit-at-ms': String(Date.now()), [H.reason]: dl.reason });
            recorded = publish(ch, '', `${this.name}.audit`, Buffer.alloc(0), { ...props(msg), headers: rec });
            recorded.catch(() => {}); // awaited in flush
          }
          const confirmed = publish(ch, '', to, msg.content, { ...props(msg), headers });
          confirmed.catch(() => {}); // awaited in flush
          batch.push({ msg, id: dl.id, confirmed, recorded });
          if (batch.length === CONFIRM_BATCH) await flush();
        }
        await flush();
      } finally {
        // (A lost channel returns them anyway.)
        await giveBack(ch, this.dlq, held).catch(() => {});
      }
      if (refused !== null) throw refused;
      return moved;
    } catch (err) {
      throw this.#error(`replay (${moved} moved)`, err);
    } finally {
      await ch?.close().catch(() => {});
    }
  }

  /**
   * Moves delayed jobs of this queue to it now, whatever their due time
   * (Cloud Tasks' RunTask; Go's Queue.Run and `backstop queue run --amqp.url`,
   * README "Run a delayed job now"): `{id}` every copy of that job, or
   * `{dueBefore, limit}` (unix ms or a Date; limit 1..10000) at most limit of
   * those due at or before it. Takes them from the delay levels' ready
   * messages (basic.get, at most 100,000 looked at) and from the workers'
   * movers (the backstop.run exchange), each published to the queue with its
   * attempt kept and without its due time (confirmed), then acked. Resolves
   * to {moved, left, silent}: left counts those due beyond the limit, silent
   * the movers that did not answer within 5 s (what they hold was not looked
   * at).
   */
  async run(options = {}) {
    if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
    const { id = '', dueBefore, limit } = options;
    if (typeof id !== 'string') throw new TypeError(`Expected \`id\` to be a string (got ${show(id)})`);
    const before = dueBefore instanceof Date ? dueBefore.getTime() : dueBefore;
    if ((id === '') === (before === undefined)) throw new TypeError('Expected `id` or `dueBefore`, one of them');
    let most = MAX_SCAN;
    if (id === '') {
      checkWhole('dueBefore', before, 0, Number.MAX_SAFE_INTEGER);
      checkWhole('limit', limit, 1, MAX_RUN_LIMIT);
      most = limit;
    } else if (limit !== undefined) {
      throw new TypeError('Expected `limit` with `dueBefore`, not with `id`');
    }
    const name = this.name;
    const match = (msg) => {
      const h = msg.properties?.headers ?? {};
      return text(h[H.destination]) === name && (id !== '' ? text(msg.properties?.messageId) === id : (digits(h[H.due]) ?? 0) <= before);
    };
    const out = { moved: 0, left: 0, silent: 0 };
    let ch;
    try {
      if (!(await this.#exists(name))) throw new Error(`no queue ${JSON.stringify(name)} in this virtual host`);
      ch = await this.#core.channel(true);
      // The ready messages of the levels: each taken one published, confirmed, then acked.
      let scan = MAX_SCAN;
      const levels = [...Array(HOLDS).keys()].map(holdName).concat([...Array(LEVELS).keys()].map(levelName));
      for (const level of levels) {
        if (scan === 0) break;
        if (!(await this.#exists(level))) continue;
        const held = [];
        try {
          for (; scan > 0; scan--) {
            const msg = await ch.get(level, { noAck: false });
            if (msg === false) break;
            if (!match(msg)) {
              held.push(msg);
            } else if (out.moved >= most) {
              out.left++;
              held.push(msg);
            } else {
              const headers = moveHeaders(msg.properties.headers);
              delete headers[H.due];
              delete headers[H.moveRefusals];
              await publish(ch, '', name, msg.content, { ...props(msg), headers });
              ch.ack(msg);
              out.moved++;
            }
          }
        } finally {
          await giveBack(ch, level, held).catch(() => {});
        }
      }
      await this.#runHeld(ch, id, before, most, out);
      if (out.silent > 0) {
        throw new Error(`${out.silent} movers did not answer within ${RUN_WAIT_MS} ms: the delayed jobs they hold were not looked at (moved ${out.moved})`);
      }
      return out;
    } catch (err) {
      throw Object.assign(this.#error(`run (${out.moved} moved)`, err), { ran: out });
    } finally {
      await ch?.close().catch(() => {});
    }
  }

  // The movers' holds (run()): every mover counts its matches (the run
  // exchange), then those with matches move them in turn, each at most what
  // is left of most, so that the limit holds across movers.
  async #runHeld(ch, id, before, most, out) {
    const movers = (await this.#exists(holdName(0))) ? (await ch.checkQueue(holdName(0))).consumerCount : 0;
    if (movers === 0) return;
    await ch.assertExchange(RUN, 'fanout', { durable: true });
    const waiting = new Map(); // correlation id → resolve
    const replies = [];
    await ch.consume('amq.rabbitmq.reply-to', (msg) => {
      if (msg === null) return;
      const c = msg.properties.correlationId;
      if (c === 'count') replies.push(msg);
      waiting.get(c)?.(msg);
    }, { noAck: true });
    const cmd = { 'backstop-run-queue': this.name, ...(id !== '' ? { 'backstop-run-id': id } : { 'backstop-run-due-before-ms': String(before) }) };
    const ask = (exchange, key, op, corr, n) => ch.publish(exchange, key, Buffer.alloc(0), {
      replyTo: 'amq.rabbitmq.reply-to', correlationId: corr,
      headers: { ...cmd, 'backstop-run-op': op, 'backstop-run-limit': String(n) },
    });
    const answer = (corr, count) => new Promise((resolve) => {
      const timer = setTimeout(() => resolve(null), RUN_WAIT_MS);
      waiting.set(corr, (msg) => {
        if (count && replies.length < movers) return;
        clearTimeout(timer);
        resolve(msg);
      });
      if (count && replies.length >= movers) waiting.get(corr)(null);
    });
    const counted = answer('count', true);
    ask(RUN, '', 'count', 'count', 0);
    await counted;
    out.silent = movers - replies.length;
    const found = replies.map((r) => ({ mover: text(r.properties.headers?.['backstop-run-mover']), matched: digits(r.properties.headers?.['backstop-run-matched']) ?? 0 }))
      .sort((a, b) => b.matched - a.matched);
    for (const [i, f] of found.entries()) {
      if (f.matched === 0) continue;
      if (out.moved >= most) {
        out.left += f.matched;
        continue;
      }
      const corr = `take-${i}`;
      const taken = answer(corr, false);
      ask('', f.mover, 'take', corr, most - out.moved);
      const r = await taken;
      if (r === null) {
        out.silent++;
        continue;
      }
      const moved = digits(r.properties.headers?.['backstop-run-moved']) ?? 0;
      out.moved += moved;
      out.left += Math.max((digits(r.properties.headers?.['backstop-run-matched']) ?? 0) - moved, 0);
    }
  }

  // Whether queue name exists, on a channel of its own: a passive declare of
  // a missing queue closes its channel.
  // Declares Q.audit as Go's rabbitmq.declareAudit does (a quorum queue
  // keeping the last 10,000 records), on a channel of its own.
  async #declareAudit() {
    const ch = await this.#core.channel(false);
    try {
      await ch.assertQueue(`${this.name}.audit`, {
        durable: true, arguments: { 'x-queue-type': 'quorum', 'x-max-length': 10000, 'x-overflow': 'drop-head' },
      });
    } finally {
      await ch.close().catch(() => {});
    }
  }

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
    await work({
      name: this.name,
      dlq: this.dlq,
      maxDeliveries: this.maxDeliveries,
      core: this.#core,
      ensure: () => this.#ensure(),
      forget: () => this.#declared.delete(this.#key),
      error: (what, err) => this.#error(what, err),
    }, policy, handler, options);
  }
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
