package dev.backstop;

import com.dylibso.chicory.runtime.ExportFunction;
import com.dylibso.chicory.runtime.ImportValues;
import com.dylibso.chicory.runtime.Instance;
import com.dylibso.chicory.runtime.Machine;
import com.dylibso.chicory.runtime.Memory;
import com.dylibso.chicory.wasm.WasmModule;
import com.dylibso.chicory.wasm.types.Export;
import com.dylibso.chicory.wasm.types.MemoryLimits;
import java.nio.charset.StandardCharsets;
import java.util.HashSet;
import java.util.Set;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Function;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * One instance of backstop.wasm (wasm/ABI.md): its shared buffer, its
 * virtual clock and its exports. Not thread-safe: callers hold {@link #lock}
 * for every call. A trap (or proc_exit) retires it for good ({@link #dead});
 * the policies in it learn so at their next call (see {@link Policy}).
 */
final class ModuleInstance {
  /** The ABI version (wasm/ABI.md) this package implements. */
  static final int ABI_VERSION = 1;

  static final int ERR_HANDLE = -1;
  static final int ERR_POLICY = -2;
  static final int ERR_INPUT = -3;
  static final int MIN_BUFFER = 4096;
  static final int MAX_BUFFER = 64 << 20;
  private static final String[] EXPORTS = {"buffer", "policy_load", "policy_preset", "policy_free",
      "policy_stateful", "decide", "decide_batch", "record_success", "circuit_state", "error_message", "acquire",
      "policy_on_open", "budget_tokens", "attempt_timeout"};
  private static final Pattern INPUT = Pattern.compile("^(?:record \\d+: )?(?:invalid failure: )?([^:]*): (.*)$",
      Pattern.DOTALL);

  final ReentrantLock lock = new ReentrantLock();
  final VirtualWasi wasi = new VirtualWasi();
  final Instance instance;
  final Memory memory;
  private final ExportFunction buffer;
  private final ExportFunction policyLoad;
  private final ExportFunction policyPreset;
  private final ExportFunction policyFree;
  private final ExportFunction policyStateful;
  private final ExportFunction decide;
  private final ExportFunction decideBatch;
  private final ExportFunction recordSuccess;
  private final ExportFunction circuitState;
  private final ExportFunction errorMessage;
  private final ExportFunction acquire;
  private final ExportFunction policyOnOpen;
  private final ExportFunction budgetTokens;
  private final ExportFunction attemptTimeout;

  private int base; // address of the shared buffer
  private int size; // its size in bytes
  /** The error that broke this instance for good, or null. Written under lock. */
  volatile BackstopException dead;

  /**
   * Instantiates module, checks it against the ABI and starts its Go
   * runtime.
   */
  ModuleInstance(WasmModule module, Function<Instance, Machine> machine, MemoryLimits limits) {
    Set<String> exported = new HashSet<>();
    var section = module.exportSection();
    for (int i = 0; i < section.exportCount(); i++) {
      Export e = section.getExport(i);
      exported.add(e.name());
    }
    for (String name : new String[] {"memory", "_initialize", "abi_version"}) {
      if (!exported.contains(name)) {
        throw new BackstopException("backstop.wasm: the module has no " + name
            + " export: it is not a backstop policy module (wasm/ABI.md)");
      }
    }
    Instance.Builder b = Instance.builder(module)
        .withImportValues(ImportValues.builder().withFunctions(wasi.functions(module)).build())
        .withStart(false);
    if (machine != null) b.withMachineFactory(machine);
    if (limits != null) b.withMemoryLimits(limits);
    instance = b.build();
    memory = instance.memory();
    try {
      instance.export("_initialize").apply();
      long version = instance.export("abi_version").apply()[0];
      if (version != ABI_VERSION) {
        throw new BackstopException("backstop.wasm: ABI version " + version
            + " is not supported: this backstop-policy implements ABI version " + ABI_VERSION
            + "; use the module built for it");
      }
    } catch (BackstopException e) {
      throw e;
    } catch (RuntimeException | StackOverflowError e) {
      throw new BackstopException("backstop.wasm: the module did not start: " + e.getMessage(), e);
    }
    for (String name : EXPORTS) {
      if (!exported.contains(name)) {
        throw new BackstopException("backstop.wasm: the module has no " + name
            + " export, which ABI version " + ABI_VERSION + " requires");
      }
    }
    buffer = instance.export("buffer");
    policyLoad = instance.export("policy_load");
    policyPreset = instance.export("policy_preset");
    policyFree = instance.export("policy_free");
    policyStateful = instance.export("policy_stateful");
    decide = instance.export("decide");
    decideBatch = instance.export("decide_batch");
    recordSuccess = instance.export("record_success");
    circuitState = instance.export("circuit_state");
    errorMessage = instance.export("error_message");
    acquire = instance.export("acquire");
    policyOnOpen = instance.export("policy_on_open");
    budgetTokens = instance.export("budget_tokens");
    attemptTimeout = instance.export("attempt_timeout");
    reserve(MIN_BUFFER);
  }

  /**
   * Runs one export. Virtual time moves on first unless step is false (the
   * hot path). A trap or a proc_exit leaves the Go runtime broken: this
   * instance is retired and the error says so.
   */
  private long call(ExportFunction f, String name, boolean step, long... args) {
    if (dead != null) throw dead;
    if (step) wasi.tick();
    try {
      return f.apply(args)[0];
    } catch (RuntimeException | StackOverflowError e) {
      dead = new BackstopException("backstop.wasm crashed in " + name
          + " (the instance was retired; other policies are not affected): " + firstLine(e), e);
      throw dead;
    }
  }

  private static String firstLine(Throwable e) {
    String m = String.valueOf(e.getMessage() == null ? e.toString() : e.getMessage());
    int nl = m.indexOf('\n');
    return nl < 0 ? m : m.substring(0, nl);
  }

  /** Makes the shared buffer at least n bytes; its address may change. */
  void reserve(int n) {
    if (n <= size) return;
    int want = Math.max(Math.max(n, Math.min(size * 2, MAX_BUFFER)), MIN_BUFFER);
    long addr = call(buffer, "buffer", true, want);
    if (addr < 0) throw new BackstopException("backstop.wasm: buffer of " + want + " bytes: " + lastError());
    base = (int) addr;
    size = want;
  }

  /** The message of the module's last error. */
  String lastError() {
    long packed = call(errorMessage, "error_message", false);
    int addr = (int) (packed >>> 32);
    int len = (int) packed;
    return new String(memory.readBytes(addr, len), StandardCharsets.UTF_8);
  }

  /** Loads policy bytes (or the preset they name): a handle. */
  int load(byte[] bytes, boolean preset) {
    reserve(bytes.length);
    memory.write(base, bytes);
    long h = preset ? call(policyPreset, "policy_preset", true, bytes.length)
        : call(policyLoad, "policy_load", true, bytes.length);
    if (h > 0) return (int) h;
    String msg = lastError();
    if (h == ERR_POLICY) throw new PolicyException(msg);
    throw new BackstopException("backstop.wasm: policy_load: " + msg + " (code " + h + ")");
  }

  boolean stateful(int h) {
    return check(call(policyStateful, "policy_stateful", true, h)) == 1;
  }

  int onOpen(int h) {
    return (int) check(call(policyOnOpen, "policy_on_open", true, h));
  }

  void free(int h) {
    if (dead == null) call(policyFree, "policy_free", true, h);
  }

  /** Decides one failure: a packed decision. */
  long decide(int h, Failure f, long nowMs, double random) {
    int ml = f.method.length;
    int kl = f.errorKind.length;
    byte[] hint = f.retryAfter;
    int flags = f.idempotencyKey ? 1 : 0;
    if (hint.length == 0 && f.pushback.length > 0) {
      hint = f.pushback;
      flags |= 2;
    }
    if (f.retriedDownstream) flags |= 4;
    if (f.serverDeclined) flags |= 8;
    int hl = hint.length;
    if (ml + kl + hl > 0) {
      reserve(ml + kl + hl);
      if (ml > 0) memory.write(base, f.method);
      if (kl > 0) memory.write(base + ml, f.errorKind);
      if (hl > 0) memory.write(base + ml + kl, hint);
    }
    long r = call(decide, "decide", false, h, f.attempt, f.httpStatus, f.grpcCode, f.elapsedMs, nowMs,
        Double.doubleToRawLongBits(random), f.prevDelayMs, flags, ml, kl, hl);
    if (r < 0) throw error((int) r, "decide");
    return r;
  }

  static final int RECORD = 64;

  /**
   * Decides n failures (from, in order) in one decide_batch call (wasm/ABI.md,
   * "decide_batch"): n packed decisions or negative error codes, and the
   * error of the first bad record (or null).
   */
  long[] decideBatch(int h, java.util.List<Failure> failures, int from, int n, long[] nows, double[] randoms,
      InputException[] firstError) {
    int strings = 0;
    for (int i = from; i < from + n; i++) {
      Failure f = failures.get(i);
      strings += f.method.length + f.errorKind.length + (f.retryAfter.length > 0 ? f.retryAfter.length : f.pushback.length);
    }
    int out = n * RECORD;
    int str = out + n * 8;
    reserve(str + strings);
    for (int j = 0; j < n; j++) {
      Failure f = failures.get(from + j);
      byte[] hint = f.retryAfter;
      int flags = f.idempotencyKey ? 1 : 0;
      if (hint.length == 0 && f.pushback.length > 0) {
        hint = f.pushback;
        flags |= 2;
      }
      if (f.retriedDownstream) flags |= 4;
      if (f.serverDeclined) flags |= 8;
      int at = base + j * RECORD;
      memory.writeLong(at, f.attempt);
      memory.writeLong(at + 8, f.elapsedMs);
      memory.writeLong(at + 16, nows[from + j]);
      memory.writeF64(at + 24, randoms[from + j]);
      memory.writeLong(at + 32, f.prevDelayMs);
      memory.writeI32(at + 40, f.httpStatus);
      memory.writeI32(at + 44, f.grpcCode);
      memory.writeI32(at + 48, flags);
      memory.writeI32(at + 52, str);
      memory.writeShort(at + 56, (short) f.method.length);
      memory.writeShort(at + 58, (short) f.errorKind.length);
      memory.writeShort(at + 60, (short) hint.length);
      memory.writeShort(at + 62, (short) 0);
      memory.write(base + str, f.method);
      memory.write(base + str + f.method.length, f.errorKind);
      memory.write(base + str + f.method.length + f.errorKind.length, hint);
      str += f.method.length + f.errorKind.length + hint.length;
    }
    long got = call(decideBatch, "decide_batch", false, h, 0, n, out);
    if (got != n) throw error((int) got, "decide_batch");
    long[] results = new long[n];
    boolean named = false;
    for (int j = 0; j < n; j++) {
      results[j] = memory.readLong(base + out + 8 * j);
      if (results[j] < 0 && !named) {
        named = true; // the module keeps the message of the first bad record of a call
        RuntimeException e = error((int) results[j], "decide_batch");
        if (!(e instanceof InputException)) throw e;
        firstError[0] = (InputException) e;
      }
    }
    return results;
  }

  void recordSuccess(int h, long nowMs) {
    long r = call(recordSuccess, "record_success", true, h, nowMs);
    if (r < 0) throw error((int) r, "record_success");
  }

  int circuitState(int h, long nowMs) {
    long r = call(circuitState, "circuit_state", true, h, nowMs);
    if (r < 0) throw error((int) r, "circuit_state");
    return (int) r;
  }

  long acquire(int h, long nowMs) {
    long r = call(acquire, "acquire", true, h, nowMs);
    if (r < 0) throw error((int) r, "acquire");
    return r;
  }

  long budgetTokens(int h, long nowMs) {
    long r = call(budgetTokens, "budget_tokens", true, h, nowMs);
    if (r < 0) throw error((int) r, "budget_tokens");
    return r;
  }

  long attemptTimeout(int h, long elapsedMs) {
    long r = call(attemptTimeout, "attempt_timeout", true, h, elapsedMs);
    if (r < 0) throw error((int) r, "attempt_timeout");
    return r;
  }

  private long check(long r) {
    if (r < 0) throw error((int) r, "call");
    return r;
  }

  /** The exception for an error code: an InputException for -3. */
  private RuntimeException error(int code, String export) {
    if (code == ERR_HANDLE) return Policy.closedError();
    String msg = lastError();
    if (code == ERR_INPUT) {
      // "record 0: invalid failure: attempt: must be >= 1 (got 0)"
      Matcher m = INPUT.matcher(msg);
      return m.matches() ? new InputException(m.group(1), m.group(2)) : new InputException("failure", msg);
    }
    return new BackstopException("backstop.wasm: " + export + ": " + msg + " (code " + code + ")");
  }

  /** Test seam: the buffer export, as the module answers it (the address, or -4). */
  long rawBuffer(int n) {
    long addr = call(buffer, "buffer", true, n);
    if (addr >= 0) {
      base = (int) addr;
      size = Math.max(size, n);
    }
    return addr;
  }

  /** The instance's linear memory size in 64 KiB pages. */
  int pages() {
    return memory.pages();
  }
}
