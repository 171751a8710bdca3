// Policy handles and the hot path. A decision goes through decide_batch with
// one record: every parameter is an i32, so no BigInt is created (i64
// parameters would need one each, and BigInts are slow). The failure's
// fields, where each goes and the packed words come from the contract
// (contract.gen.js); this file converts each *type* of field.
import * as C from './contract.gen.js';
import { InputError } from './errors.js';
import { getInstance } from './instance.js';

const { ERR_HANDLE, ERR_INPUT, MAX_STRING } = C;
const { size: RECORD, resultSize: RESULT, fields: R } = C.RECORD;
const BATCH = 256; // records per decide_batch call in decideMany
const TWO32 = 4294967296;
const TWO63 = 9223372036854775808;
const INT64_MAX = 0x7fffffffffffffffn;
const INT64_MIN = -0x8000000000000000n;

export const GRPC_CODES = new Map(
  [
    'OK', 'CANCELLED', 'UNKNOWN', 'INVALID_ARGUMENT', 'DEADLINE_EXCEEDED', 'NOT_FOUND', 'ALREADY_EXISTS',
    'PERMISSION_DENIED', 'RESOURCE_EXHAUSTED', 'FAILED_PRECONDITION', 'ABORTED', 'OUT_OF_RANGE',
    'UNIMPLEMENTED', 'INTERNAL', 'UNAVAILABLE', 'DATA_LOSS', 'UNAUTHENTICATED',
  ].map((name, code) => [name, code]),
);

// policy.MaxFileBytes (docs/policy.md, "Limits"); a test pins it to the module's.
export const MAX_POLICY_BYTES = 64 << 10;

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
    // on_open never changes: read once.
    this.onOpen = C.ON_OPEN_NAMES[inst.call(() => inst.e.policy_on_open(h))];
    // Lints never change either: the module answers bits, the schema's
    // table (contract.gen.js) spells them out; each is a process warning.
    this.lints = C.lintsOf(inst.call(() => inst.e.policy_lints(h)));
    for (const l of this.lints) {
      process.emitWarning(`${l.field}: ${l.code}: ${l.message}`, { type: 'BackstopLintWarning', code: l.code });
    }
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
    return C.unpackDecision(inst.u32[w], hi);
  }

  decideMany(failures) {
    if (!Array.isArray(failures)) throw new TypeError('Expected `failures` to be an array');
    if (this.h === 0) throw closed();
    const inst = this.inst;
    const out = new Array(failures.length);
    let first; // the InputError of the first invalid failure
    const fail = (i, err) => {
      out[i] = null;
      if (first === undefined || i < first.index) first = err;
    };
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
          fail(i, err);
        }
      }
      if (at.length === 0) continue;
      let got;
      try {
        got = inst.e.decide_batch(this.h, 0, at.length, n * RECORD);
      } catch (err) {
        throw inst.crashed(err);
      }
      if (got !== at.length) throw this.callError(got);
      inst.views();
      const w = (inst.base + n * RECORD) >> 2;
      let named = false;
      for (let j = 0; j < at.length; j++) {
        const hi = inst.u32[w + 2 * j + 1];
        if (hi <= 0x7fffffff) {
          out[at[j]] = C.unpackDecision(inst.u32[w + 2 * j], hi);
        } else if (named) {
          out[at[j]] = null;
        } else {
          // The module keeps the message of the first bad record of a call.
          named = true;
          const err = this.recordError(inst.i32[w + 2 * j], at[j]);
          if (!(err instanceof InputError)) throw err;
          fail(at[j], err);
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
    this.#call('record_success', now(nowMs));
  }

  circuitState(nowMs) {
    return C.CIRCUIT_STATE_NAMES[this.#call('circuit_state', now(nowMs))];
  }

  /**
   * What is left of the retry budget at nowMs (default: Date.now()), read
   * without changing it: a token bucket's tokens, or the retries a window
   * budget still allows; null when the policy has no budget.
   */
  budgetTokens(nowMs) {
    if (this.h === 0) throw closed();
    if (!this.stateful) return null;
    const b = C.unpackBudget(...halves(this.#call('budget_tokens', now(nowMs))));
    return b.present ? b.milli / 1000 : null;
  }

  /**
   * Permission for one call at nowMs (default: Date.now()), before it is
   * made. A refused call gets retryInMs, the time until the breaker may
   * admit one; an allowed call in half-open is a trial whose outcome must be
   * reported (recordSuccess, or decide for a failure).
   */
  acquire(nowMs) {
    return C.unpackPermit(...halves(this.#call('acquire', now(nowMs))));
  }

  /**
   * How long the attempt starting elapsedMs after the first one started
   * may run, in ms: the policy's attempt_timeout, cut to what is left of
   * max_elapsed; 0 when no timeout applies.
   */
  attemptTimeout(elapsedMs) {
    if (this.h === 0) throw closed();
    return Number(this.#call('attempt_timeout', toBigInt(elapsedMs, 'elapsed_ms')));
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
    const code = C.EVENT_NAMES.indexOf(event);
    if (code < 0) throw new TypeError(`Expected \`event\` to be one of ${C.EVENT_NAMES.join(', ')} (got ${describe(event)})`);
    const inst = this.inst;
    if (typeof inst.raw.outcome !== 'function') throw new Error('backstop.wasm: this module has no outcome export (it is older than this package)');
    let end;
    try {
      end = writeFailure(inst, failure, 0, RECORD, undefined);
    } catch (err) {
      if (event !== 'failure' || !(err instanceof InputError)) throw err;
      return { action: 'dead_letter', reason: 'malformed', class: 'retryable', delayMs: 0, pause: false, count: 'dead_letter', invalid: true, error: err };
    }
    // outcome takes decide's parameters: read them back from the record,
    // and move the strings to offset 0, where decide reads them.
    const dv = new DataView(inst.memory.buffer, inst.base);
    const args = DECIDE_PARAMS.map((name) => dv[GETTERS[R[name].type]](R[name].offset, true));
    inst.u8.copyWithin(inst.base, inst.base + RECORD, inst.base + end);
    const extra = [toBigInt(deliveries, 'deliveries'), toBigInt(maxDeliveries, 'max_deliveries')];
    const o = C.unpackOutcome(...halves(this.#call('outcome', code, ...args, ...extra)));
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

  // Calls export name off the hot path (BigInt is fine there); an invalid
  // input (-3) is an InputError.
  #call(name, ...args) {
    if (this.h === 0) throw closed();
    const inst = this.inst;
    const r = inst.call(() => inst.e[name](this.h, ...args));
    if (r < 0) throw Number(r) === ERR_INPUT ? this.recordError(ERR_INPUT, undefined) : this.callError(Number(r));
    return r;
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

// decide's parameters after the handle, by record field (outcome's too).
const DECIDE_PARAMS = ['attempt', 'http_status', 'grpc_code', 'elapsed_ms', 'now_ms', 'random', 'prev_delay_ms', 'flags', 'method_len', 'kind_len', 'hint_len'];
const GETTERS = { i64: 'getBigInt64', f64: 'getFloat64', i32: 'getInt32', u32: 'getUint32', u16: 'getUint16' };

function closed() {
  return new Error('backstop: the policy is closed');
}

// A packed word's low and high 32 bits.
function halves(w) {
  return [Number(w & 0xffffffffn), Number(w >> 32n)];
}

// now_ms of the calls off the hot path: default the host's clock.
function now(v) {
  return v === undefined ? BigInt(Date.now()) : toBigInt(v, 'now_ms');
}

// The encoder's scratch, so the hot path allocates nothing: the record
// being built, each string slot's value, and the UTF-8 bytes of the slots
// filled (their lengths are in the record).
const scratch = new ArrayBuffer(RECORD);
const s32 = new Uint32Array(scratch);
const si32 = new Int32Array(scratch);
const s16 = new Uint16Array(scratch);
const sf64 = new Float64Array(scratch);
const slots = new Array(C.STRINGS.length);
const LEN_AT = Int32Array.from(C.STRINGS, (s) => R[`${s}_len`].offset >> 1); // each slot's length, in s16
const WORDS = RECORD >> 2;
const FLAGS_AT = R.flags.offset >> 2;
const STR_AT = R.str_off.offset >> 2;
let strBytes = 0;

/**
 * Writes failure f as the record at buffer offset rec, its strings at str,
 * and returns the offset after the strings. Throws the InputError of the
 * first invalid field, in the order of every host (the contract's), before
 * writing anything. No loop over fields or slots here: the common failure
 * has a few numbers and no string.
 */
function writeFailure(inst, f, rec, str, index) {
  if (f === null || typeof f !== 'object' || Array.isArray(f)) {
    throw new InputError('failure', `must be an object (got ${describe(f)})`, index);
  }
  // Absent fields are 0 (the scratch is left zeroed, unless a field threw);
  // the contract's per-field code converts the others into the scratch
  // record and string slots, and returns the flags.
  strBytes = 0;
  try {
    s32[FLAGS_AT] = convert(f, index);
  } catch (err) {
    s32.fill(0);
    throw err;
  }
  s32[STR_AT] = str;
  // Reserving may move the buffer and grow memory, so views and base are
  // read after it.
  if (strBytes > 0) {
    inst.reserve(str + strBytes);
    inst.views();
    str = putStrings(inst.u8, inst.base, str);
  } else {
    inst.views();
  }
  const u32 = inst.u32;
  const w = (inst.base + rec) >> 2;
  for (let i = 0; i < WORDS; i += 2) {
    u32[w + i] = s32[i];
    u32[w + i + 1] = s32[i + 1];
    sf64[i >> 1] = 0; // both words: +0 is all zero bits
  }
  return str;
}

// Writes the filled string slots, one after another, at buffer offset str,
// and returns the offset after them.
function putStrings(u8, base, str) {
  for (let s = 0; s < LEN_AT.length; s++) {
    putString(u8, slots[s], base + str, s16[LEN_AT[s]]);
    str += s16[LEN_AT[s]];
  }
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

// -- one converter per type of field ------------------------------------------
// The contract's generated code calls them for each field present (null
// means absent too), as (value, name, record offset, string slot, flag
// mask, time, index); the string and flag ones return the flag bits they
// set. Each keeps its common case small, to be inlined there.

// int64: an integral Number or a BigInt; a time drops its fraction, as it
// often comes from performance.now.
function int64(v, field, at, slot, mask, time, index) {
  const w = at >> 2;
  if (typeof v === 'number' && v >= 0 && v <= Number.MAX_SAFE_INTEGER && Math.floor(v) === v) {
    s32[w] = v >>> 0;
    s32[w + 1] = (v / TWO32) >>> 0;
  } else {
    int64Slow(v, field, time, w, index);
  }
}

// The rest of int64, out of line: the fast paths above are small enough to
// be inlined into the generated code.
function int64Slow(v, field, time, w, index) {
  if (v === undefined || v === null) {
    s32[w] = 0;
    s32[w + 1] = 0;
  } else if (typeof v === 'number') {
    if (!Number.isFinite(v) || (!time && !Number.isInteger(v))) {
      throw new InputError(field, `must be an integer (got ${describe(v)})`, index);
    }
    const t = Math.trunc(v);
    if (t >= TWO63 || t < -TWO63) throw new InputError(field, `must fit in 64 bits (got ${describe(v)})`, index);
    s32[w] = t >>> 0; // ToUint32 is exact modular arithmetic
    s32[w + 1] = Math.floor(t / TWO32) >>> 0;
  } else if (typeof v === 'bigint') {
    if (v > INT64_MAX || v < INT64_MIN) throw new InputError(field, `must fit in 64 bits (got ${v})`, index);
    s32[w] = Number(v & 0xffffffffn);
    s32[w + 1] = Number((v >> 32n) & 0xffffffffn);
  } else {
    throw new InputError(field, `must be an integer (got ${describe(v)})`, index);
  }
}

// An int64 parameter off the hot path (an i64 parameter would wrap a
// BigInt past the int64 range), with the rules of the record's, through
// the scratch record.
function toBigInt(v, field) {
  if (v === undefined || v === null) throw new InputError(field, `must be an integer (got ${describe(v)})`);
  int64(v, field, 0, -1, 0, true, undefined);
  const b = BigInt.asIntN(64, (BigInt(s32[1]) << 32n) | BigInt(s32[0]));
  s32[0] = 0;
  s32[1] = 0;
  return b;
}

function int32(v, field, at, slot, mask, time, index) {
  si32[at >> 2] = typeof v === 'number' && (v | 0) === v ? v : toInt32(v, field, 'must be a 32-bit integer', index);
}

function toInt32(v, field, reason, index) {
  if (typeof v === 'number' && (v | 0) === v) return v;
  if (v === undefined || v === null) return 0;
  if (typeof v === 'bigint' && BigInt.asIntN(32, v) === v) return Number(v);
  throw new InputError(field, `${reason} (got ${describe(v)})`, index);
}

// grpc_code: a code, or a status name in any ASCII letter case: only ASCII
// letters fold, as in every host.
function grpcCode(v, field, at, slot, mask, time, index) {
  si32[at >> 2] = typeof v === 'number' && (v | 0) === v ? v : grpcCodeSlow(v, field, index);
}

function grpcCodeSlow(v, field, index) {
  if (typeof v !== 'string') return toInt32(v, field, 'must be a 32-bit integer or a status name', index);
  const code = /^[\x00-\x7f]*$/.test(v) ? GRPC_CODES.get(v.toUpperCase()) : undefined;
  if (code === undefined) throw new InputError(field, `unknown gRPC status name ${quote(v)}`, index);
  return code;
}

// string: a string or bytes (a Uint8Array, such as a Buffer).
function string(v, field, at, slot, mask, time, index) {
  return v === undefined || v === null ? 0 : stringSlow(v, field, slot, mask, index);
}

function stringSlow(v, field, slot, mask, index) {
  if (typeof v !== 'string' && !(v instanceof Uint8Array)) {
    throw new InputError(field, `must be a string (got ${describe(v)})`, index);
  }
  return fill(v, field, slot, mask, index);
}

// hint: the raw value (a string or bytes), or a number of seconds
// (retry_after) or milliseconds (pushback), written as the integer it
// rounds up to; "NaN", "Infinity", "-Infinity" stay malformed.
function hint(v, field, at, slot, mask, time, index) {
  return v === undefined || v === null ? 0 : hintSlow(v, field, slot, mask, index);
}

function hintSlow(v, field, slot, mask, index) {
  if (typeof v === 'number') {
    const c = Math.ceil(v);
    v = !Number.isFinite(v) ? String(v) : Math.abs(c) <= Number.MAX_SAFE_INTEGER ? String(c) : BigInt(c).toString();
  } else if (typeof v === 'bigint') {
    v = v.toString();
  } else if (typeof v === 'boolean' || (typeof v === 'object' && v !== null && !(v instanceof Uint8Array))) {
    throw new InputError(field, `must be a string or a number (got ${describe(v)})`, index);
  }
  return stringSlow(v, field, slot, mask, index);
}

// A string field's value into its slot: the first field to fill a slot wins
// (a Retry-After over a pushback) and sets its flag bit.
function fill(v, field, slot, mask, index) {
  const n = byteLength(v, field, index);
  if (n === 0 || s16[LEN_AT[slot]] !== 0) return 0;
  slots[slot] = v;
  s16[LEN_AT[slot]] = n;
  strBytes += n;
  return mask;
}

// bool: true (the flag bit), false or absent; nothing else, not 1 nor
// "true", as in every host.
function bool(v, field, at, slot, mask, time, index) {
  if (v === undefined || v === null || v === false) return 0;
  if (v === true) return mask;
  throw new InputError(field, `must be a boolean (got ${describe(v)})`, index);
}

// key: whether there is one (the module sees no more).
function key(v, field, at, slot, mask, time, index) {
  if (v === undefined || v === null || v === false || v === '') return 0;
  if (v === true || typeof v === 'string') return mask;
  if (v instanceof Uint8Array) return v.length > 0 ? mask : 0;
  throw new InputError(field, `must be a string or a boolean (got ${describe(v)})`, index);
}

// random: a number (the module clamps it into [0, 1), NaN too), or the
// vectors' "NaN" / "Infinity" / "-Infinity"; absent, Math.random().
function random(v, field, at, slot, mask, time, index) {
  sf64[at >> 3] = typeof v === 'number' ? v : toRandom(v, field, index);
}

function toRandom(v, field, index) {
  if (v === undefined || v === null) return Math.random();
  if (typeof v === 'bigint') return Number(v);
  if (v === 'NaN') return NaN;
  if (v === 'Infinity' || v === '+Infinity') return Infinity;
  if (v === '-Infinity') return -Infinity;
  throw new InputError(field, `must be a number, "NaN", "Infinity" or "-Infinity" (got ${describe(v)})`, index);
}

// The least unknown field name of a failure so far (code point order), and
// the error it gets.
function unknownName(name, least) {
  const u = name.toWellFormed();
  return least === undefined || codePointLess(u, least) ? u : least;
}

function unknownField(name, index) {
  throw new InputError(name, 'unknown field', index);
}

const convert = C.failureConverter({ int64, int32, grpcCode, string, hint, key, random, bool, unknownName, unknownField });

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
