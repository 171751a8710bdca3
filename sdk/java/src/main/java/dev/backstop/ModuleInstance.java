package dev.backstop;

import com.dylibso.chicory.runtime.ExportFunction;
import com.dylibso.chicory.runtime.ImportValues;
import com.dylibso.chicory.runtime.Instance;
import com.dylibso.chicory.runtime.Machine;
import com.dylibso.chicory.runtime.Memory;
import com.dylibso.chicory.wasm.WasmModule;
import com.dylibso.chicory.wasm.types.MemoryLimits;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Function;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * One instance of backstop.wasm (wasm/ABI.md): its shared buffer, its
 * virtual clock and its exports. Not thread-safe: callers hold {@link #lock}
 * for every call. A trap (or proc_exit) retires it for good ({@link #dead});
 * the policies in it learn so at their next call (see {@link Policy}). How a
 * failure is written for the module is generated ({@link Contract}).
 */
final class ModuleInstance {
  /** Exports added within version 1 (wasm/ABI.md): looked up, and missing only from an older module. */
  private static final Set<String> ADDED = Set.of("outcome", "decide_value", "outcome_value");
  private static final Pattern INPUT = Pattern.compile("^(?:record \\d+: )?(?:invalid (?:failure|event): )?([^:]*): (.*)$",
      Pattern.DOTALL);

  final ReentrantLock lock = new ReentrantLock();
  final VirtualWasi wasi = new VirtualWasi();
  final Memory memory;
  private final Map<String, ExportFunction> exports = new HashMap<>();
  private final ExportFunction decide; // the hot path, without a lookup

  private int base; // address of the shared buffer
  private int size; // its size in bytes
  /** The error that broke this instance for good, or null. Written under lock. */
  volatile BackstopException dead;

  /** Instantiates module, checks it against the ABI and starts its Go runtime. */
  ModuleInstance(WasmModule module, Function<Instance, Machine> machine, MemoryLimits limits) {
    Set<String> exported = new HashSet<>();
    var section = module.exportSection();
    for (int i = 0; i < section.exportCount(); i++) exported.add(section.getExport(i).name());
    for (String name : List.of("memory", "_initialize", "abi_version")) {
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
    Instance instance = b.build();
    memory = instance.memory();
    try {
      instance.export("_initialize").apply();
      long version = instance.export("abi_version").apply()[0];
      if (version != Contract.ABI_VERSION) {
        throw new BackstopException("backstop.wasm: ABI version " + version
            + " is not supported: this backstop-policy implements ABI version " + Contract.ABI_VERSION
            + "; use the module built for it");
      }
    } catch (BackstopException e) {
      throw e;
    } catch (RuntimeException | StackOverflowError e) {
      throw new BackstopException("backstop.wasm: the module did not start: " + e.getMessage(), e);
    }
    for (String name : Contract.EXPORTS) {
      if (exported.contains(name)) {
        exports.put(name, instance.export(name));
      } else if (!ADDED.contains(name)) {
        throw new BackstopException("backstop.wasm: the module has no " + name
            + " export, which ABI version " + Contract.ABI_VERSION + " requires");
      }
    }
    decide = exports.get("decide");
    reserve(Contract.MIN_BUFFER);
  }

  /**
   * Runs one export. Virtual time moves on first unless step is false (the
   * hot path). A trap or a proc_exit leaves the Go runtime broken: this
   * instance is retired and the error says so.
   */
  private long call(ExportFunction f, String name, boolean step, long... args) {
    if (dead != null) throw dead;
    if (f == null) {
      throw new BackstopException("backstop.wasm: the module has no " + name + " export: it is older than this"
          + " package; use the module built for it");
    }
    if (step) wasi.tick();
    try {
      return f.apply(args)[0];
    } catch (RuntimeException | StackOverflowError e) {
      String m = String.valueOf(e.getMessage() == null ? e.toString() : e.getMessage());
      dead = new BackstopException("backstop.wasm crashed in " + name
          + " (the instance was retired; other policies are not affected): " + m.split("\n", 2)[0], e);
      throw dead;
    }
  }

  /** Runs the export name: its result, or the exception for its error code. */
  long call(String name, long... args) {
    long r = call(exports.get(name), name, true, args);
    if (r < 0) throw error((int) r, name);
    return r;
  }

  /** Makes the shared buffer at least n bytes; its address may change. */
  void reserve(int n) {
    if (n <= size) return;
    int want = Math.max(Math.max(n, Math.min(size * 2, Contract.MAX_BUFFER)), Contract.MIN_BUFFER);
    long addr = call(exports.get("buffer"), "buffer", true, want);
    if (addr < 0) throw new BackstopException("backstop.wasm: buffer of " + want + " bytes: " + lastError());
    base = (int) addr;
    size = want;
  }

  /** The message of the module's last error. */
  String lastError() {
    long packed = call(exports.get("error_message"), "error_message", false);
    return new String(memory.readBytes((int) (packed >>> 32), (int) packed), StandardCharsets.UTF_8);
  }

  /** Loads policy bytes (or the preset they name): a handle. */
  int load(byte[] bytes, boolean preset) {
    String name = preset ? "policy_preset" : "policy_load";
    long h = call(exports.get(name), name, true, put(bytes));
    if (h > 0) return (int) h;
    String msg = lastError();
    if (h == Contract.ERR_POLICY) throw new PolicyException(msg);
    throw new BackstopException("backstop.wasm: policy_load: " + msg + " (code " + h + ")");
  }

  /** Writes b at the start of the shared buffer: its length. */
  private int put(byte[] b) {
    reserve(b.length);
    memory.write(base, b);
    return b.length;
  }

  void free(int h) {
    if (dead == null) call(exports.get("policy_free"), "policy_free", true, h);
  }

  /**
   * Calls name (decide, outcome) with f's strings in the buffer and its
   * arguments (Contract.putArgs) between before and after: the result, or
   * the exception for its error code. A failure the fast path did not take
   * goes to name_value, as a value in the buffer and its length.
   */
  long decide(String name, Failure f, long[] before, long... after) {
    if (f.value != null) {
      long[] args = Arrays.copyOf(before, before.length + 1 + after.length);
      args[before.length] = put(f.value.filled(f));
      System.arraycopy(after, 0, args, before.length + 1, after.length);
      return call(name + "_value", args);
    }
    int n = Contract.stringBytes(f);
    if (n > 0) {
      reserve(n);
      Contract.putStrings(memory, base, f);
    }
    long[] args = new long[before.length + Contract.FAILURE_ARGS + after.length];
    System.arraycopy(before, 0, args, 0, before.length);
    Contract.putArgs(args, before.length, f);
    System.arraycopy(after, 0, args, before.length + Contract.FAILURE_ARGS, after.length);
    boolean hot = name.equals("decide");
    long r = call(hot ? decide : exports.get(name), name, !hot, args);
    if (r < 0) throw error((int) r, name);
    return r;
  }

  /** Checks a failure value: decide_value reads it before its handle, so handle 0 answers its error or ERR_HANDLE. */
  void check(byte[] value) {
    lock.lock();
    try {
      long r = call(exports.get("decide_value"), "decide_value", true, 0, put(value));
      if (r != Contract.ERR_HANDLE) throw error((int) r, "decide_value");
    } finally {
      lock.unlock();
    }
  }

  /**
   * Decides n failures (from, in order) in one decide_batch call (wasm/ABI.md,
   * "decide_batch") into out (null for an invalid one): the error of the
   * first invalid one, or null.
   */
  InputException decideBatch(int h, List<Failure> failures, int from, int n, Decision[] out) {
    int results = n * Contract.RECORD_SIZE;
    int str = results + n * Contract.RESULT_SIZE;
    int strings = 0;
    for (int i = from; i < from + n; i++) strings += Contract.stringBytes(failures.get(i));
    reserve(str + strings);
    for (int j = 0; j < n; j++) {
      Failure f = failures.get(from + j);
      Contract.putRecord(memory, base + j * Contract.RECORD_SIZE, f, str);
      Contract.putStrings(memory, base + str, f);
      str += Contract.stringBytes(f);
    }
    long got = call(exports.get("decide_batch"), "decide_batch", false, h, 0, n, results);
    if (got != n) throw error((int) got, "decide_batch");
    InputException first = null;
    for (int j = 0; j < n; j++) {
      long r = memory.readLong(base + results + Contract.RESULT_SIZE * j);
      out[from + j] = r >= 0 ? Decision.unpack(r) : null;
      if (r < 0 && first == null) {
        // the module keeps the message of the first bad record of a call
        RuntimeException e = error((int) r, "decide_batch");
        if (!(e instanceof InputException)) throw e;
        first = (InputException) e;
      }
    }
    return first;
  }

  /** The exception for an error code: an InputException for ERR_INPUT. */
  private RuntimeException error(int code, String export) {
    if (code == Contract.ERR_HANDLE) return Policy.closedError();
    if (code == Contract.ERR_INPUT) return inputError();
    return new BackstopException("backstop.wasm: " + export + ": " + lastError() + " (code " + code + ")");
  }

  /** The last error, an invalid input's, as its field and reason ("record 0: invalid failure: attempt: must be >= 1 (got 0)"). */
  InputException inputError() {
    String msg = lastError();
    Matcher m = INPUT.matcher(msg);
    return m.matches() ? new InputException(m.group(1), m.group(2)) : new InputException("failure", msg);
  }

  /** Test seam: the buffer export, as the module answers it (the address, or -4). */
  long rawBuffer(int n) {
    long addr = call(exports.get("buffer"), "buffer", true, n);
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
