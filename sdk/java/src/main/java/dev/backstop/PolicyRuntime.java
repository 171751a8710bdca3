package dev.backstop;

import com.dylibso.chicory.runtime.Instance;
import com.dylibso.chicory.runtime.Machine;
import com.dylibso.chicory.wasm.Parser;
import com.dylibso.chicory.wasm.WasmModule;
import com.dylibso.chicory.wasm.types.MemoryLimits;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.function.Function;
import java.util.regex.Pattern;

/**
 * backstop.wasm, parsed once, with a bounded pool of Chicory instances that
 * policies are loaded into. {@link Policy#load(String)} and friends use the
 * process-wide {@link #bundled()} runtime over the module in this jar; build
 * another with {@link #builder()} (another module, pool size, compiler).
 *
 * <h2>Threads</h2>
 *
 * <p>A Chicory instance, like the Go runtime inside it, is single-threaded.
 * A runtime keeps up to {@code maxInstances} of them (default: the number
 * of processors, at most 4), started on demand, and places each new policy
 * in the next one, round robin. Every call on a policy locks the instance
 * that holds it, so a {@link Policy} is safe for concurrent use, its calls
 * are serialised (a stateful policy's budget and breaker see every decision
 * in order), and policies in different instances run in parallel.
 *
 * <h2>Traps</h2>
 *
 * <p>A trap (a bug, or an instance out of memory) retires its instance only
 * (wasm/ABI.md, "When an instance traps"): a stateless policy that lived
 * there is loaded again from its bytes into another instance at its next
 * call; a stateful one throws {@link StateLostException} from then on; new
 * loads go to a fresh instance.
 */
public final class PolicyRuntime implements AutoCloseable {
  private static final Pattern PRESET = Pattern.compile("[\\w.-]*");

  private final WasmModule module;
  private final Function<Instance, Machine> machine; // null: Chicory's interpreter
  private final MemoryLimits limits; // null: the module's own
  private final ModuleInstance[] slots;
  private int next; // round-robin cursor, under this
  private volatile boolean closed;
  private final boolean shared;

  private PolicyRuntime(Builder b, boolean shared) {
    // The bundled module, compiled: the classes the build made from it.
    Parsed parsed = b.wasm == null && b.compiled ? Parsed.PREBUILT
        : Parsed.of(b.wasm == null ? bundledWasm() : b.wasm, b.compiled);
    this.module = parsed.module;
    this.machine = parsed.machine;
    this.limits = b.maxMemoryPages > 0 ? new MemoryLimits(initialPages(module), b.maxMemoryPages) : null;
    this.slots = new ModuleInstance[b.maxInstances];
    this.shared = shared;
    // Start one instance now: a module of another ABI is refused here.
    slots[0] = new ModuleInstance(module, machine, limits);
  }

  private static int initialPages(WasmModule m) {
    return m.memorySection().map(s -> s.getMemory(0).limits().initialPages()).orElse(1);
  }

  /** The process-wide runtime over the backstop.wasm bundled in this jar, started on first use. */
  public static PolicyRuntime bundled() {
    return Bundled.RUNTIME;
  }

  private static final class Bundled {
    static final PolicyRuntime RUNTIME = new PolicyRuntime(builder(), true);
  }

  /** The bundled backstop.wasm, read from this jar. */
  static byte[] bundledWasm() {
    return resource("backstop.wasm");
  }

  static byte[] resource(String name) {
    try (InputStream in = PolicyRuntime.class.getResourceAsStream(name)) {
      if (in == null) {
        throw new BackstopException("backstop-policy: dev/backstop/" + name
            + " is missing from the jar (the build copies it from contract/)");
      }
      return in.readAllBytes();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** A builder for a runtime of its own; defaults: the bundled module, compiled. */
  public static Builder builder() {
    return new Builder();
  }

  /**
   * Loads a policy from JSON or YAML bytes (docs/policy.md). Each call
   * returns a new policy with its own retry budget and circuit breaker.
   *
   * @throws PolicyException naming every invalid field
   */
  public Policy load(byte[] policy) {
    return new Policy(this, policy.clone(), false);
  }

  /**
   * Loads a policy from a JSON or YAML string, or the preset a bare word
   * names ({@code "default"}, {@code "critical"}, {@code "batch"},
   * {@code "cloud-tasks"}, {@code "fast-transient"}): a word is never a policy document, so a typo
   * gets "unknown preset" and the list of presets.
   */
  public Policy load(String policy) {
    byte[] b = policy.getBytes(StandardCharsets.UTF_8);
    return new Policy(this, b, PRESET.matcher(policy).matches());
  }

  /** Loads the named preset. */
  public Policy preset(String name) {
    return new Policy(this, name.getBytes(StandardCharsets.UTF_8), true);
  }

  /**
   * The instance a new policy goes to: the next one, round robin, started
   * if it is not yet (or was retired by a trap).
   */
  synchronized ModuleInstance pick() {
    if (closed) throw new IllegalStateException("backstop: the policy runtime is closed");
    for (int tries = 0; tries < slots.length; tries++) {
      int i = next;
      next = (next + 1) % slots.length;
      ModuleInstance in = slots[i];
      if (in != null && in.dead != null) slots[i] = in = null;
      if (in == null) {
        try {
          slots[i] = in = new ModuleInstance(module, machine, limits);
        } catch (BackstopException e) {
          if (tries == slots.length - 1) throw e;
          continue;
        }
      }
      return in;
    }
    throw new IllegalStateException("unreachable");
  }

  /** Test seam: the instance in slot i, or null. */
  synchronized ModuleInstance slot(int i) {
    return slots[i];
  }

  /** How many instances this runtime may run. */
  public int maxInstances() {
    return slots.length;
  }

  /**
   * Drops the instances; policies loaded here fail from then on. The bundled
   * runtime is never closed: closing it does nothing.
   */
  @Override
  public synchronized void close() {
    if (shared) return;
    closed = true;
    for (int i = 0; i < slots.length; i++) {
      ModuleInstance in = slots[i];
      if (in != null) {
        in.lock.lock();
        try {
          in.dead = new BackstopException("backstop: the policy runtime is closed");
        } finally {
          in.lock.unlock();
        }
      }
      slots[i] = null;
    }
  }

  /** Builds a {@link PolicyRuntime}. */
  public static final class Builder {
    private byte[] wasm;
    private int maxInstances = Math.max(1, Math.min(4, Runtime.getRuntime().availableProcessors()));
    private boolean compiled = true;
    private int maxMemoryPages;

    private Builder() {}

    /** Another build of backstop.wasm (default: the one bundled in this jar). */
    public Builder wasm(byte[] wasm) {
      this.wasm = wasm.clone();
      return this;
    }

    /** The most instances (default: the number of processors, at most 4). */
    public Builder maxInstances(int n) {
      if (n < 1) throw new IllegalArgumentException("maxInstances must be >= 1 (got " + n + ")");
      this.maxInstances = n;
      return this;
    }

    /**
     * Whether the module runs as JVM bytecode or is interpreted. Default:
     * true, compiled: the bundled module was compiled when this jar was built
     * (Chicory's build-time compiler), a module given to {@link #wasm} is
     * compiled when the runtime is built (Chicory's runtime compiler, a few
     * seconds). Compiled code decides about 80 times faster than the
     * interpreter (BENCHMARKS.md, "JVM host"), with the same decisions (the
     * vectors run through both). Every function of backstop.wasm compiles.
     */
    public Builder compiled(boolean compiled) {
      this.compiled = compiled;
      return this;
    }

    /** Test seam: caps each instance's linear memory (64 KiB pages), so running out of it traps cheaply. */
    Builder maxMemoryPages(int pages) {
      this.maxMemoryPages = pages;
      return this;
    }

    /**
     * Parses the module and starts its first instance.
     *
     * @throws BackstopException when the module is not a backstop module or
     *     its ABI version is not the one this package implements
     */
    public PolicyRuntime build() {
      return new PolicyRuntime(this, false);
    }
  }

  /**
   * A parsed (and compiled) module, cached by its bytes' digest: parsing and
   * compiling take seconds, and every runtime of the same module shares
   * the result (Chicory's modules and machine factories are immutable).
   */
  private static final class Parsed {
    private static final Map<String, Parsed> CACHE = new LinkedHashMap<>(8, 0.75f, true) {
      private static final long serialVersionUID = 1L;

      @Override
      protected boolean removeEldestEntry(Map.Entry<String, Parsed> eldest) {
        return size() > 4;
      }
    };

    /** The bundled module as Chicory's build-time compiler left it (pom.xml): nothing to parse or compile. */
    static final Parsed PREBUILT =
        new Parsed(dev.backstop.internal.BackstopWasm.load(), dev.backstop.internal.BackstopWasm::create);

    final WasmModule module;
    final Function<Instance, Machine> machine; // null: the interpreter

    private Parsed(WasmModule module, Function<Instance, Machine> machine) {
      this.module = module;
      this.machine = machine;
    }

    static Parsed of(byte[] wasm, boolean compiled) {
      String key;
      try {
        key = HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(wasm)) + (compiled ? "/c" : "/i");
      } catch (NoSuchAlgorithmException e) {
        throw new IllegalStateException(e);
      }
      synchronized (CACHE) {
        Parsed p = CACHE.get(key);
        if (p == null) {
          WasmModule m = Parser.parse(wasm);
          p = new Parsed(m, compiled ? Compiled.factory(m) : null);
          CACHE.put(key, p);
        }
        return p;
      }
    }
  }

  /** The compiler, in its own class so the interpreter never loads it. */
  private static final class Compiled {
    static Function<Instance, Machine> factory(WasmModule module) {
      try {
        return com.dylibso.chicory.compiler.MachineFactoryCompiler.builder(module)
            .withInterpreterFallback(com.dylibso.chicory.compiler.InterpreterFallback.SILENT)
            .compile();
      } catch (NoClassDefFoundError e) {
        throw new BackstopException("backstop: compiled(true) needs com.dylibso.chicory:compiler on the class path;"
            + " add it, or build the runtime with compiled(false)", e);
      }
    }
  }
}
