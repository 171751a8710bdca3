// Policy handles and the hot path. A decision goes through decide_batch with
// one 64-byte record: every parameter is an i32, so no BigInt is created
// (i64 parameters would need one each, and BigInts are slow).
import { InputError } from './errors.js';
import { getInstance } from './instance.js';

const ACTIONS = ['retry', 'dead_letter'];
const CLASSES = ['retryable', 'permanent', 'uncertain', 'class(3)'];
const REASONS = [
  'transient', 'retry_after', 'uncertain', 'permanent_error', 'max_attempts_reached',
  'max_elapsed_exceeded', 'uncertain_limit_reached', 'not_idempotent', 'budget_exhausted',
  'circuit_open', 'retry_after_too_long', 'retried_downstream', 'server_declined', 'reason(13)', 'reason(14)', 'reason(15)',
];
const CIRCUIT = ['closed', 'open', 'half_open'];

export const GRPC_CODES = new Map(
  [
    'OK', 'CANCELLED', 'UNKNOWN', 'INVALID_ARGUMENT', 'DEADLINE_EXCEEDED', 'NOT_FOUND', 'ALREADY_EXISTS',
    'PERMISSION_DENIED', 'RESOURCE_EXHAUSTED', 'FAILED_PRECONDITION', 'ABORTED', 'OUT_OF_RANGE',
    'UNIMPLEMENTED', 'INTERNAL', 'UNAVAILABLE', 'DATA_LOSS', 'UNAUTHENTICATED',
  ].map((name, code) => [name, code]),
);

const ERR_HANDLE = -1;
const ERR_INPUT = -3;
const RECORD = 64;
const RESULT = 8;
const MAX_STRING = 0xffff; // string lengths are u16 in a record
const BATCH = 256; // records per decide_batch call in decideMany
const INT64_MAX = 0x7fffffffffffffffn;
const INT64_MIN = -0x8000000000000000n;
const TWO32 = 4294967296;
const TWO63 = 9223372036854775808;

const encoder = new TextEncoder();

// Frees the handles of policies that were dropped without close().
const finalizer =
  typeof FinalizationRegistry === 'function'
    ? new FinalizationRegistry(({ inst, h }) => {
        try {
          if (!inst.dead) inst.call(() => inst.e.policy_free(h));
        } catch {
          // The instance broke; its handles went with it.
        }
      })
    : null;

/**
 * Loads a policy: a preset name, a JSON or YAML string, a plain object or
 * bytes. Each call returns a new handle with its own budget and breaker.
 */
// policy.MaxFileBytes (docs/policy.md, "Limits"); a test pins it to the module's.
export const MAX_POLICY_BYTES = 64 << 10;

export async function loadPolicy(config, options = {}, loadDefault) {
  if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
  // The module refuses a policy over MAX_POLICY_BYTES with a PolicyError;
  // a byte more than that is all it needs to say so, whatever the size.
  const bytes = policyBytes(config).subarray(0, MAX_POLICY_BYTES + 1);
  const inst = await getInstance(options.wasm, loadDefault);
  // A bare word is never a policy document: load it as a preset, so a typo
  // gets "unknown preset" and the list of presets, not a parse error.
  const preset = typeof config === 'string' && /^[\w.-]*$/.test(config);
  return new Policy(inst, inst.load(bytes, preset));
}

function policyBytes(config) {
  if (typeof config === 'string') return encoder.encode(config);
  if (config instanceof Uint8Array) return config;
  if (config instanceof ArrayBuffer) return new Uint8Array(config);
  if (ArrayBuffer.isView(config)) return new Uint8Array(config.buffer, config.byteOffset, config.byteLength);
  if (config !== null && typeof config === 'object' && !Array.isArray(config)) {
    return encoder.encode(JSON.stringify(config));
  }
  throw new TypeError(
    `Expected a preset name, a JSON or YAML string, a policy object or bytes (got ${config === null ? 'null' : typeof config})`,
  );
}

class Policy {
  constructor(inst, h) {
    this.inst = inst;
    this.h = h;
    this.stateful = inst.call(() => inst.e.policy_stateful(h)) === 1;
    // on_open never changes: read once. 0 defer, 1 dead_letter.
    this.onOpen = inst.call(() => inst.e.policy_on_open(h)) === 1 ? 'dead_letter' : 'defer';
    finalizer?.register(this, { inst, h }, this);
  }

  decide(failure) {
    const inst = this.inst;
    if (this.h === 0) throw closed();
    writeFailure(inst, failure, 0, RECORD + RESULT, undefined);
    let n;
    try {
      n = inst.e.decide_batch(this.h, 0, 1, RECORD);
    } catch (err) {
      throw inst.crashed(err);
    }
    if (n !== 1) throw this.callError(n);
    inst.views();
    const w = (inst.base + RECORD) >> 2;
    const hi = inst.u32[w + 1];
    if (hi > 0x7fffffff) throw this.recordError(inst.i32[w], undefined);
    return unpack(inst.u32[w], hi);
  }

  decideMany(failures) {
    if (!Array.isArray(failures)) throw new TypeError('Expected `failures` to be an array');
    if (this.h === 0) throw closed();
    const inst = this.inst;
    const out = new Array(failures.length);
    let first; // the InputError of the first invalid failure
    for (let start = 0; start < failures.length; start += BATCH) {
      const n = Math.min(BATCH, failures.length - start);
      let str = n * (RECORD + RESULT);
      inst.reserve(str);
      // Encode the chunk first. An invalid failure gets no record: the
      // module never sees it, as with decide().
      const at = []; // the failure index of each record
      for (let i = start; i < start + n; i++) {
        try {
          str = writeFailure(inst, failures[i], at.length * RECORD, str, i);
          at.push(i);
        } catch (err) {
          if (!(err instanceof InputError)) throw err;
          out[i] = null;
          if (first === undefined || i < first.index) first = err;
        }
      }
      const k = at.length;
      if (k === 0) continue;
      let got;
      try {
        got = inst.e.decide_batch(this.h, 0, k, n * RECORD);
      } catch (err) {
        throw inst.crashed(err);
      }
      if (got !== k) throw this.callError(got);
      inst.views();
      const u32 = inst.u32;
      const w = (inst.base + n * RECORD) >> 2;
      let named = false;
      for (let j = 0; j < k; j++) {
        const hi = u32[w + 2 * j + 1];
        if (hi <= 0x7fffffff) {
          out[at[j]] = unpack(u32[w + 2 * j], hi);
          continue;
        }
        out[at[j]] = null;
        // The module keeps the message of the first bad record of a call.
        if (!named) {
          named = true;
          const err = this.recordError(inst.i32[w + 2 * j], at[j]);
          if (!(err instanceof InputError)) throw err;
          if (first === undefined || at[j] < first.index) first = err;
        }
      }
    }
    if (first !== undefined) {
      first.decisions = out;
      throw first;
    }
    return out;
  }

  recordSuccess(nowMs) {
    this.scalar('record_success', nowMs);
  }

  circuitState(nowMs) {
    return CIRCUIT[this.scalar('circuit_state', nowMs)];
  }

  /**
   * What is left of the retry budget at nowMs (default: Date.now()), read
   * without changing it: a token bucket's tokens, or the retries a window
   * budget still allows; null when the policy has no budget.
   */
  budgetTokens(nowMs) {
    if (this.h === 0) throw closed();
    if (!this.stateful) return null;
    const w = this.wide('budget_tokens', nowMs);
    if (((w >> 48n) & 1n) === 0n) return null;
    return Number(w & 0xffffffffffffn) / 1000;
  }

  /**
   * Permission for one call at nowMs (default: Date.now()), before it is
   * made. A refused call gets retryInMs, the time until the breaker may
   * admit one; an allowed call in half-open is a trial whose outcome must be
   * reported (recordSuccess, or decide for a failure).
   */
  acquire(nowMs) {
    const w = this.wide('acquire', nowMs);
    return {
      allowed: ((w >> 50n) & 1n) === 1n,
      retryInMs: Number(w & 0xffffffffffffn),
      state: CIRCUIT[Number((w >> 48n) & 3n)],
    };
  }

  /**
   * How long the attempt starting elapsedMs after the first one started
   * may run, in ms: the policy's attempt_timeout, cut to what is left of
   * max_elapsed; 0 when no timeout applies.
   */
  attemptTimeout(elapsedMs) {
    if (this.h === 0) throw closed();
    return Number(this.wide('attempt_timeout', toBigInt(elapsedMs, 'elapsed_ms')));
  }

  /**
   * What a queue worker does about one event of a job (wasm/ABI.md,
   * "outcome"): {event: 'before' | 'success' | 'failure' | 'delivered',
   * nowMs, the failure's fields (failure), deliveries and maxDeliveries
   * (delivered)} → {action, reason, delayMs, pause, count, invalid}, and
   * error (an InputError) when invalid: a failure refused as invalid input
   * is dead-lettered as malformed, not thrown.
   */
  outcome(e) {
    if (this.h === 0) throw closed();
    if (e === null || typeof e !== 'object') throw new TypeError(`Expected \`event\` to be an object (got ${describe(e)})`);
    const { event, deliveries = 0, maxDeliveries = 0, ...failure } = e;
    const code = EVENTS.indexOf(event);
    if (code < 0) throw new TypeError(`Expected \`event\` to be one of ${EVENTS.join(', ')} (got ${describe(event)})`);
    const inst = this.inst;
    if (typeof inst.raw.outcome !== 'function') throw new Error('backstop.wasm: this module has no outcome export (it is older than this package)');
    let end;
    try {
      end = writeFailure(inst, failure, 0, RECORD, undefined);
    } catch (err) {
      if (code !== FAILURE_EVENT || !(err instanceof InputError)) throw err;
      return { action: 'dead_letter', reason: 'malformed', delayMs: 0, pause: false, count: 'dead_letter', invalid: true, error: err };
    }
    const dv = new DataView(inst.memory.buffer, inst.base);
    const args = OUTCOME_PARAMS.map(([off, type]) => dv[`get${type}`](off, true));
    inst.u8.copyWithin(inst.base, inst.base + RECORD, inst.base + end); // the strings, at offset 0
    const d = toBigInt(deliveries, 'deliveries');
    const max = toBigInt(maxDeliveries, 'max_deliveries');
    const w = inst.call(() => inst.e.outcome(this.h, code, ...args, d, max));
    if (w < 0n) throw w === BigInt(ERR_INPUT) ? this.recordError(ERR_INPUT, undefined) : this.callError(Number(w));
    const o = unpackOutcome(w);
    if (o.invalid) o.error = this.recordError(ERR_INPUT, undefined);
    return o;
  }

  close() {
    if (this.h === 0) return;
    finalizer?.unregister(this);
    const inst = this.inst;
    const h = this.h;
    this.h = 0;
    if (!inst.dead) inst.call(() => inst.e.policy_free(h));
  }

  // Calls an (h, now_ms i64) export; BigInt is fine off the hot path.
  scalar(name, nowMs) {
    if (this.h === 0) throw closed();
    const now = nowMs === undefined ? BigInt(Date.now()) : toBigInt(nowMs, 'now_ms');
    const inst = this.inst;
    const r = inst.call(() => inst.e[name](this.h, now));
    if (r < 0) throw this.callError(r);
    return r;
  }

  // wide is scalar for the exports answering an i64 (acquire,
  // budget_tokens, attempt_timeout), whose bad input is an InputError.
  wide(name, nowMs) {
    if (this.h === 0) throw closed();
    const now = nowMs === undefined ? BigInt(Date.now()) : toBigInt(nowMs, 'now_ms');
    const inst = this.inst;
    const w = inst.call(() => inst.e[name](this.h, now));
    if (w < 0n) throw w === BigInt(ERR_INPUT) ? this.recordError(ERR_INPUT, undefined) : this.callError(Number(w));
    return w;
  }

  recordError(code, index) {
    const msg = this.inst.lastError();
    if (code !== ERR_INPUT) return new Error(`backstop.wasm: decide: ${msg} (code ${code})`);
    // "record 0: invalid failure: attempt: must be >= 1 (got 0)"
    const m = /^(?:record \d+: )?(?:invalid (?:failure|event): )?([^:]*): ([^]*)$/.exec(msg);
    return m ? new InputError(m[1], m[2], index) : new InputError('failure', msg, index);
  }

  callError(code) {
    if (code === ERR_HANDLE) return closed();
    return new Error(`backstop.wasm: ${this.inst.lastError()} (code ${code})`);
  }
}

function closed() {
  return new Error('backstop: the policy is closed');
}

// The outcome export's parameters after the event, read from a record
// (offset, DataView type): decide's, in its order.
const OUTCOME_PARAMS = [[0, 'BigInt64'], [40, 'Int32'], [44, 'Int32'], [8, 'BigInt64'], [16, 'BigInt64'], [24, 'Float64'],
  [32, 'BigInt64'], [48, 'Int32'], [56, 'Uint16'], [58, 'Uint16'], [60, 'Uint16']];
const EVENTS = ['before', 'success', 'failure', 'delivered'];
const FAILURE_EVENT = 2;
const OUTCOME_ACTIONS = ['run', 'ack', 'retry', 'defer', 'dead_letter'];
const COUNTS = ['none', 'success', 'retry', 'dead_letter', 'refused'];
const OUTCOME_REASONS = [...REASONS, 'success', 'malformed', 'crash_loop'];

function unpackOutcome(w) {
  const hi = Number(w >> 32n);
  return {
    action: OUTCOME_ACTIONS[(hi >>> 22) & 7] ?? `action(${(hi >>> 22) & 7})`,
    reason: OUTCOME_REASONS[(hi >>> 16) & 63] ?? `reason(${(hi >>> 16) & 63})`,
    delayMs: Number(w & 0xffffffffffffn),
    pause: ((hi >>> 25) & 1) === 1,
    count: COUNTS[(hi >>> 26) & 7] ?? `count(${(hi >>> 26) & 7})`,
    invalid: ((hi >>> 29) & 1) === 1,
  };
}

function unpack(lo, hi) {
  return {
    action: ACTIONS[(hi >>> 22) & 1],
    delayMs: (hi & 0xffff) * TWO32 + lo,
    reason: REASONS[(hi >>> 16) & 15],
    class: CLASSES[(hi >>> 20) & 3],
  };
}

// Converted int64 fields, as little-endian uint32 pairs: attempt, elapsed,
// now, prev. A scratch area, so the hot path allocates nothing.
const ints = new Uint32Array(8);

/**
 * Writes failure f as the record at buffer offset rec, its strings at str,
 * and returns the offset after the strings. An absent now_ms or random comes
 * from the host's clock and Math.random: hosts own time and randomness.
 * Throws the InputError of the first invalid field, in the order of every
 * host, before writing anything. Written for speed: the common call has no
 * strings and small numbers.
 */
function writeFailure(inst, f, rec, str, index) {
  if (f === null || typeof f !== 'object' || Array.isArray(f)) {
    throw new InputError('failure', `must be an object (got ${describe(f)})`, index);
  }
  // One pass over the keys the object has: much faster than probing both
  // spellings of every field when failures come in many shapes, which makes
  // property loads megamorphic. null means absent, as undefined; a name
  // with an undefined value is not there at all.
  let attempt, elapsed, now, random, prev, http, grpc, method, kind, hint, pushback, key, down, declined, unknown;
  for (const name in f) {
    const v = f[name];
    if (v === undefined) continue;
    switch (name) {
      case 'attempt': attempt = v; break;
      case 'http_status': case 'httpStatus': http = v; break;
      case 'grpc_code': case 'grpcCode': grpc = v; break;
      case 'error_kind': case 'errorKind': kind = v; break;
      case 'retry_after': case 'retryAfter': hint = v; break;
      case 'grpc_retry_pushback_ms': case 'grpcRetryPushbackMs': pushback = v; break;
      case 'method': method = v; break;
      case 'idempotency_key': case 'idempotencyKey': key = v; break;
      case 'elapsed_ms': case 'elapsedMs': elapsed = v; break;
      case 'now_ms': case 'nowMs': now = v; break;
      case 'random': random = v; break;
      case 'prev_delay_ms': case 'prevDelayMs': prev = v; break;
      case 'retried_downstream': case 'retriedDownstream': down = v; break;
      case 'server_declined': case 'serverDeclined': declined = v; break;
      default: {
        const u = name.toWellFormed();
        if (unknown === undefined || codePointLess(u, unknown)) unknown = u;
      }
    }
  }
  if (unknown !== undefined) throw new InputError(unknown, 'unknown field', index);

  // Convert every field, in order, before writing anything.
  int64(attempt, 'attempt', false, 0, index);
  const httpStatus = toInt32(http, 'http_status', 'must be a 32-bit integer', index);
  const grpcStatus =
    typeof grpc === 'string' ? grpcCode(grpc, index) : toInt32(grpc, 'grpc_code', 'must be a 32-bit integer or a status name', index);
  let kl = 0;
  let hl = 0;
  let pl = 0;
  let ml = 0;
  if (kind !== undefined || hint !== undefined || pushback !== undefined || method !== undefined) {
    kind = toStr(kind, 'error_kind', index);
    kl = byteLength(kind, 'error_kind', index);
    hint = toHint(hint, 'retry_after', index);
    hl = byteLength(hint, 'retry_after', index);
    pushback = toHint(pushback, 'grpc_retry_pushback_ms', index);
    pl = byteLength(pushback, 'grpc_retry_pushback_ms', index);
    method = toStr(method, 'method', index);
    ml = byteLength(method, 'method', index);
  }
  let flags = key === undefined ? 0 : hasKey(key, index);
  int64(elapsed, 'elapsed_ms', true, 2, index);
  if (now === undefined || now === null) now = Date.now();
  int64(now, 'now_ms', true, 4, index);
  random = toRandom(random, index);
  int64(prev, 'prev_delay_ms', true, 6, index);
  if (down !== undefined && down !== null && down !== false) flags |= flag(down, 'retried_downstream', 4, index);
  if (declined !== undefined && declined !== null && declined !== false) flags |= flag(declined, 'server_declined', 8, index);
  if (hl === 0 && pl > 0) {
    hint = pushback;
    hl = pl;
    flags |= 2;
  }

  const strOff = str;
  if (ml + kl + hl > 0) {
    // This may move the buffer and grow memory, so views and base are read
    // after it.
    inst.reserve(str + ml + kl + hl);
    inst.views();
    const at = inst.base + str;
    putString(inst.u8, method, at, ml);
    putString(inst.u8, kind, at + ml, kl);
    putString(inst.u8, hint, at + ml + kl, hl);
    str += ml + kl + hl;
  } else {
    inst.views();
  }

  const u32 = inst.u32;
  const w = (inst.base + rec) >> 2;
  u32[w] = ints[0];
  u32[w + 1] = ints[1];
  u32[w + 2] = ints[2];
  u32[w + 3] = ints[3];
  u32[w + 4] = ints[4];
  u32[w + 5] = ints[5];
  inst.f64[(w >> 1) + 3] = random;
  u32[w + 8] = ints[6];
  u32[w + 9] = ints[7];
  inst.i32[w + 10] = httpStatus;
  inst.i32[w + 11] = grpcStatus;
  u32[w + 12] = flags;
  u32[w + 13] = strOff;
  u32[w + 14] = ml | (kl << 16);
  u32[w + 15] = hl; // and the reserved u16, 0
  return str;
}

/**
 * How a message shows a value of the wrong type or range, as every host
 * does: true, false, null, a number as String() prints it, an integer in
 * full, or "a string", "bytes", "an array", "an object".
 */
export function describe(v) {
  switch (typeof v) {
    case 'boolean':
    case 'number':
    case 'bigint':
    case 'undefined':
      return String(v);
    case 'string':
      return 'a string';
    case 'object':
      if (v === null) return 'null';
      if (v instanceof Uint8Array) return 'bytes';
      return Array.isArray(v) ? 'an array' : 'an object';
  }
  return `a ${typeof v}`;
}

/** s as a JSON string, as every host's messages quote it. */
export function quote(s) {
  return JSON.stringify(s.toWellFormed()).replace(/[\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16)}`);
}

/**
 * a < b in code point order, as Go and Python compare strings (JavaScript's
 * < compares UTF-16 units, which orders U+E000..U+FFFF after the astral
 * planes).
 */
export function codePointLess(a, b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.codePointAt(i);
    const y = b.codePointAt(i);
    if (x !== y) return x < y;
    if (x > 0xffff) i++;
  }
  return a.length < b.length;
}

// Converts an int64 field into ints[slot], ints[slot + 1]: an integral
// Number or a BigInt; times (truncate set) drop fractions, as they often
// come from performance.now.
function int64(v, field, truncate, slot, index) {
  if (typeof v === 'number' && v >= 0 && v <= Number.MAX_SAFE_INTEGER && Math.floor(v) === v) {
    ints[slot] = v >>> 0;
    ints[slot + 1] = (v / TWO32) >>> 0;
  } else {
    int64Slow(v, field, truncate, slot, index);
  }
}

function int64Slow(v, field, truncate, slot, index) {
  if (v === undefined || v === null) {
    ints[slot] = 0;
    ints[slot + 1] = 0;
  } else if (typeof v === 'number') {
    if (!Number.isFinite(v) || (!truncate && !Number.isInteger(v))) {
      throw new InputError(field, `must be an integer (got ${describe(v)})`, index);
    }
    const t = Math.trunc(v);
    if (t >= TWO63 || t < -TWO63) throw new InputError(field, `must fit in 64 bits (got ${describe(v)})`, index);
    ints[slot] = t >>> 0; // ToUint32 is exact modular arithmetic
    ints[slot + 1] = Math.floor(t / TWO32) >>> 0;
  } else if (typeof v === 'bigint') {
    if (v > INT64_MAX || v < INT64_MIN) throw new InputError(field, `must fit in 64 bits (got ${v})`, index);
    ints[slot] = Number(v & 0xffffffffn);
    ints[slot + 1] = Number((v >> 32n) & 0xffffffffn);
  } else {
    throw new InputError(field, `must be an integer (got ${describe(v)})`, index);
  }
}

// A time for recordSuccess and circuitState, with the rules of decide's
// now_ms (an i64 parameter would wrap a BigInt past the int64 range).
function toBigInt(v, field) {
  let b;
  if (typeof v === 'bigint') b = v;
  else if (typeof v === 'number' && Number.isFinite(v)) b = BigInt(Math.trunc(v));
  else throw new InputError(field, `must be an integer (got ${describe(v)})`);
  if (b > INT64_MAX || b < INT64_MIN) throw new InputError(field, `must fit in 64 bits (got ${describe(v)})`);
  return b;
}

function toInt32(v, field, reason, index) {
  if (typeof v === 'number' && (v | 0) === v) return v;
  if (v === undefined || v === null) return 0;
  if (typeof v === 'bigint' && BigInt.asIntN(32, v) === v) return Number(v);
  throw new InputError(field, `${reason} (got ${describe(v)})`, index);
}

// A gRPC status name in any ASCII letter case: only ASCII letters fold, as
// in every host.
function grpcCode(v, index) {
  const code = /^[\x00-\x7f]*$/.test(v) ? GRPC_CODES.get(v.toUpperCase()) : undefined;
  if (code === undefined) throw new InputError('grpc_code', `unknown gRPC status name ${quote(v)}`, index);
  return code;
}

// A string field: a string or bytes (a Uint8Array, such as a Buffer).
function toStr(v, field, index) {
  if (v === undefined || v === null) return '';
  if (typeof v === 'string' || v instanceof Uint8Array) return v;
  throw new InputError(field, `must be a string (got ${describe(v)})`, index);
}

// A hint: the raw value (a string or bytes), or a number of seconds
// (retry_after) or milliseconds (pushback), written as the integer it
// rounds up to; "NaN", "Infinity", "-Infinity" stay malformed.
function toHint(v, field, index) {
  if (typeof v === 'number') {
    if (!Number.isFinite(v)) return String(v);
    const c = Math.ceil(v);
    return Math.abs(c) <= Number.MAX_SAFE_INTEGER ? String(c) : BigInt(c).toString();
  }
  if (typeof v === 'bigint') return v.toString();
  if (typeof v === 'boolean' || (typeof v === 'object' && v !== null && !(v instanceof Uint8Array))) {
    throw new InputError(field, `must be a string or a number (got ${describe(v)})`, index);
  }
  return toStr(v, field, index);
}

// retried_downstream and server_declined: true (the flag bit), false or
// absent; nothing else, not 1 nor "true", as in every host.
function flag(v, field, bit, index) {
  if (v === true) return bit;
  throw new InputError(field, `must be a boolean (got ${describe(v)})`, index);
}

function hasKey(key, index) {
  if (key === undefined || key === null || key === false || key === '') return 0;
  if (key === true || typeof key === 'string') return 1;
  if (key instanceof Uint8Array) return key.length > 0 ? 1 : 0;
  throw new InputError('idempotency_key', `must be a string or a boolean (got ${describe(key)})`, index);
}

// The UTF-8 length of a string field (a lone surrogate becomes U+FFFD, 3
// bytes, as TextEncoder writes it), at most MAX_STRING.
function byteLength(v, field, index) {
  let n = v.length;
  if (typeof v === 'string') {
    for (let i = 0; i < v.length; i++) {
      const c = v.charCodeAt(i);
      if (c < 0x80) continue;
      if (c < 0x800) {
        n += 1;
      } else if (c >= 0xd800 && c <= 0xdbff && (v.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
        n += 2; // a pair: 2 units, 4 bytes
        i++;
      } else {
        n += 2;
      }
    }
  }
  if (n > MAX_STRING) throw new InputError(field, `must be at most ${MAX_STRING} bytes (got ${n})`, index);
  return n;
}

// Writes a string field of len UTF-8 bytes at address at. Methods, error
// kinds and hints are ASCII (len equals the length), copied directly;
// anything else goes to encodeInto.
function putString(u8, v, at, len) {
  if (len === 0) return;
  if (typeof v !== 'string') {
    u8.set(v, at);
  } else if (len === v.length) {
    for (let i = 0; i < len; i++) u8[at + i] = v.charCodeAt(i);
  } else {
    encoder.encodeInto(v, u8.subarray(at, at + len));
  }
}

// The jitter draw: a number (the module clamps it into [0, 1), NaN too), or
// the vectors' "NaN" / "Infinity" / "-Infinity".
function toRandom(v, index) {
  if (typeof v === 'number') return v;
  if (v === undefined || v === null) return Math.random();
  if (typeof v === 'bigint') return Number(v);
  if (v === 'NaN') return NaN;
  if (v === 'Infinity' || v === '+Infinity') return Infinity;
  if (v === '-Infinity') return -Infinity;
  throw new InputError('random', `must be a number, "NaN", "Infinity" or "-Infinity" (got ${describe(v)})`, index);
}
