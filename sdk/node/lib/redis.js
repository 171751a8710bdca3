// backstop-policy/redis: the Redis queue contract (queue/redisqueue/README.md in the
// backstop repository) for Node.js workers, over the caller's ioredis or
// node-redis client. Every move is one of the contract's Lua scripts, shipped
// in ../scripts and run with EVALSHA, falling back to EVAL on NOSCRIPT; the
// policy decides locally (backstop.wasm), only the move talks to Redis. The
// worker (work()) is in redis/worker.js, over the broker-neutral Runner
// (runner.js) that the RabbitMQ worker uses too.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { checkFunction, checkString, checkWhole, show } from './args.js';
import { checkJobType } from './jobtypes.js';
import { checkPolicy } from './outcome.js';
import { applyPlan, planFor } from './redis/apply.js';
import { sender } from './redis/client.js';
import { fieldsJSON, raw8 } from './redis/plain.js';
import { work } from './redis/worker.js';

export { sender };

const SCRIPT_NAMES = ['enqueue', 'ack', 'retry', 'defer', 'dead_letter', 'promote', 'reclaim', 'replay', 'hold', 'run', 'discard'];
let scripts; // name → {source, sha}: lib.lua, a newline, the script; read on first use

function script(name) {
  if (!scripts) {
    const read = (n) => readFileSync(new URL(`../scripts/${n}.lua`, import.meta.url), 'utf8');
    // lib.lua holds the helpers the scripts share: a prelude sent before each.
    const lib = read('lib');
    const loaded = new Map();
    for (const n of SCRIPT_NAMES) {
      const source = `${lib}\n${read(n)}`;
      loaded.set(n, { source, sha: createHash('sha1').update(source).digest('hex') });
    }
    scripts = loaded;
  }
  return scripts.get(name);
}

/**
 * The Lua source of one of the contract's scripts as sent to Redis: the
 * package's scripts/lib.lua (the helpers the scripts share), a newline, then
 * scripts/<name>.lua.
 */
export function scriptSource(name) {
  if (!SCRIPT_NAMES.includes(name)) {
    throw new TypeError(`Expected \`name\` to be one of ${SCRIPT_NAMES.join(', ')} (got ${JSON.stringify(name)})`);
  }
  return script(name).source;
}

/**
 * The default keys of queue name: {name}:jobs, {name}:delayed, {name}:dlq and
 * {name}:stats, one hash tag so the scripts work on a Redis Cluster.
 */
export function keysFor(name) {
  checkString('name', name);
  const tag = `{${name}}`;
  return Object.freeze({ jobs: `${tag}:jobs`, delayed: `${tag}:delayed`, dlq: `${tag}:dlq`, stats: `${tag}:stats` });
}

/**
 * The audit stream of keys, where replays and runs given an actor (and the
 * Go CLI's discards) are recorded: the DLQ key with `:dlq` replaced by
 * `:audit`, so in its hash slot (Go's `Keys.Audit`).
 */
function auditKey(keys) {
  return (keys.dlq.endsWith(':dlq') ? keys.dlq.slice(0, -4) : keys.dlq) + ':audit';
}

// checkActor reads an actor to record in the audit: undefined or '' records
// nothing, else at most 256 bytes (as Go's queue.CheckActor).
function checkActor(actor) {
  if (actor === undefined || actor === '') return '';
  if (typeof actor !== 'string' || Buffer.byteLength(actor) > 256) {
    throw new TypeError(`Expected \`actor\` to be a string of at most 256 bytes (got ${show(actor)})`);
  }
  return actor;
}

/**
 * Returns the queue called name over client: an ioredis Redis or Cluster,
 * or a node-redis v4+ client or cluster. The client stays the caller's.
 */
export function createQueue(client, name, options = {}) {
  const send = sender(client);
  checkString('name', name);
  if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
  const keys = options.keys === undefined ? keysFor(name) : checkKeys(options.keys);
  const group = options.group ?? 'workers';
  checkString('group', group);
  return new Queue(send, name, keys, group);
}

class Queue {
  #send;

  constructor(send, name, keys, group) {
    this.#send = send;
    this.name = name;
    this.keys = keys;
    this.group = group;
    Object.freeze(this);
  }

  // Runs script name with EVALSHA, and EVAL (which caches it) on NOSCRIPT.
  async #script(name, keys, args, what) {
    const s = script(name);
    const tail = [String(keys.length), ...keys, ...args];
    try {
      try {
        return await this.#send(['EVALSHA', s.sha, ...tail], keys[0]);
      } catch (err) {
        if (!/^NOSCRIPT/.test(err?.message)) throw err;
        return await this.#send(['EVAL', s.source, ...tail], keys[0]);
      }
    } catch (err) {
      throw this.#error(what, err);
    }
  }

  #error(what, err) {
    return new Error(`queue ${this.name}: ${what}: ${err?.message ?? err}`, { cause: err });
  }

  /**
   * The server's clock (TIME), in unix ms: the clock the scripts stamp due
   * times and first_enqueued_ms with.
   */
  async serverTimeMs() {
    let reply;
    try {
      reply = await this.#send(['TIME'], this.keys.jobs);
    } catch (err) {
      throw this.#error('time', err);
    }
    return Number(text(reply[0])) * 1000 + Math.floor(Number(text(reply[1])) / 1000);
  }

  /** Creates the jobs stream and the consumer group when missing; true when it created the group. */
  async ensureGroup() {
    try {
      await this.#send(['XGROUP', 'CREATE', this.keys.jobs, this.group, '0', 'MKSTREAM'], this.keys.jobs);
      return true;
    } catch (err) {
      if (/BUSYGROUP/.test(err?.message)) return false;
      // Redis refuses XGROUP CREATE before it looks for the group when it
      // refuses writes (out of memory, a read-only replica): a group that
      // exists is all a worker needs.
      if (await this.#groupExists()) return false;
      throw this.#error(`create group ${this.group}`, err);
    }
  }

  async #groupExists() {
    try {
      const groups = await this.#send(['XINFO', 'GROUPS', this.keys.jobs], this.keys.jobs);
      return (groups ?? []).some((g) => {
        for (const [k, v] of pairs(g)) if (text(k) === 'name') return text(v) === this.group;
        return false;
      });
    } catch {
      return false;
    }
  }

  /**
   * Adds a job; id is its stable identity (the idempotency key), `type` its
   * job type ('' or absent: untyped). Returns the stream entry id.
   */
  async enqueue(id, payload = '', options = {}) {
    checkString('id', id);
    if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
    const { type = '' } = options;
    if (type !== '') checkJobType('type', type);
    const k = this.keys;
    const args = type === '' ? [id, bytes(payload)] : [id, bytes(payload), type];
    return text(await this.#script('enqueue', [k.jobs, k.stats], args, `enqueue ${id}`));
  }

  /** Reads new jobs for consumer, waiting up to blockMs for one when given. */
  async read(consumer, options = {}) {
    checkString('consumer', consumer);
    const { count = 16, blockMs } = options;
    checkWhole('count', count, 1);
    const args = ['XREADGROUP', 'GROUP', this.group, consumer, 'COUNT', String(count)];
    if (blockMs !== undefined) {
      checkWhole('blockMs', blockMs, 1);
      args.push('BLOCK', String(blockMs));
    }
    args.push('STREAMS', this.keys.jobs, '>');
    let reply;
    try {
      reply = await this.#send(args, this.keys.jobs);
    } catch (err) {
      throw this.#error('read', err);
    }
    return jobsOf(reply);
  }

  /** Records a success; false when the entry was no longer pending. */
  async ack(entry) {
    const id = entryId(entry);
    const k = this.keys;
    return Number(await this.#script('ack', [k.jobs, k.stats], [this.group, id], `ack ${id}`)) === 1;
  }

  /** Moves a failed job to the delayed set; returns its due time (unix ms), or null when it was no longer pending. */
  async retry(entry, delayMs, reason, lastError = '') {
    return this.#delay('retry', entry, delayMs, reason, lastError);
  }

  /**
   * Moves a job the policy refused to run (reason `circuit_open` or
   * `budget_exhausted`) back to the delayed set, due in delayMs, its attempt
   * count unchanged: it waits out the outage without spending an attempt.
   * lastError '' keeps the entry's own. Returns the due time (unix ms), or
   * null when it was no longer pending.
   */
  async defer(entry, delayMs, reason, lastError = '') {
    return this.#delay('defer', entry, delayMs, reason, lastError);
  }

  // retry and defer: moves entry to the delayed set with script name.
  async #delay(name, entry, delayMs, reason, lastError) {
    const id = entryId(entry);
    checkWhole('delayMs', delayMs, 0);
    checkString('reason', reason);
    const k = this.keys;
    const args = [this.group, id, String(delayMs), reason, errorString(lastError)];
    const due = Number(await this.#script(name, [k.jobs, k.delayed, k.stats], args, `${name} ${id}`));
    return due === 0 ? null : due;
  }

  /** Moves a job to the dead letter stream; returns the DLQ entry id, or null when it was no longer pending. */
  async deadLetter(entry, reason, lastError = '') {
    const id = entryId(entry);
    checkString('reason', reason);
    const k = this.keys;
    const args = [this.group, id, reason, errorString(lastError)];
    const r = await this.#script('dead_letter', [k.jobs, k.dlq, k.stats], args, `dead-letter ${id}`);
    return typeof r === 'string' || Buffer.isBuffer(r) ? text(r) : null;
  }

  /** Moves at most limit due retries to the stream; nextDueMs is null when no retry is left. */
  async promote(limit = 500) {
    checkWhole('limit', limit, 1, 10000);
    const k = this.keys;
    const [moved, next] = await this.#script('promote', [k.delayed, k.jobs, k.stats], [String(limit)], 'promote');
    return { moved: Number(moved), nextDueMs: Number(next) < 0 ? null : Number(next) };
  }

  /**
   * Moves delayed jobs to the stream now, before they are due, counted in
   * force_run (Cloud Tasks' RunTask): `{ id }` the job with that job id, or
   * `{ dueBefore, limit }` at most limit (1..10000) jobs due at or before
   * dueBefore (a Date or unix ms). Returns `{ moved, left }`: left counts the
   * jobs still due before the bound (0 for an id); moved is 0 when the id is
   * not in the delayed set.
   */
  async run(options = {}) {
    if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
    const { id, dueBefore, limit = 100 } = options;
    const k = this.keys;
    const actor = checkActor(options.actor);
    // With an actor, each job moved is recorded in the audit (run.lua).
    const keys = actor ? [k.delayed, k.jobs, k.stats, auditKey(k)] : [k.delayed, k.jobs, k.stats];
    const tail = actor ? [actor] : [];
    if ((id === undefined) === (dueBefore === undefined)) {
      throw new TypeError('Expected one of `id` and `dueBefore`');
    } else if (id !== undefined) {
      checkString('id', id);
      // Each call scans a bounded part of the set (run.lua): Redis serves
      // others between them.
      let moved = 0;
      let cursor = '0';
      do {
        const [n, next] = await this.#script('run', keys, ['id', id, cursor, ...tail], `run ${id}`);
        moved += Number(n);
        cursor = text(next);
      } while (cursor !== '0');
      return { moved, left: 0 };
    }
    const ms = dueBefore instanceof Date ? dueBefore.getTime() : dueBefore;
    checkWhole('dueBefore', ms, 0);
    checkWhole('limit', limit, 1, 10000);
    const [moved, left] = await this.#script('run', keys, ['before', String(ms), String(limit), ...tail], 'run');
    return { moved: Number(moved), left: Number(left) };
  }

  /** Takes over entries idle for minIdleMs; those delivered maxDeliveries times go to the DLQ (crash_loop). */
  async reclaim(consumer, options = {}) {
    checkString('consumer', consumer);
    const { minIdleMs = 60_000, count = 100, maxDeliveries = 5 } = options;
    checkWhole('minIdleMs', minIdleMs, 0);
    checkWhole('count', count, 1, 1000);
    checkWhole('maxDeliveries', maxDeliveries, 1);
    const k = this.keys;
    const args = [this.group, consumer, String(minIdleMs), String(count), String(maxDeliveries)];
    const [dead, claimed, skipped] = await this.#script('reclaim', [k.jobs, k.dlq, k.stats], args, 'reclaim');
    return {
      deadLettered: Number(dead),
      jobs: (claimed ?? []).filter(Array.isArray).map(([id, fields]) => jobOf(id, fields)),
      // Crash loops the DLQ refused: still pending, tried again after minIdleMs.
      skipped: (skipped ?? []).filter(Array.isArray).map(([id, reason]) => ({ entryId: text(id), reason: text(reason) })),
    };
  }

  /**
   * Keeps entries pending to consumer from being reclaimed, without
   * delivering them again (XCLAIM ... JUSTID resets their idle time). Returns,
   * per entry, whether consumer holds it: false for an entry pending to
   * another consumer (left alone) or no longer pending. Redis runs it when it
   * refuses ack, retry and dead_letter for lack of memory.
   */
  async hold(consumer, entries) {
    checkString('consumer', consumer);
    if (!Array.isArray(entries) || entries.length > 1000) {
      throw new TypeError(`Expected \`entries\` to be an array of at most 1000 entry ids or jobs (got ${show(entries)})`);
    }
    if (entries.length === 0) return [];
    const ids = entries.map(entryId);
    const reply = await this.#script('hold', [this.keys.jobs], [this.group, consumer, ...ids], 'hold');
    if (!Array.isArray(reply) || reply.length !== ids.length) {
      throw this.#error('hold', new Error(`unexpected reply for ${ids.length} entries`));
    }
    return reply.map((v) => Number(v) === 1);
  }

  /**
   * Moves at most limit dead letters (with reason, unless '', and of job
   * type `type`, unless absent) back to the stream, attempt reset. Returns how many.
   */
  async replay(options = {}) {
    const { limit = 1000, reason = '', type } = options;
    if (limit !== Infinity) checkWhole('limit', limit, 1);
    if (typeof reason !== 'string') throw new TypeError(`Expected \`reason\` to be a string (got ${show(reason)})`);
    if (type !== undefined) checkJobType('type', type);
    const actor = checkActor(options.actor);
    const k = this.keys;
    // With an actor, each dead letter replayed is recorded first in the
    // audit (replay.lua).
    const keys = actor ? [k.dlq, k.jobs, k.stats, auditKey(k)] : [k.dlq, k.jobs, k.stats];
    let moved = 0;
    let cursor = '-';
    while (moved < limit) {
      const batch = Math.min(limit - moved, 1000);
      const args = [String(batch), reason, cursor, String(batch * 10), type ?? ''];
      if (actor) args.push('', '', actor);
      const [n, next] = await this.#script('replay', keys, args, 'replay');
      moved += Number(n);
      cursor = text(next);
      if (cursor === '0') break;
    }
    return moved;
  }

  /** The queue's sizes, read live, and its counters. */
  async stats() {
    const k = this.keys;
    const send = (args) => this.#send(args, args[1]).then((v) => ({ v }), (e) => ({ e }));
    const [jobs, pending, delayed, dlq, hash] = await Promise.all([
      send(['XLEN', k.jobs]),
      send(['XPENDING', k.jobs, this.group]),
      send(['ZCARD', k.delayed]),
      send(['XLEN', k.dlq]),
      send(['HGETALL', k.stats]),
    ]);
    for (const r of [jobs, pending, delayed, dlq, hash]) {
      // NOGROUP: no group yet, so nothing is pending.
      if (r.e && !(r === pending && /NOGROUP/.test(r.e?.message))) throw this.#error('stats', r.e);
    }
    const counters = {};
    for (const [f, v] of pairs(hash.v)) counters[text(f)] = Number(text(v));
    const p = pending.e ? 0 : Array.isArray(pending.v) ? pending.v[0] : 0;
    return { jobs: Number(jobs.v), pending: Number(p), delayed: Number(delayed.v), dlq: Number(dlq.v), counters };
  }

  /**
   * Applies the outcome of running job: error is what it threw (or a failed
   * fetch Response), null or undefined for a success. A success is acked; a
   * failure is classified as retry() does and decided by policy, then moved to
   * the delayed set or the DLQ; a malformed job is dead-lettered (malformed).
   */
  async apply(job, error, policy, options = {}) {
    if (job === null || typeof job !== 'object' || typeof job.entryId !== 'string' || job.entryId === '') {
      throw new TypeError('Expected `job` to be a job from read(), reclaim() or work()');
    }
    checkPolicy(policy);
    if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
    const { classify, nowMs, random } = options;
    checkFunction('classify', classify, true);
    if (nowMs !== undefined && !Number.isFinite(nowMs)) {
      throw new TypeError(`Expected \`nowMs\` to be a finite number (got ${show(nowMs)})`);
    }
    if (random !== undefined && typeof random !== 'number') {
      throw new TypeError(`Expected \`random\` to be a number (got ${show(random)})`);
    }

    return applyPlan(this, job, planFor(job, error, policy, { classify, nowMs, random }));
  }

  /**
   * Consumes the queue until signal aborts: reads jobs, runs handler and
   * applies each outcome, promotes due retries and reclaims crashed
   * consumers' entries. Resolves once the jobs it read are all applied.
   */
  async work(policy, handler, options = {}) {
    await work(this, policy, handler, options);
  }
}

// -- jobs and replies (RESP2 or RESP3, strings or Buffers) ----------------------

function jobsOf(reply) {
  // RESP2: [[stream, [[id, fields], ...]]]; RESP3: {stream: [[id, fields], ...]},
  // which ioredis 6 gives flat by default: [stream, [[id, fields], ...]].
  if (reply === null || reply === undefined) return [];
  const nested = Array.isArray(reply) && Array.isArray(reply[0]);
  const streams = nested ? reply.map((s) => s[1]) : [...pairs(reply)].map(([, entries]) => entries);
  const jobs = [];
  for (const entries of streams) for (const [id, fields] of entries ?? []) jobs.push(jobOf(id, fields));
  return jobs;
}

function jobOf(entryId, raw) {
  const fields = {};
  // Each name's last value, by the name's bytes: the fields JSON of a plain entry.
  const last = new Map();
  for (const [k, v] of pairs(raw)) {
    const key = text(k);
    // A field called __proto__ is data, not a prototype.
    Object.defineProperty(fields, key, { value: text(v), enumerable: true, writable: true, configurable: true });
    const name = raw8(k);
    last.set(name.toString('latin1'), [name, raw8(v)]);
  }
  const eid = text(entryId);
  if (isPlain(fields)) {
    // A producer that knows nothing of backstop (queue/redisqueue/README.md, "Plain
    // producers"): attempt 1 of the job called by its entry id, enqueued at
    // the entry's time; past 2^53 - 1 ms, malformed.
    const first = whole(/^(\d+)-/.exec(eid)?.[1]);
    return {
      entryId: eid,
      id: eid,
      attempt: 1,
      firstEnqueuedMs: first ?? 0,
      payload: Object.hasOwn(fields, 'payload') ? fields.payload : text(fieldsJSON(last.values())),
      lastError: '',
      lastReason: '',
      type: fields.type ?? '',
      prevDelayMs: 0,
      malformed: first === null,
      fields,
    };
  }
  const id = fields.id ?? '';
  // The attempt as retry.lua accepts it: digits, 1..1e14 - 1.
  const attempt = /^[1-9]\d{0,13}$/.test(fields.attempt) ? Number(fields.attempt) : null;
  const first = whole(fields.first_enqueued_ms);
  return {
    entryId: eid,
    id,
    attempt: attempt ?? 0,
    firstEnqueuedMs: first ?? 0,
    payload: fields.payload ?? '',
    lastError: fields.last_error ?? '',
    lastReason: fields.last_reason ?? '',
    // The job type ('' untyped); one written by someone else may not be valid.
    type: fields.type ?? '',
    prevDelayMs: Math.max(0, whole(fields.prev_delay_ms) ?? 0),
    // Its due time, when promote moved it (0: unknown): the retry latency.
    dueMs: whole(fields.due_ms) ?? 0,
    malformed: id === '' || attempt === null || first === null,
    fields,
  };
}

// An entry is plain when it has none of the fields a backstop job has.
const JOB_FIELDS = ['id', 'attempt', 'first_enqueued_ms', 'malformed_delayed_member'];
function isPlain(fields) {
  return !JOB_FIELDS.some((f) => Object.hasOwn(fields, f));
}

// The [key, value] pairs of a flat RESP2 array, a Map or an object.
function* pairs(v) {
  if (Array.isArray(v)) {
    for (let i = 0; i + 1 < v.length; i += 2) yield [v[i], v[i + 1]];
  } else if (v instanceof Map) {
    yield* v;
  } else if (v !== null && typeof v === 'object') {
    yield* Object.entries(v);
  }
}

function text(v) {
  if (typeof v === 'string') return v;
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('utf8');
  return v === null || v === undefined ? '' : String(v);
}

function whole(s) {
  if (typeof s !== 'string' || !/^-?\d{1,16}$/.test(s)) return null;
  const n = Number(s);
  return Number.isSafeInteger(n) ? n : null;
}

// -- arguments ---------------------------------------------------------------------

function bytes(payload) {
  if (payload === null || payload === undefined) return '';
  if (typeof payload === 'string' || Buffer.isBuffer(payload)) return payload;
  if (ArrayBuffer.isView(payload)) return Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength);
  throw new TypeError(`Expected \`payload\` to be a string, a Buffer or a Uint8Array (got ${show(payload)})`);
}

// A full stream id, <ms>-<seq>, each part a canonical decimal below 2^64, as
// the scripts want it: Redis reads "5000" as a range in XPENDING.
const ENTRY_ID = /^(0|[1-9]\d{0,19})-(0|[1-9]\d{0,19})$/;
const U64_MAX = (1n << 64n) - 1n;

function entryId(entry) {
  const id = typeof entry === 'object' && entry !== null ? entry.entryId : entry;
  const m = typeof id === 'string' ? ENTRY_ID.exec(id) : null;
  if (m === null || BigInt(m[1]) > U64_MAX || BigInt(m[2]) > U64_MAX) {
    throw new TypeError(`Expected \`entry\` to be a stream entry id (<ms>-<seq>) or a job (got ${show(entry)})`);
  }
  return id;
}

function checkKeys(keys) {
  if (keys === null || typeof keys !== 'object') {
    throw new TypeError('Expected `keys` to be an object {jobs, delayed, dlq, stats}');
  }
  for (const k of ['jobs', 'delayed', 'dlq', 'stats']) checkString(`keys.${k}`, keys[k]);
  return Object.freeze({ jobs: keys.jobs, delayed: keys.delayed, dlq: keys.dlq, stats: keys.stats });
}

function errorString(v) {
  if (v === undefined || v === null) return '';
  if (typeof v !== 'string') throw new TypeError(`Expected \`lastError\` to be a string (got ${show(v)})`);
  return v;
}
