// Policy handles and the hot path. A decision goes through decide_batch with
// one record: every parameter is an i32, so no BigInt is created (i64
// parameters would need one each, and BigInts are slow). A failure the
// record's encoder does not take goes to decide_value as a value, which the
// core converts and checks. Both encoders and the packed words are the
// contract's (contract.gen.js).
import * as C from './contract.gen.js';
import { InputError } from './errors.js';
import { getInstance } from './instance.js';

const { ERR_HANDLE, ERR_INPUT, describe, halves, toBigInt, writeFailure, writeValue } = C;
const { size: RECORD, resultSize: RESULT } = C.RECORD;
const BATCH = 256; // records per decide_batch call in decideMany

// policy.MaxFileBytes (docs/policy.md, "Limits"); a test pins it to the module's.
export const MAX_POLICY_BYTES = 64 << 10;

const encoder = new TextEncoder();
const warned = new Set(); // lint warnings already emitted (texts from the schema's table: few)

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

// loadPolicy and the Policy methods are documented in index.d.ts.
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

class Policy extends C.PolicyCalls {

  constructor(inst, h) {
    super();
    this.inst = inst;
    this.h = h;
    // The facts never change: read once. The module answers lint bits, the
    // schema's table (contract.gen.js) spells them out; each is a process warning.
    C.readFacts(this, (name) => inst.call(() => inst.e[name](h)));
    // Once per text and process, as Node's deprecations: a policy loaded
    // per tenant or per request would otherwise flood stderr.
    for (const l of this.lints) {
      const text = `${l.field}: ${l.code}: ${l.message}`;
      if (warned.has(text)) continue;
      warned.add(text);
      process.emitWarning(text, { type: 'BackstopLintWarning', code: l.code });
    }
    finalizer?.register(this, { inst, h }, this);
  }

  decide(failure) {
    const inst = this.inst;
    if (this.h === 0) throw closed();
    if (writeFailure(inst, failure, 0, RECORD + RESULT) < 0) return this.#decideValue(failure);
    const w = this.#batch(1, RECORD);
    const hi = inst.u32[w + 1];
    if (hi > 0x7fffffff) throw this.recordError(inst.i32[w], undefined);
    return C.unpackDecision(inst.u32[w], hi);
  }

  decideMany(failures) {
    if (!Array.isArray(failures)) throw new TypeError('Expected `failures` to be an array');
    if (this.h === 0) throw closed();
    const inst = this.inst;
    const out = new Array(failures.length);
    let first; // the InputError of the first invalid failure: they are decided in order
    const fail = (err) => {
      if (!(err instanceof InputError)) throw err;
      first ??= err;
    };
    const at = []; // the failure index of each record written
    let str = BATCH * (RECORD + RESULT);
    const flush = () => {
      if (at.length === 0) return;
      const w = this.#batch(at.length, BATCH * RECORD);
      let named = false; // the module keeps the message of a call's first bad record
      at.forEach((i, j) => {
        const hi = inst.u32[w + 2 * j + 1];
        out[i] = hi > 0x7fffffff ? null : C.unpackDecision(inst.u32[w + 2 * j], hi);
        if (out[i] === null && !named) {
          named = true;
          fail(this.recordError(inst.i32[w + 2 * j], i));
        }
      });
      at.length = 0;
      str = BATCH * (RECORD + RESULT);
    };
    inst.reserve(str);
    for (let i = 0; i < failures.length; i++) {
      const next = writeFailure(inst, failures[i], at.length * RECORD, str);
      if (next >= 0) {
        str = next;
        if (at.push(i) === BATCH) flush();
        continue;
      }
      // One the fast path does not take is decided alone, in its turn.
      flush();
      try {
        out[i] = this.#decideValue(failures[i]);
      } catch (err) {
        out[i] = null;
        fail(err instanceof InputError ? new InputError(err.field, err.reason, i) : err);
      }
    }
    flush();
    if (first !== undefined) {
      first.decisions = out;
      throw first;
    }
    return out;
  }

  // A failure the fast path does not take (another type, a value out of
  // range, an unknown name), as a value: the core converts and checks it,
  // and decides it as decide_batch would.
  #decideValue(failure) {
    return C.unpackDecision(...halves(this.#call('decide_value', writeValue(this.inst, failure))));
  }

  // An invalid failure is dead-lettered as malformed, not thrown (but for
  // the other events, which read only its now_ms).
  outcome(e) {
    if (this.h === 0) throw closed();
    if (e === null || typeof e !== 'object') throw new TypeError(`Expected \`event\` to be an object (got ${describe(e)})`);
    const { event, deliveries = 0, maxDeliveries = 0, ...failure } = e;
    const code = C.EVENT_NAMES.indexOf(event);
    if (code < 0) throw new TypeError(`Expected \`event\` to be one of ${C.EVENT_NAMES.join(', ')} (got ${describe(event)})`);
    const inst = this.inst;
    // The record, or else the failure as a value (outcome_value).
    const len = writeFailure(inst, failure, 0, RECORD) < 0 ? writeValue(inst, failure) : -1;
    const args = [code, len < 0 ? 0 : len, toBigInt(deliveries, 'deliveries'), toBigInt(maxDeliveries, 'max_deliveries')];
    const o = C.unpackOutcome(...halves(this.#call(len < 0 ? 'outcome_record' : 'outcome_value', ...args)));
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

  // decide_batch of count records at buffer offset 0, the results at out:
  // the u32 index of the first result.
  #batch(count, out) {
    const inst = this.inst;
    let n;
    try {
      n = inst.e.decide_batch(this.h, 0, count, out);
    } catch (err) {
      throw inst.crashed(err);
    }
    if (n !== count) throw this.callError(n);
    inst.views();
    return (inst.base + out) >> 2;
  }

  // The one-call methods' (C.PolicyCalls).
  [C.CALL](name, ...args) {
    return this.#call(name, ...args);
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
    // "record 0: invalid failure: attempt: must be >= 1 (got 0)"; an
    // unknown name may hold ": ".
    const m = /^(?:record \d+: )?(?:invalid (?:failure|event): )?(?:([^]*): (unknown field)|([^:]*): ([^]*))$/.exec(msg);
    return m ? new InputError(m[1] ?? m[3], m[2] ?? m[4], index) : new InputError('failure', msg, index);
  }

  callError(code) {
    if (code === ERR_HANDLE) return closed();
    return new Error(`backstop.wasm: ${this.inst.lastError()} (code ${code})`);
  }
}

function closed() {
  return new Error('backstop: the policy is closed');
}
