package dev.backstop;

import java.lang.ref.Cleaner;
import java.time.Duration;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Optional;

/**
 * A retry policy loaded into backstop.wasm: the same decisions as the Go,
 * Node.js and Python hosts, byte for byte.
 *
 * <pre>{@code
 * try (Policy p = Policy.preset("default")) {
 *   Decision d = p.decide(Failure.builder().attempt(1).httpStatus(503).build());
 *   if (d.isRetry()) Thread.sleep(d.delayMs());
 * }
 * }</pre>
 *
 * <p>Each policy has its own retry budget and circuit breaker, even when two
 * are loaded from the same bytes. A policy is safe for concurrent use: its
 * calls are serialised on the module instance that holds it (see
 * {@link PolicyRuntime}, "Threads"). Close it to free its handle; one that is
 * dropped unclosed is freed when it is garbage collected.
 *
 * <h2>Errors</h2>
 *
 * <p>An invalid policy is a {@link PolicyException}, an invalid failure an
 * {@link InputException} (no state changes), each with the module's message;
 * a call after {@link #close()} an {@link IllegalStateException}; a call on
 * a stateful policy whose instance trapped a {@link StateLostException}.
 * Bad input never traps the module.
 *
 * <p>Its methods of one call each ({@code acquire}, {@code recordSuccess},
 * {@code budgetTokens}, {@code circuitState}, {@code attemptTimeout}) and
 * {@code isStateful}, {@code onOpen} are generated from the contract
 * ({@code PolicyExports}).
 */
public final class Policy extends PolicyExports implements AutoCloseable {
  private static final Cleaner CLEANER = Cleaner.create();

  private final PolicyRuntime runtime;
  private final byte[] bytes; // kept to load a stateless policy again after a trap
  private final boolean preset;
  private final Facts facts;
  private static final System.Logger LOG = System.getLogger("dev.backstop");
  /** The lint texts already logged by this JVM; lints() still lists every lint. */
  private static final java.util.Set<String> WARNED = java.util.concurrent.ConcurrentHashMap.newKeySet();

  /** Forgets the lints already logged (tests: each sees its own warnings, in any order). */
  static void resetLintWarnings() {
    WARNED.clear();
  }
  private final boolean boundsAttempts;
  private final Ref ref;
  private final Cleaner.Cleanable cleanable;
  private boolean closed; // under this
  private StateLostException lost; // under this

  /** Where the policy lives: its instance and handle there (shared with the cleaner). */
  private static final class Ref implements Runnable {
    volatile ModuleInstance in;
    volatile int handle;

    @Override
    public void run() {
      ModuleInstance i = in;
      if (i == null) return;
      i.lock.lock();
      try {
        if (i.dead == null) i.free(handle);
      } catch (BackstopException e) {
        // The instance broke; its handles went with it.
      } finally {
        i.lock.unlock();
      }
    }
  }

  Policy(PolicyRuntime runtime, byte[] bytes, boolean preset) {
    this.runtime = runtime;
    this.preset = preset;
    this.ref = new Ref();
    ModuleInstance in = runtime.pick();
    in.lock.lock();
    try {
      int h = in.load(bytes, preset);
      ref.in = in;
      ref.handle = h;
      try {
        // The module answers lint bits; the schema's table (Lint) spells them out.
        this.facts = new Facts(export -> in.call(export, h));
        // attempt_timeout reads no state, and is 0 at every elapsed time
        // when it is 0 at the start (wasm/ABI.md, "attempt_timeout").
        this.boundsAttempts = in.call("attempt_timeout", h, 0) != 0;
      } catch (RuntimeException e) {
        if (in.dead == null) in.free(h);
        throw e;
      }
    } finally {
      in.lock.unlock();
    }
    this.bytes = facts.stateful ? null : bytes;
    this.cleanable = CLEANER.register(this, ref);
    for (Lint l : facts.lints) {
      // Once per JVM per lint text (like Node's deprecation warnings): a
      // service that loads the same policy per request must not flood its log.
      if (WARNED.add(l.toString())) LOG.log(System.Logger.Level.WARNING, "backstop: policy lint {0}", l);
    }
  }

  /**
   * Loads a policy from JSON or YAML bytes into the bundled runtime.
   *
   * @throws PolicyException naming every invalid field
   */
  public static Policy load(byte[] policy) {
    return PolicyRuntime.bundled().load(policy);
  }

  /**
   * Loads a policy from a JSON or YAML string into the bundled runtime, or
   * the preset a bare word names ({@code "default"}).
   *
   * @throws PolicyException naming every invalid field, or an unknown preset
   */
  public static Policy load(String policy) {
    return PolicyRuntime.bundled().load(policy);
  }

  /**
   * Loads a named preset into the bundled runtime: {@code default},
   * {@code critical}, {@code batch}, {@code cloud-tasks}, {@code fast-transient}.
   */
  public static Policy preset(String name) {
    return PolicyRuntime.bundled().preset(name);
  }

  /**
   * The policy's lints (docs/policy.md, "Lints"): each choice the retry
   * guidance names as a classic mistake, which the policy still decides as
   * written, in code order. Loading also logged each as a warning. Lints its
   * {@code lint_ignore} names are left out.
   */
  public List<Lint> lints() {
    return facts.lints;
  }

  /**
   * True when the policy's {@code on_open} is {@code dead_letter} (else {@code defer}).
   *
   * @deprecated {@link #onOpen()}, as the other hosts name it
   */
  @Deprecated
  public boolean deadLetterOnOpen() {
    return facts.onOpen == OnOpen.DEAD_LETTER;
  }

  /** The error of a call on a closed policy. */
  static IllegalStateException closedError() {
    return new IllegalStateException("backstop: the policy is closed");
  }

  private interface Call<T> {
    T run(ModuleInstance in, int handle);
  }

  /**
   * Runs a call on the instance that holds the policy, locked. A stateless
   * policy whose instance trapped is loaded again into another first.
   */
  private <T> T call(Call<T> c) {
    synchronized (this) {
      if (closed) throw closedError();
      if (lost != null) throw lost;
      ModuleInstance in = ref.in;
      if (in.dead != null) {
        if (facts.stateful) {
          lost = new StateLostException("backstop: the policy's retry budget and circuit breaker were lost with the"
              + " module instance that held them, which trapped (" + in.dead.getMessage()
              + "); load the policy again", in.dead);
          throw lost;
        }
        in = runtime.pick();
        in.lock.lock();
        try {
          ref.handle = in.load(bytes, preset);
          ref.in = in;
        } finally {
          in.lock.unlock();
        }
      }
      in.lock.lock();
      try {
        return c.run(in, ref.handle);
      } finally {
        in.lock.unlock();
      }
    }
  }

  /**
   * The decision for one failure. An unset {@code nowMs} is
   * {@code System.currentTimeMillis()}, an unset {@code random} a uniform
   * draw in [0, 1).
   *
   * @throws InputException for an invalid field (the module's range checks:
   *     {@code attempt: must be >= 1 (got 0)}); no state changes
   */
  public Decision decide(Failure failure) {
    return Decision.unpack(call((in, h) -> in.decide("decide", failure, new long[] {h})));
  }

  /**
   * Decides failures in order, as {@link #decide} would one by one, in a few
   * large calls into the module (decide_batch), which is faster for many.
   *
   * @throws InputException for the first invalid failure, with its index
   *     ({@code failures[3]: attempt: must be >= 1 (got 0)}) and the
   *     decisions of the whole batch, null at each invalid index: a bad
   *     entry never stops the batch, and a stateful policy counts exactly the
   *     valid ones
   */
  public List<Decision> decideMany(List<Failure> failures) {
    int n = failures.size();
    Decision[] out = new Decision[n];
    InputException first = null;
    int firstIndex = -1;
    for (int from = 0, k; from < n; from += k) {
      int start = from;
      InputException e = null;
      k = 1;
      if (failures.get(from).value != null) { // not a record: decided alone (decide_value)
        try {
          out[from] = decide(failures.get(from));
        } catch (InputException alone) {
          e = alone;
        }
      } else {
        while (k < BATCH && from + k < n && failures.get(from + k).value == null) k++;
        int records = k;
        e = call((in, h) -> in.decideBatch(h, failures, start, records, out));
      }
      if (e != null && first == null) {
        first = e;
        firstIndex = from;
        while (out[firstIndex] != null) firstIndex++; // this call's first invalid one
      }
    }
    List<Decision> decisions = Arrays.asList(out);
    if (first != null) throw new InputException(first, firstIndex, decisions);
    return Collections.unmodifiableList(decisions);
  }

  private static final int BATCH = 256;

  /**
   * What a queue worker does about one event of a job, decided by the core
   * as in every language (wasm/ABI.md, "outcome"; the shared cases
   * testdata/outcomes): run the job, ack it, retry it, defer it (pause: take
   * no job of this policy for the delay) or dead-letter it, and which client
   * metric to count. An invalid failure is an outcome, not an exception: it
   * is dead-lettered ({@code malformed}) with {@code invalid} and the
   * message in {@code error}.
   *
   * @param failure {@code FAILURE}: the failure with the job's facts
   *     (attempt, elapsed, previous delay, its id as the key); every event:
   *     its {@code nowMs} (unset: the clock)
   * @param deliveries {@code DELIVERED}: the broker's count of deliveries
   * @param maxDeliveries {@code DELIVERED}: the worker's limit, 0 none
   * @throws InputException for an invalid event: a negative count, or for
   *     {@code BEFORE} and {@code SUCCESS} a nowMs below 0, or 0 on a
   *     stateful policy; no state changes
   */
  public Outcome outcome(Outcome.Event event, Failure failure, long deliveries, long maxDeliveries) {
    return call((in, h) -> {
      long w = in.decide("outcome", failure, new long[] {h, event.code}, deliveries, maxDeliveries);
      return Outcome.unpack(w, Contract.outcomeInvalid(w) ? in.inputError().getMessage() : null);
    });
  }

  /** {@link #outcome(Outcome.Event, Failure, long, long)} of a {@code FAILURE} (or another event at the failure's nowMs). */
  public Outcome outcome(Outcome.Event event, Failure failure) {
    return outcome(event, failure, 0, 0);
  }

  /** {@link #outcome(Outcome.Event, Failure, long, long)} of a {@code BEFORE} or {@code SUCCESS} event at nowMs. */
  public Outcome outcome(Outcome.Event event, long nowMs) {
    return outcome(event, Failure.builder().nowMs(nowMs).build(), 0, 0);
  }

  /** {@link #recordDuration(long, long)} of a call that took {@code took}, ending now. */
  public void recordDuration(Duration took) {
    recordDuration(System.currentTimeMillis(), took.toMillis());
  }

  @Override
  Facts facts() {
    return facts;
  }

  @Override
  long call(String export, long arg) {
    return call((in, h) -> in.call(export, h, arg));
  }

  @Override
  long call(String export, long nowMs, long arg) {
    return call((in, h) -> in.call(export, h, nowMs, arg));
  }

  /**
   * The policy's {@code connect_timeout}, empty when it has none (the
   * client's own applies): how long establishing a connection may take
   * within an attempt, for the client to enforce, e.g.
   * {@code policy.connectTimeout().ifPresent(builder::connectTimeout)} on an
   * {@link java.net.http.HttpClient.Builder}. A connect that runs out
   * ({@link java.net.http.HttpConnectTimeoutException}) is the error kind
   * {@code connect_timeout}, not {@code timeout}.
   */
  public Optional<Duration> connectTimeout() {
    return facts.connectTimeoutMs == 0 ? Optional.empty() : Optional.of(Duration.ofMillis(facts.connectTimeoutMs));
  }

  /** True when {@link #attemptTimeout} may be other than 0: the retry loop asks it only then. */
  boolean boundsAttempts() {
    return boundsAttempts;
  }

  /** Frees the policy's handle. Closing twice, or after a trap, does nothing. */
  @Override
  public void close() {
    synchronized (this) {
      if (closed) return;
      closed = true;
    }
    cleanable.clean();
  }
}
