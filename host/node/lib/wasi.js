// A minimal wasi_snapshot_preview1 for backstop.wasm: only what the Go
// runtime calls to start and run (see WebAssembly.Module.imports). It grants
// nothing: no files, no preopened directories, no environment, no arguments.
// node:wasi is not used: it prints an ExperimentalWarning and exists only
// in Node.js, while this works in any runtime with standard WebAssembly.

const ESUCCESS = 0;
const EBADF = 8;
const EINVAL = 28;

/** Thrown by proc_exit: the Go runtime stopped (a crash, in a reactor). */
export class WasiExit extends Error {
  constructor(code, output) {
    super(`backstop.wasm exited with code ${code}${output ? `: ${output.trim()}` : ''}`);
    this.name = 'WasiExit';
    this.code = code;
  }
}

/**
 * Returns the import object and a `bind(memory)` to call once the instance
 * exists. What the module writes to stdout or stderr (only a Go crash report
 * in practice) is kept, up to a few KiB, and attached to the proc_exit error
 * instead of being printed.
 */
export function wasiImports() {
  let memory;
  let output = '';
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
  const start = Date.now();
  const now = typeof performance === 'object' ? () => performance.now() : () => Date.now() - start;

  const imports = {
    args_sizes_get: zeroSizes,
    args_get: () => ESUCCESS,
    environ_sizes_get: zeroSizes,
    environ_get: () => ESUCCESS,
    clock_time_get(id, _precision, ptr) {
      // 0 realtime, 1 monotonic; nanoseconds.
      if (id === 0) setU64(view(), ptr, Date.now() * 1e6);
      else if (id === 1) setU64(view(), ptr, Math.round(now() * 1e6));
      else return EINVAL;
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
    // once rather than blocking the host's event loop.
    poll_oneoff(inPtr, outPtr, nsubs, neventsPtr) {
      const dv = view();
      for (let i = 0; i < nsubs; i++) {
        const sub = inPtr + 48 * i;
        const ev = outPtr + 32 * i;
        const tag = dv.getUint8(sub + 8);
        dv.setBigUint64(ev, dv.getBigUint64(sub, true), true); // userdata
        dv.setUint16(ev + 8, tag === 0 ? ESUCCESS : EBADF, true);
        dv.setUint8(ev + 10, tag);
        dv.setBigUint64(ev + 16, 0n, true);
        dv.setUint16(ev + 24, 0, true);
      }
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
  };
}
