// A minimal wasi_snapshot_preview1 for backstop.wasm: only what the Go
// runtime calls to start and run (see WebAssembly.Module.imports). It grants
// nothing: no files, no preopened directories, no environment, no arguments.
// node:wasi is not used: it prints an ExperimentalWarning and exists only
// in Node.js, while this works in any runtime with standard WebAssembly.

const ESUCCESS = 0;
const EBADF = 8;
const EINVAL = 28;

// Virtual time (wasm/ABI.md, "Clocks"), in nanoseconds: what the realtime
// clock reads at virtual time 0 (2022-01-01T00:00:00Z), and how far time
// moves before each call.
const EPOCH_NS = 1_640_995_200_000_000_000n;
const CALL_NS = 1_000_000n;

/** Thrown by proc_exit: the Go runtime stopped (a crash, in a reactor). */
export class WasiExit extends Error {
  constructor(code, output) {
    super(`backstop.wasm exited with code ${code}${output ? `: ${output.trim()}` : ''}`);
    this.name = 'WasiExit';
    this.code = code;
  }
}

/**
 * Returns the import object, a `bind(memory)` to call once the instance
 * exists, and `tick()`, which moves the instance's virtual time on before a
 * call. What the module writes to stdout or stderr (only a Go crash report
 * in practice) is kept, up to a few KiB, and attached to the proc_exit error
 * instead of being printed.
 *
 * The clocks are virtual (wasm/ABI.md, "Clocks"), never the host's: only
 * the Go runtime reads them, to pace its garbage collector, and it must
 * see GC work take no time. Its GC CPU limiter otherwise switches off the
 * mark assists that are the only way a reactor's GC cycle ends (a real
 * clock does so when the process pauses for a second during a GC phase),
 * and the heap grows until the instance traps.
 */
export function wasiImports() {
  let memory;
  let output = '';
  let ns = 0n; // virtual time: 1 ns per reading, CALL_NS per call, sleeps at once
  const decoder = new TextDecoder();
  const view = () => new DataView(memory.buffer);
  const setU64 = (dv, ptr, value) => dv.setBigUint64(ptr, BigInt(value), true);
  const zeroSizes = (a, b) => {
    const dv = view();
    dv.setUint32(a, 0, true);
    dv.setUint32(b, 0, true);
    return ESUCCESS;
  };
  // The Go runtime seeds its hash maps with this; the policy never uses it.
  const fillRandom = (bytes) => {
    const c = globalThis.crypto;
    if (c && typeof c.getRandomValues === 'function') {
      for (let i = 0; i < bytes.length; i += 65536) c.getRandomValues(bytes.subarray(i, i + 65536));
    } else {
      for (let i = 0; i < bytes.length; i++) bytes[i] = (Math.random() * 256) | 0;
    }
  };

  const imports = {
    args_sizes_get: zeroSizes,
    args_get: () => ESUCCESS,
    environ_sizes_get: zeroSizes,
    environ_get: () => ESUCCESS,
    clock_time_get(id, _precision, ptr) {
      // 0 realtime, 1 monotonic; nanoseconds.
      if (id !== 0 && id !== 1) return EINVAL;
      ns += 1n;
      setU64(view(), ptr, id === 0 ? EPOCH_NS + ns : ns);
      return ESUCCESS;
    },
    random_get(ptr, len) {
      fillRandom(new Uint8Array(memory.buffer, ptr, len));
      return ESUCCESS;
    },
    fd_write(fd, iovs, iovsLen, nwrittenPtr) {
      if (fd !== 1 && fd !== 2) return EBADF;
      const dv = view();
      let total = 0;
      for (let i = 0; i < iovsLen; i++) {
        const ptr = dv.getUint32(iovs + 8 * i, true);
        const len = dv.getUint32(iovs + 8 * i + 4, true);
        output = (output + decoder.decode(new Uint8Array(memory.buffer, ptr, len))).slice(-4096);
        total += len;
      }
      dv.setUint32(nwrittenPtr, total, true);
      return ESUCCESS;
    },
    fd_fdstat_get(fd, ptr) {
      if (fd > 2) return EBADF;
      // The standard streams are character devices with every right.
      const dv = view();
      dv.setUint8(ptr, 2);
      dv.setUint16(ptr + 2, 0, true);
      dv.setBigUint64(ptr + 8, 0xffffffffffffffffn, true);
      dv.setBigUint64(ptr + 16, 0xffffffffffffffffn, true);
      return ESUCCESS;
    },
    fd_fdstat_set_flags: (fd) => (fd > 2 ? EBADF : ESUCCESS),
    fd_close: () => EBADF,
    // No preopened directories: the runtime's scan stops at the first EBADF.
    fd_prestat_get: () => EBADF,
    fd_prestat_dir_name: () => EBADF,
    // The runtime polls only to sleep when it has nothing to run, which a
    // reactor between calls never does. Report every subscription as done at
    // once rather than blocking the host's event loop; a clock subscription
    // (a sleep) moves virtual time on by its timeout, the shortest if several.
    poll_oneoff(inPtr, outPtr, nsubs, neventsPtr) {
      const dv = view();
      let wake = -1n;
      for (let i = 0; i < nsubs; i++) {
        const sub = inPtr + 48 * i;
        const ev = outPtr + 32 * i;
        const tag = dv.getUint8(sub + 8);
        if (tag === 0) {
          let timeout = dv.getBigUint64(sub + 24, true);
          if (dv.getUint16(sub + 40, true) & 1) {
            // subscription_clock_abstime: a time on that clock.
            timeout -= ns + (dv.getUint32(sub + 16, true) === 0 ? EPOCH_NS : 0n);
            if (timeout < 0n) timeout = 0n;
          }
          if (wake < 0n || timeout < wake) wake = timeout;
        }
        dv.setBigUint64(ev, dv.getBigUint64(sub, true), true); // userdata
        dv.setUint16(ev + 8, tag === 0 ? ESUCCESS : EBADF, true);
        dv.setUint8(ev + 10, tag);
        dv.setBigUint64(ev + 16, 0n, true);
        dv.setUint16(ev + 24, 0, true);
      }
      if (wake > 0n) ns += wake;
      dv.setUint32(neventsPtr, nsubs, true);
      return ESUCCESS;
    },
    sched_yield: () => ESUCCESS,
    proc_exit(code) {
      throw new WasiExit(code, output);
    },
  };
  return {
    imports,
    bind(mem) {
      memory = mem;
    },
    /** Moves virtual time on before a call into the module. */
    tick() {
      ns += CALL_NS;
    },
    /** The virtual time, in nanoseconds. */
    get now() {
      return ns;
    },
  };
}
