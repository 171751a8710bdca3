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
  'circuit_open', 'retry_after_too_long', 'reason(11)', 'reason(12)', 'reason(13)', 'reason(14)', 'reason(15)',
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
export async function loadPolicy(config, options = {}, loadDefault) {
  if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
  const bytes = policyBytes(config);
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
    for (let start = 0; start < failures.length; start += BATCH) {
      const n = Math.min(BATCH, failures.length - start);
      let str = n * (RECORD + RESULT);
      inst.reserve(str);
      // Encode the whole chunk first: a bad field throws before any decision.
      for (let i = 0; i < n; i++) str = writeFailure(inst, failures[start + i], i * RECORD, str, start + i);
      let got;
      try {
        got = inst.e.decide_batch(this.h, 0, n, n * RECORD);
      } catch (err) {
        throw inst.crashed(err);
      }
      if (got !== n) throw this.callError(got);
      inst.views();
      const u32 = inst.u32;
      const w = (inst.base + n * RECORD) >> 2;
      for (let i = 0; i < n; i++) {
        const hi = u32[w + 2 * i + 1];
        // Only the first bad record's message is kept by the module; the
        // records after it were decided too.
        if (hi > 0x7fffffff) throw this.recordError(inst.i32[w + 2 * i], start + i);
        out[start + i] = unpack(u32[w + 2 * i], hi);
      }
    }
    return out;
  }

  recordSuccess(nowMs) {
    this.scalar('record_success', nowMs);
  }

  circuitState(nowMs) {
    return CIRCUIT[this.scalar('circuit_state', nowMs)];
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

  recordError(code, index) {
    const msg = this.inst.lastError();
    if (code !== ERR_INPUT) return new Error(`backstop.wasm: decide: ${msg} (code ${code})`);
    // "record 0: invalid failure: attempt: must be >= 1 (got 0)"
    const m = /^(?:record \d+: )?(?:invalid failure: )?([^:]*): ([^]*)$/.exec(msg);
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

function unpack(lo, hi) {
  return {
    action: ACTIONS[(hi >>> 22) & 1],
    delayMs: (hi & 0xffff) * TWO32 + lo,
    reason: REASONS[(hi >>> 16) & 15],
    class: CLASSES[(hi >>> 20) & 3],
  };
}

/**
 * Writes failure f as the record at buffer offset rec, its strings at str,
 * and returns the offset after the strings. An absent now_ms or random comes
 * from the host's clock and Math.random: hosts own time and randomness.
 * Written for speed: the common call has no strings and small numbers.
 */
function writeFailure(inst, f, rec, str, index) {
  if (f === null || typeof f !== 'object') {
    throw new InputError('failure', `must be an object (got ${f === null ? 'null' : typeof f})`, index);
  }
  // One pass over the keys the object has: much faster than probing both
  // spellings of every field when failures come in many shapes, which makes
  // property loads megamorphic. null means absent, as undefined.
  let attempt, elapsed, now, random, prev, http, grpc, method, kind, hint, pushback, key;
  for (const name in f) {
    const v = f[name];
    if (v === null || v === undefined) continue;
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
    }
  }
  let flags = 0;
  if ((hint === undefined || hint === '') && pushback !== undefined && pushback !== '') {
    hint = pushback;
    flags = 2;
  }
  if (key !== undefined && key !== false && key !== '') {
    if (typeof key !== 'string' && key !== true) {
      throw new InputError('idempotency_key', `must be a string (got ${typeof key})`, index);
    }
    flags |= 1;
  }

  const strOff = str;
  let lens = 0; // method_len | kind_len << 16
  let hintLen = 0;
  if (method !== undefined || kind !== undefined || hint !== undefined) {
    method = str16(method, 'method', index);
    kind = str16(kind, 'error_kind', index);
    hint = str16(hint, flags & 2 ? 'grpc_retry_pushback_ms' : 'retry_after', index);
    // Room for the worst case, 3 UTF-8 bytes per UTF-16 unit. This may move
    // the buffer and grow memory, so views and base are read after it.
    inst.reserve(str + 3 * (method.length + kind.length + hint.length));
    inst.views();
    const at = inst.base + str;
    const ml = putString(inst.u8, method, at, 'method', index);
    const kl = putString(inst.u8, kind, at + ml, 'error_kind', index);
    const hl = putString(inst.u8, hint, at + ml + kl, flags & 2 ? 'grpc_retry_pushback_ms' : 'retry_after', index);
    lens = ml | (kl << 16);
    hintLen = hl;
    str += ml + kl + hl;
  } else {
    inst.views();
  }

  const u32 = inst.u32;
  const w = (inst.base + rec) >> 2;
  int64(u32, w, attempt, 'attempt', index);
  int64(u32, w + 2, elapsed, 'elapsed_ms', index);
  int64(u32, w + 4, now === undefined ? Date.now() : now, 'now_ms', index);
  inst.f64[(w >> 1) + 3] = toRandom(random, index);
  int64(u32, w + 8, prev, 'prev_delay_ms', index);
  inst.i32[w + 10] = toInt32(http, 'http_status', index);
  inst.i32[w + 11] = typeof grpc === 'string' ? grpcCode(grpc, index) : toInt32(grpc, 'grpc_code', index);
  u32[w + 12] = flags;
  u32[w + 13] = strOff;
  u32[w + 14] = lens;
  u32[w + 15] = hintLen; // and the reserved u16, 0
  return str;
}

function str16(v, field, index) {
  if (v === undefined || v === null) return '';
  if (typeof v === 'string') return v;
  // A Retry-After of delta-seconds is often at hand as a number.
  if (typeof v === 'number' && field !== 'method' && field !== 'error_kind') return String(v);
  throw new InputError(field, `must be a string (got ${typeof v})`, index);
}

// Writes s at address at and returns its UTF-8 length. Methods, error kinds
// and hints are ASCII, copied directly; anything else goes to encodeInto.
function putString(u8, s, at, field, index) {
  const n = s.length;
  for (let i = 0; i < n; i++) {
    const c = s.charCodeAt(i);
    if (c > 0x7f) {
      const len = encoder.encodeInto(s, u8.subarray(at, at + 3 * n)).written;
      if (len > MAX_STRING) throw new InputError(field, `must be at most ${MAX_STRING} bytes (got ${len})`, index);
      return len;
    }
    u8[at + i] = c;
  }
  if (n > MAX_STRING) throw new InputError(field, `must be at most ${MAX_STRING} bytes (got ${n})`, index);
  return n;
}

// Writes an int64 as two little-endian uint32 words at u32[w] and u32[w+1].
// Small enough to be inlined; the common values never leave the first line.
function int64(u32, w, v, field, index) {
  if (typeof v === 'number' && v >= 0 && v <= Number.MAX_SAFE_INTEGER && Math.floor(v) === v) {
    u32[w] = v >>> 0;
    u32[w + 1] = (v / TWO32) >>> 0;
  } else {
    int64Slow(u32, w, v, field, index);
  }
}

// The rest: absent (0), negatives (two's complement), fractions (dropped
// for times, which often come from performance.now), BigInt, and Numbers
// past the int64 range, which saturate.
function int64Slow(u32, w, v, field, index) {
  if (v === undefined) {
    u32[w] = 0;
    u32[w + 1] = 0;
  } else if (typeof v === 'number') {
    if (!Number.isInteger(v)) {
      if (field === 'attempt' || !Number.isFinite(v)) throw new InputError(field, `must be an integer (got ${v})`, index);
      v = Math.floor(v);
    }
    if (v >= TWO63) {
      u32[w] = 0xffffffff;
      u32[w + 1] = 0x7fffffff;
    } else if (v < -TWO63) {
      u32[w] = 0;
      u32[w + 1] = 0x80000000;
    } else {
      u32[w] = v >>> 0; // ToUint32 is exact modular arithmetic
      u32[w + 1] = Math.floor(v / TWO32) >>> 0;
    }
  } else if (typeof v === 'bigint') {
    if (v > INT64_MAX || v < INT64_MIN) throw new InputError(field, `must fit in 64 bits (got ${v})`, index);
    u32[w] = Number(v & 0xffffffffn);
    u32[w + 1] = Number((v >> 32n) & 0xffffffffn);
  } else {
    throw new InputError(field, `must be an integer (got ${typeof v})`, index);
  }
}

function toBigInt(v, field) {
  if (typeof v === 'bigint') return v;
  if (typeof v === 'number' && Number.isFinite(v)) return BigInt(Math.floor(v));
  throw new InputError(field, `must be an integer (got ${v})`);
}

function toInt32(v, field, index) {
  if (typeof v === 'number' && (v | 0) === v) return v;
  if (v === undefined) return 0;
  if (typeof v === 'bigint' && BigInt.asIntN(32, v) === v) return Number(v);
  throw new InputError(field, `must be a 32-bit integer (got ${typeof v === 'number' || typeof v === 'bigint' ? v : typeof v})`, index);
}

function grpcCode(v, index) {
  const code = GRPC_CODES.get(v.toUpperCase());
  if (code === undefined) throw new InputError('grpc_code', `unknown gRPC status name ${JSON.stringify(v)}`, index);
  return code;
}

// The jitter draw: a number (the module clamps it into [0, 1), NaN too), or
// the vectors' "NaN" / "Infinity" / "-Infinity".
function toRandom(v, index) {
  if (typeof v === 'number') return v;
  if (typeof v === 'bigint') return Number(v);
  if (v === undefined || v === null) return Math.random();
  if (v === 'NaN') return NaN;
  if (v === 'Infinity' || v === '+Infinity') return Infinity;
  if (v === '-Infinity') return -Infinity;
  throw new InputError('random', `must be a number, "NaN", "Infinity" or "-Infinity" (got ${JSON.stringify(v)})`, index);
}
