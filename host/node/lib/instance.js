// One instance of backstop.wasm (wasm/ABI.md): the shared buffer, typed
// array views over linear memory, policy loading and error messages.
import { PolicyError } from './errors.js';
import { wasiImports } from './wasi.js';

/** The ABI version (wasm/ABI.md) this package implements. */
export const ABI_VERSION = 1;

const ERR_POLICY = -2;
const MIN_BUFFER = 4096;
const EXPORTS = ['buffer', 'policy_load', 'policy_preset', 'policy_free', 'policy_stateful', 'decide_batch',
  'record_success', 'circuit_state', 'error_message'];
const MAX_BUFFER = 64 << 20; // the module refuses more

export class Instance {
  /** @param {WebAssembly.Module | BufferSource} source */
  static async create(source) {
    const module = source instanceof WebAssembly.Module ? source : await WebAssembly.compile(source);
    const wasi = wasiImports();
    const instance = await WebAssembly.instantiate(module, { wasi_snapshot_preview1: wasi.imports });
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
    return new Instance(e);
  }

  constructor(exports) {
    this.e = exports;
    this.memory = exports.memory;
    this.base = 0; // address of the shared buffer
    this.size = 0; // its size in bytes
    this.dead = null; // the error that broke the instance, if any
    this.onDead = null;
    this.decoder = new TextDecoder();
    this.u8 = this.i32 = this.u32 = this.f64 = null;
    this.refresh();
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
   * in an unknown state, so the instance is retired for good.
   */
  call(fn) {
    if (this.dead) throw this.dead;
    try {
      return fn();
    } catch (err) {
      throw this.crashed(err);
    }
  }

  crashed(err) {
    if (!this.dead) {
      this.dead = new Error(`backstop.wasm crashed; load the policy again: ${err.message}`, { cause: err });
      this.onDead?.();
    }
    return this.dead;
  }

  /**
   * Loads policy bytes (JSON or YAML), or the preset they name when preset
   * is true, and returns a handle.
   */
  load(bytes, preset) {
    this.reserve(bytes.length);
    this.views();
    this.u8.set(bytes, this.base);
    const h = this.call(() => (preset ? this.e.policy_preset(bytes.length) : this.e.policy_load(bytes.length)));
    if (h > 0) return h;
    const msg = this.lastError();
    if (h === ERR_POLICY) throw new PolicyError(msg);
    throw new Error(`backstop.wasm: policy_load: ${msg} (code ${h})`);
  }
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
