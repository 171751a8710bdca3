package dev.backstop;

import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.time.Duration;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Objects;
import java.util.function.BiConsumer;
import java.util.function.Consumer;
import java.util.function.Function;

/**
 * A queue worker's options: immutable, each {@code withX} returns a copy
 * (checked at once, naming the option). Defaults: prefetch 16, as many
 * handlers at once as the prefetch, a handler deadline of 5 minutes (below
 * RabbitMQ's consumer_timeout, 30 minutes by default), no metrics, the
 * built-in classification, no per-type policies, no hooks; Redis Streams:
 * entries idle 60 s reclaimed every 10 s, past 5 deliveries dead-lettered.
 */
public final class WorkOptions implements Cloneable {
  /** The handler deadline by default. */
  public static final Duration HANDLER_TIMEOUT = Duration.ofMinutes(5);

  int prefetch = 16;
  int concurrency; // 0: the prefetch
  Duration handlerTimeout = HANDLER_TIMEOUT;
  // Redis Streams: the reclaim loop (as Go's redisqueue.WithReclaim).
  Duration reclaimEvery = Duration.ofSeconds(10);
  Duration minIdle = Duration.ofSeconds(60);
  int maxDeliveries = 5;
  PrometheusRegistry registry;
  String metricsPolicy = "default";
  Function<Throwable, Failure.Builder> classifier;
  Map<String, Policy> policies = Map.of();
  Consumer<QueueOutcome<Object>> onOutcome;
  BiConsumer<Throwable, Object> onError;
  // Test only (as Go's WithoutMover): the shared cases look at what the levels hold.
  boolean mover = true;
  // Test only: asks the core for an outcome (the shared cases' spy).
  QueueRunner.Asker asker = QueueRunner.Asker.POLICY;

  /** The defaults. */
  public static WorkOptions defaults() {
    return new WorkOptions();
  }

  private WorkOptions copy() {
    try {
      return (WorkOptions) clone();
    } catch (CloneNotSupportedException e) {
      throw new AssertionError(e);
    }
  }

  /** Deliveries in hand at once (1..65535). */
  public WorkOptions withPrefetch(int prefetch) {
    if (prefetch < 1 || prefetch > 65535) throw new IllegalArgumentException("work: prefetch must be in 1..65535 (got " + prefetch + ")");
    WorkOptions o = copy();
    o.prefetch = prefetch;
    return o;
  }

  /** Handlers running at once (default: the prefetch). */
  public WorkOptions withConcurrency(int n) {
    if (n < 1) throw new IllegalArgumentException("work: concurrency must be >= 1 (got " + n + ")");
    WorkOptions o = copy();
    o.concurrency = n;
    return o;
  }

  /** Each run of the handler's deadline (> 0): at it the handler's thread is interrupted and the attempt fails as a timeout. */
  public WorkOptions withHandlerTimeout(Duration d) {
    Objects.requireNonNull(d, "handlerTimeout");
    if (d.isZero() || d.isNegative()) throw new IllegalArgumentException("work: handlerTimeout must be > 0 (got " + d + ")");
    WorkOptions o = copy();
    o.handlerTimeout = d;
    return o;
  }

  /**
   * Redis Streams only (as Go's {@code redisqueue.WithReclaim}): every {@code every} the worker
   * claims the entries other consumers (crashed ones) have held for at least {@code minIdle}
   * and runs them; one delivered {@code maxDeliveries} times without an outcome is
   * dead-lettered {@code crash_loop}. While a job runs its entry is held every third of
   * {@code minIdle}, so a slow handler is not reclaimed. Defaults 10 s, 60 s, 5. RabbitMQ's
   * limit is the queue's ({@code RabbitBroker.queue(name, maxDeliveries)}).
   */
  public WorkOptions withReclaim(Duration every, Duration minIdle, int maxDeliveries) {
    Objects.requireNonNull(every, "every");
    Objects.requireNonNull(minIdle, "minIdle");
    if (every.toMillis() < 1) throw new IllegalArgumentException("work: reclaim every must be >= 1ms (got " + every + ")");
    if (minIdle.toMillis() < 1) throw new IllegalArgumentException("work: reclaim minIdle must be >= 1ms (got " + minIdle + ")");
    if (maxDeliveries < 1) throw new IllegalArgumentException("work: maxDeliveries must be >= 1 (got " + maxDeliveries + ")");
    WorkOptions o = copy();
    o.reclaimEvery = every;
    o.minIdle = minIdle;
    o.maxDeliveries = maxDeliveries;
    return o;
  }

  /**
   * Metrics in registry: the backstop_client_* families (policy = policyName,
   * target = the queue) and the queue families (backstop_attempts_total, …
   * with queue and job_type).
   */
  public WorkOptions withMetrics(PrometheusRegistry registry, String policyName) {
    Objects.requireNonNull(registry, "registry");
    if (policyName == null || policyName.isEmpty()) throw new IllegalArgumentException("work: the metrics' policy name must be a non-empty string");
    WorkOptions o = copy();
    o.registry = registry;
    o.metricsPolicy = policyName;
    return o;
  }

  /** Classifies a handler's error first: the failure's fields, or null for the built-in classification. */
  public WorkOptions withClassifier(Function<Throwable, Failure.Builder> classifier) {
    WorkOptions o = copy();
    o.classifier = classifier;
    return o;
  }

  /** A policy per job type: its jobs run with it (its breaker defers them without pausing the worker). */
  public WorkOptions withPolicies(Map<String, Policy> policies) {
    Map<String, Policy> m = new LinkedHashMap<>();
    policies.forEach((t, p) -> {
      if (t == null || !QueueMetrics.JOB_TYPE.matcher(t).matches()) {
        throw new IllegalArgumentException("work: policies key must be 1..64 of [A-Za-z0-9_./-] (got " + t + ")");
      }
      m.put(t, Objects.requireNonNull(p, "policies[" + t + "]"));
    });
    WorkOptions o = copy();
    o.policies = Collections.unmodifiableMap(m);
    return o;
  }

  /**
   * Told once of every outcome the worker applied ({@link QueueOutcome}: the
   * queue, the job, action, reason, class, delay, error); what it throws goes
   * to onError and the worker goes on.
   */
  @SuppressWarnings({"unchecked", "rawtypes"})
  public <J> WorkOptions withOnOutcome(Consumer<QueueOutcome<J>> hook) {
    WorkOptions o = copy();
    o.onOutcome = (Consumer) hook;
    return o;
  }

  /** Told of the worker's errors (a lost connection, an outcome not applied), with the job when there is one (else null). */
  @SuppressWarnings("unchecked")
  public <J> WorkOptions withOnError(BiConsumer<Throwable, J> hook) {
    WorkOptions o = copy();
    o.onError = (BiConsumer<Throwable, Object>) hook;
    return o;
  }

  WorkOptions withoutMover() {
    WorkOptions o = copy();
    o.mover = false;
    return o;
  }

  WorkOptions withAsker(QueueRunner.Asker asker) {
    WorkOptions o = copy();
    o.asker = asker;
    return o;
  }

  int concurrency() {
    return concurrency > 0 ? concurrency : prefetch;
  }
}
