// One instance of backstop.wasm (wasm/ABI.md): the shared buffer, typed
// array views over linear memory, policy loading and error messages.
import { ABI_VERSION, ERR_HANDLE, ERR_POLICY, MAX_BUFFER, MAX_HANDLES, MIN_BUFFER } from './contract.gen.js';
import { PolicyError } from './errors.js';
import { wasiImports } from './wasi.js';

export { ABI_VERSION };

const EXPORTS = ['buffer', 'policy_load', 'policy_preset', 'policy_free', 'policy_stateful', 'decide_batch',
  'record_success', 'record_duration', 'circuit_state', 'error_message', 'acquire', 'policy_on_open', 'policy_lints',
  'budget_tokens', 'attempt_timeout', 'connect_timeout', 'outcome_record', 'decide_value', 'outcome_value'];

/**
 * The error of every call on a stateful policy whose module instance
 * trapped: its retry budget and circuit breaker were lost with it
 * (wasm/ABI.md, "When an instance traps"). Load the policy again.
 */
export class StateLostError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'StateLostError';
  }
}

/**
 * backstop.wasm, as one instance that outlives traps. A trap leaves the Go
 * runtime inside broken, so the module instance is replaced at once by a
 * fresh one (wasm/ABI.md, "When an instance traps"): the policies loaded
 * through this Instance keep their handles, stateless ones loaded again
 * into the fresh instance, stateful ones throwing StateLostError. Until
 * the first trap, handles are the module's own and `e.decide_batch` is the
 * module's export; after it, handles are mapped.
 */
export class Instance {
  /** @param {WebAssembly.Module | BufferSource} source */
  static async create(source) {
    const module = source instanceof WebAssembly.Module ? source : await WebAssembly.compile(source);
    const wasi = wasiImports();
    const instance = await WebAssembly.instantiate(module, { wasi_snapshot_preview1: wasi.imports });
    return new Instance(module, startModule(instance, wasi), wasi);
  }

  constructor(module, exports, wasi) {
    this.module = module;
    this.dead = null; // the error that broke the instance for good, if any
    this.onDead = null;
    this.decoder = new TextDecoder();
    // Policies loaded through this instance, by the handle it gave out:
    // { bytes (null when stateful), preset, stateful, handle (the module's), lost }.
    this.loaded = new Map();
    this.remap = false; // set by the first restart: handles are no longer the module's
    this.next = MAX_HANDLES + 1;
    this.restarting = false;
    this.use(exports, wasi);
  }

  /** Makes the module instance with these exports the current one. */
  use(raw, wasi) {
    this.raw = raw;
    this.wasi = wasi;
    this.memory = raw.memory;
    this.base = 0; // address of the shared buffer
    this.size = 0; // its size in bytes
    this.u8 = this.i32 = this.u32 = this.f64 = null;
    this.refresh();
    // The exports policies call. Virtual time moves on before every call
    // but those of the hot path (wasm/ABI.md, "Clocks").
    const tick = () => wasi.tick();
    const handle = (h) => this.handle(h);
    this.e = {
      buffer: (n) => (tick(), raw.buffer(n)),
      error_message: raw.error_message,
      policy_free: (h) => this.free(h),
      policy_stateful: (h) => this.stateful(h),
      decide_batch: this.remap ? (h, i, n, o) => raw.decide_batch(handle(h), i, n, o) : raw.decide_batch,
      record_success: (h, now) => (tick(), raw.record_success(this.remap ? handle(h) : h, now)),
      record_duration: (h, now, ms) => (tick(), raw.record_duration(this.remap ? handle(h) : h, now, ms)),
      circuit_state: (h, now) => (tick(), raw.circuit_state(this.remap ? handle(h) : h, now)),
      acquire: (h, now) => (tick(), raw.acquire(this.remap ? handle(h) : h, now)),
      policy_on_open: (h) => (tick(), raw.policy_on_open(this.remap ? handle(h) : h)),
      policy_lints: (h) => (tick(), raw.policy_lints(this.remap ? handle(h) : h)),
      budget_tokens: (h, now) => (tick(), raw.budget_tokens(this.remap ? handle(h) : h, now)),
      attempt_timeout: (h, elapsed) => (tick(), raw.attempt_timeout(this.remap ? handle(h) : h, elapsed)),
      connect_timeout: (h) => (tick(), raw.connect_timeout(this.remap ? handle(h) : h)),
      outcome_record: (h, ...args) => (tick(), raw.outcome_record(this.remap ? handle(h) : h, ...args)),
      outcome_value: (h, ...args) => (tick(), raw.outcome_value(this.remap ? handle(h) : h, ...args)),
      decide_value: (h, len) => (tick(), raw.decide_value(this.remap ? handle(h) : h, len)),
    };
    this.reserve(MIN_BUFFER);
  }

  /**
   * Makes the typed array views current. Growing memory detaches its old
   * ArrayBuffer, which empties the views over it: checking a view's length
   * is much cheaper than reading memory.buffer on every call.
   */
  views() {
    if (this.u32.length === 0) this.refresh();
  }

  refresh() {
    const ab = this.memory.buffer;
    this.u8 = new Uint8Array(ab);
    this.i32 = new Int32Array(ab);
    this.u32 = new Uint32Array(ab);
    this.f64 = new Float64Array(ab);
  }

  /** Makes the shared buffer at least size bytes; its address may change. */
  reserve(size) {
    if (size <= this.size) return;
    // Grow geometrically so a run of bigger inputs grows it a few times only.
    const want = Math.max(size, Math.min(this.size * 2, MAX_BUFFER), MIN_BUFFER);
    const addr = this.call(() => this.e.buffer(want));
    if (addr < 0) throw new RangeError(`backstop.wasm: buffer of ${want} bytes: ${this.lastError()}`);
    // Typed array views need 8-byte alignment; Go's allocator gives it.
    if (addr % 8 !== 0) throw new Error(`backstop.wasm: buffer address ${addr} is not 8-byte aligned`);
    this.base = addr;
    this.size = want;
    this.views();
  }

  /** The message of the module's last error. */
  lastError() {
    const packed = this.e.error_message();
    const addr = Number(packed >> 32n);
    const len = Number(packed & 0xffffffffn);
    this.views();
    return this.decoder.decode(this.u8.subarray(addr, addr + len));
  }

  /**
   * Runs a call into the module. A trap or a proc_exit leaves the Go runtime
   * in an unknown state: see crashed.
   */
  call(fn) {
    if (this.dead) throw this.dead;
    try {
      return fn();
    } catch (err) {
      throw this.crashed(err);
    }
  }

  /**
   * Returns the error to throw for err, thrown by a call into the module.
   * A StateLostError passes through. Anything else is a trap (or a
   * proc_exit): the module instance is replaced by a fresh one, or, if none
   * can start, this Instance is retired for good.
   */
  crashed(err) {
    if (err instanceof StateLostError || this.restarting) return err;
    if (this.dead) return this.dead;
    const lost = new StateLostError(
      `backstop: the policy's retry budget and circuit breaker were lost with the module instance that held them, which trapped (${firstLine(err)}); load the policy again`,
      { cause: err },
    );
    for (const p of this.loaded.values()) if (p.stateful && !p.lost) p.lost = lost;
    try {
      this.restart();
    } catch (restart) {
      this.dead = new Error(`backstop.wasm crashed; load the policy again: ${err.message}`, { cause: err });
      const refuse = () => {
        throw this.dead;
      };
      this.e = Object.fromEntries(Object.keys(this.e).map((name) => [name, refuse]));
      this.onDead?.();
      return this.dead;
    }
    return new Error(`backstop.wasm crashed (the instance was replaced by a fresh one): ${err.message}`, { cause: err });
  }

  /**
   * Starts a fresh module instance and loads the stateless policies into it
   * again. One that fails on the way (it loaded before, so it should not)
   * is given up as lost.
   */
  restart() {
    this.restarting = true;
    try {
      this.remap = true;
      for (;;) {
        const wasi = wasiImports();
        const instance = new WebAssembly.Instance(this.module, { wasi_snapshot_preview1: wasi.imports });
        this.use(startModule(instance, wasi), wasi);
        let failed = false;
        for (const p of this.loaded.values()) {
          if (p.lost) continue;
          try {
            p.handle = this.loadRaw(p.bytes, p.preset);
          } catch (err) {
            p.lost = new StateLostError(
              `backstop: the policy could not be loaded again after its module instance trapped (${firstLine(err)}); load it again`,
              { cause: err },
            );
            failed = true;
            break;
          }
        }
        if (!failed) return;
      }
    } finally {
      this.restarting = false;
    }
  }

  /**
   * Loads policy bytes (JSON or YAML), or the preset they name when preset
   * is true, and returns a handle.
   */
  load(bytes, preset) {
    const h = this.loadRaw(bytes, preset);
    const stateful = this.call(() => (this.wasi.tick(), this.raw.policy_stateful(h))) === 1;
    const handle = this.remap ? this.next++ : h;
    // A stateless policy's bytes are kept to load it into a fresh instance.
    this.loaded.set(handle, { bytes: stateful ? null : bytes.slice(), preset, stateful, handle: h, lost: null });
    return handle;
  }

  /** Loads bytes into the current module instance: its handle there. */
  loadRaw(bytes, preset) {
    this.reserve(bytes.length);
    this.views();
    this.u8.set(bytes, this.base);
    const n = bytes.length;
    const raw = this.raw;
    const h = this.call(() => (this.wasi.tick(), preset ? raw.policy_preset(n) : raw.policy_load(n)));
    if (h > 0) return h;
    const msg = this.lastError();
    if (h === ERR_POLICY) throw new PolicyError(msg);
    throw new Error(`backstop.wasm: policy_load: ${msg} (code ${h})`);
  }

  free(h) {
    const p = this.loaded.get(h);
    if (p === undefined) return ERR_HANDLE;
    this.loaded.delete(h);
    if (p.lost) return 0; // it went with its instance
    this.wasi.tick();
    return this.raw.policy_free(p.handle);
  }

  stateful(h) {
    const p = this.loaded.get(h);
    return p === undefined ? ERR_HANDLE : p.stateful ? 1 : 0;
  }

  /** The module's handle for one this instance gave out, after a restart. */
  handle(h) {
    const p = this.loaded.get(h);
    if (p === undefined) return 0; // closed: the module answers ERR_HANDLE
    if (p.lost) throw p.lost;
    return p.handle;
  }
}

// The gist of an error whose message may hold a crash report: its first line.
const firstLine = (err) => String(err?.message ?? err).split('\n', 1)[0];

/**
 * Checks a new module instance against the ABI and starts its Go runtime:
 * its exports.
 */
function startModule(instance, wasi) {
  const e = instance.exports;
  for (const [name, kind] of [['memory', WebAssembly.Memory], ['_initialize', Function], ['abi_version', Function]]) {
    if (!(e[name] instanceof kind)) {
      throw new Error(`backstop.wasm: the module has no ${name} export: it is not a backstop policy module (wasm/ABI.md)`);
    }
  }
  wasi.bind(e.memory);
  e._initialize();
  const version = e.abi_version();
  if (version !== ABI_VERSION) {
    throw new Error(
      `backstop.wasm: ABI version ${version} is not supported: this backstop-policy implements ABI version ${ABI_VERSION}; use the module built for it`,
    );
  }
  for (const name of EXPORTS) {
    if (typeof e[name] !== 'function') throw new Error(`backstop.wasm: the module has no ${name} export, which ABI version 1 requires`);
  }
  return e;
}

// The process-wide instance of the bundled module: JavaScript runs one
// thing at a time, and one instance holds any number of policy handles.
let shared = null;
// Instances of modules passed explicitly, by the object passed.
const byModule = new WeakMap();

/**
 * Returns the instance for source (bytes or a WebAssembly.Module), or for
 * the bundled backstop.wasm, creating it on first use.
 */
export function getInstance(source, loadDefault) {
  if (source === undefined) {
    if (!shared) {
      const p = start(loadDefault(), () => {
        if (shared === p) shared = null;
      });
      shared = p;
    }
    return shared;
  }
  if (!(source instanceof WebAssembly.Module || ArrayBuffer.isView(source) || source instanceof ArrayBuffer)) {
    return Promise.reject(new TypeError('Expected `wasm` to be a WebAssembly.Module, an ArrayBuffer or a Uint8Array'));
  }
  let p = byModule.get(source);
  if (!p) {
    p = start(source, () => {
      if (byModule.get(source) === p) byModule.delete(source);
    });
    byModule.set(source, p);
  }
  return p;
}

// Creates an instance; forget() drops it from its cache when creation fails
// or the instance later crashes, so the next load starts a fresh one.
function start(source, forget) {
  const p = Promise.resolve(source)
    .then((s) => Instance.create(s))
    .then((inst) => {
      inst.onDead = forget;
      return inst;
    });
  p.catch(forget);
  return p;
}
