package dev.backstop;

import com.dylibso.chicory.runtime.HostFunction;
import com.dylibso.chicory.runtime.ImportFunction;
import com.dylibso.chicory.runtime.Memory;
import com.dylibso.chicory.wasm.WasmModule;
import com.dylibso.chicory.wasm.types.FunctionImport;
import com.dylibso.chicory.wasm.types.FunctionType;
import com.dylibso.chicory.wasm.types.Import;
import com.dylibso.chicory.wasm.types.ValType;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ThreadLocalRandom;

/**
 * The wasi_snapshot_preview1 functions backstop.wasm imports: only what the
 * Go runtime calls to start and run (wasm/ABI.md, "Rules"). It grants
 * nothing: no files, no preopened directories, no environment, no
 * arguments, no network. Chicory's own WasiPreview1 is not used, as the
 * Node.js host does not use node:wasi: it reads the host's clocks and its
 * poll_oneoff sleeps, where the ABI asks for virtual time.
 *
 * <p>The clocks are virtual (wasm/ABI.md, "Clocks"), per instance: the
 * monotonic clock counts nanoseconds from 0, 1 ns per reading; the host
 * adds 1 ms before each call ({@link #tick()}); a sleep adds its timeout and
 * returns at once; the realtime clock is 2022-01-01T00:00:00Z plus the same
 * counter. What the module writes to stdout or stderr (only a Go crash
 * report in practice) is kept, up to 4 KiB, for the proc_exit error.
 */
final class VirtualWasi {
  static final String MODULE = "wasi_snapshot_preview1";
  static final long EPOCH_NS = 1_640_995_200_000_000_000L;
  static final long CALL_NS = 1_000_000L;

  private static final int ESUCCESS = 0;
  private static final int EBADF = 8;
  private static final int EINVAL = 28;
  private static final int MAX_OUTPUT = 4096;

  private long ns; // virtual time
  private final StringBuilder output = new StringBuilder();

  /** Thrown by proc_exit: the Go runtime stopped (a crash, in a reactor). */
  static final class Exit extends RuntimeException {
    private static final long serialVersionUID = 1L;
    final int code;

    Exit(int code, String output) {
      super("backstop.wasm exited with code " + code + (output.isBlank() ? "" : ": " + output.strip()));
      this.code = code;
    }
  }

  /** Moves virtual time on before a call into the module. */
  void tick() {
    ns += CALL_NS;
  }

  /** The virtual time, in nanoseconds. */
  long now() {
    return ns;
  }

  private static final ValType I32 = ValType.I32;
  private static final ValType I64 = ValType.I64;

  private static FunctionType type(List<ValType> params, List<ValType> results) {
    return FunctionType.of(params, results);
  }

  /**
   * The host functions for the imports of module: each must be one of the
   * ten the Go runtime needs, and nothing else is granted.
   */
  List<ImportFunction> functions(WasmModule module) {
    Map<String, HostFunction> all = Map.of(
        "args_sizes_get", fn("args_sizes_get", List.of(I32, I32), (m, a) -> zeroSizes(m, a)),
        "args_get", fn("args_get", List.of(I32, I32), (m, a) -> ESUCCESS),
        "environ_sizes_get", fn("environ_sizes_get", List.of(I32, I32), (m, a) -> zeroSizes(m, a)),
        "environ_get", fn("environ_get", List.of(I32, I32), (m, a) -> ESUCCESS),
        "clock_time_get", fn("clock_time_get", List.of(I32, I64, I32), this::clockTimeGet),
        "random_get", fn("random_get", List.of(I32, I32), VirtualWasi::randomGet),
        "fd_write", fn("fd_write", List.of(I32, I32, I32, I32), this::fdWrite),
        "poll_oneoff", fn("poll_oneoff", List.of(I32, I32, I32, I32), this::pollOneoff),
        "sched_yield", fn("sched_yield", List.of(), (m, a) -> ESUCCESS),
        "proc_exit", new HostFunction(MODULE, "proc_exit", type(List.of(I32), List.of()), (inst, args) -> {
          throw new Exit((int) args[0], output.toString());
        }));
    List<ImportFunction> out = new ArrayList<>();
    var imports = module.importSection();
    for (int i = 0; i < imports.importCount(); i++) {
      Import imp = imports.getImport(i);
      HostFunction f = MODULE.equals(imp.module()) && imp instanceof FunctionImport ? all.get(imp.name()) : null;
      if (f == null) {
        throw new BackstopException("backstop.wasm: the module imports " + imp.module() + "." + imp.name()
            + ", which this host does not grant: it is not a backstop policy module (wasm/ABI.md)");
      }
      out.add(f);
    }
    return out;
  }

  private interface Body {
    int apply(Memory m, long[] args);
  }

  private static HostFunction fn(String name, List<ValType> params, Body body) {
    return new HostFunction(MODULE, name, type(params, List.of(I32)),
        (inst, args) -> new long[] {body.apply(inst.memory(), args)});
  }

  private static int zeroSizes(Memory m, long[] a) {
    m.writeI32((int) a[0], 0);
    m.writeI32((int) a[1], 0);
    return ESUCCESS;
  }

  int clockTimeGet(Memory m, long[] a) {
    int id = (int) a[0];
    // 0 realtime, 1 monotonic; nanoseconds.
    if (id != 0 && id != 1) return EINVAL;
    ns += 1;
    m.writeLong((int) a[2], id == 0 ? EPOCH_NS + ns : ns);
    return ESUCCESS;
  }

  // The Go runtime seeds its hash maps with this; the policy never uses it.
  private static int randomGet(Memory m, long[] a) {
    byte[] b = new byte[(int) a[1]];
    ThreadLocalRandom.current().nextBytes(b);
    m.write((int) a[0], b);
    return ESUCCESS;
  }

  int fdWrite(Memory m, long[] a) {
    int fd = (int) a[0];
    if (fd != 1 && fd != 2) return EBADF;
    int iovs = (int) a[1];
    int n = (int) a[2];
    long total = 0;
    for (int i = 0; i < n; i++) {
      int ptr = m.readInt(iovs + 8 * i);
      int len = m.readInt(iovs + 8 * i + 4);
      output.append(new String(m.readBytes(ptr, len), StandardCharsets.UTF_8));
      if (output.length() > MAX_OUTPUT) output.delete(0, output.length() - MAX_OUTPUT);
      total += Integer.toUnsignedLong(len);
    }
    m.writeI32((int) a[3], (int) total);
    return ESUCCESS;
  }

  // The runtime polls only to sleep when it has nothing to run, which a
  // reactor between calls never does. Every subscription is reported done
  // at once; a clock subscription (a sleep) moves virtual time on by its
  // timeout, the shortest if several.
  int pollOneoff(Memory m, long[] a) {
    int in = (int) a[0];
    int out = (int) a[1];
    int nsubs = (int) a[2];
    long wake = -1;
    for (int i = 0; i < nsubs; i++) {
      int sub = in + 48 * i;
      int ev = out + 32 * i;
      int tag = m.read(sub + 8) & 0xff;
      if (tag == 0) {
        long timeout = m.readLong(sub + 24);
        if ((m.readShort(sub + 40) & 1) != 0) {
          // subscription_clock_abstime: a time on that clock.
          timeout -= ns + (m.readInt(sub + 16) == 0 ? EPOCH_NS : 0);
          if (timeout < 0) timeout = 0;
        }
        if (wake < 0 || Long.compareUnsigned(timeout, wake) < 0) wake = timeout;
      }
      m.writeLong(ev, m.readLong(sub)); // userdata
      m.writeShort(ev + 8, (short) (tag == 0 ? ESUCCESS : EBADF));
      m.writeByte(ev + 10, (byte) tag);
      m.writeLong(ev + 16, 0);
      m.writeShort(ev + 24, (short) 0);
    }
    if (wake > 0) ns += wake;
    m.writeI32((int) a[3], nsubs);
    return ESUCCESS;
  }
}
