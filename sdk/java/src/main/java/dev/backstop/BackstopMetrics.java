package dev.backstop;

import io.prometheus.metrics.core.metrics.Counter;
import io.prometheus.metrics.core.metrics.Gauge;
import io.prometheus.metrics.core.metrics.Histogram;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.util.Map;
import java.util.Objects;
import java.util.WeakHashMap;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The process metrics (backstop_client_*) through the Prometheus Java
 * client (io.prometheus:prometheus-metrics-core, an optional dependency:
 * add it to use this class): the same families, labels, types and buckets
 * as Go's retry.WithMetrics, Node's createMetrics and Python's
 * backstop.metrics (testdata/metrics).
 *
 * <pre>{@code
 * RetryMetrics m = BackstopMetrics.recorder(PrometheusRegistry.defaultRegistry, "payments", "charge-api");
 * Backstop.retrying(policy).withMetrics(m).call(op);
 * }</pre>
 */
public final class BackstopMetrics {
  static final double[] DELAY_BUCKETS = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
  private static final CircuitState[] STATES = CircuitState.values();

  // One registry's families, shared by every recorder on it.
  private static final Map<PrometheusRegistry, BackstopMetrics> REGISTRIES = new WeakHashMap<>();

  private final Counter attempts;
  private final Counter retries;
  private final Counter refused;
  private final Histogram delay;
  private final Histogram latency;
  private final Gauge state;
  private final Counter transitions;
  private final Gauge budget;
  private final Map<String, CircuitState> last = new ConcurrentHashMap<>();

  private BackstopMetrics(PrometheusRegistry registry) {
    attempts = Counter.builder().name("backstop_client_attempts_total")
        .help("Calls made (or refused) under a backstop policy, by outcome: success, retry, dead_letter, refused.")
        .labelNames("policy", "target", "outcome").register(registry);
    retries = Counter.builder().name("backstop_client_retries_total").help("Retries scheduled, by the policy's reason.")
        .labelNames("policy", "target", "reason").register(registry);
    refused = Counter.builder().name("backstop_client_calls_refused_total")
        .help("Calls refused before they were made, by reason: circuit_open, budget_exhausted.")
        .labelNames("policy", "target", "reason").register(registry);
    delay = Histogram.builder().name("backstop_client_retry_delay_seconds").help("Delay scheduled before each retry.")
        .classicOnly().classicUpperBounds(DELAY_BUCKETS).labelNames("policy", "target").register(registry);
    latency = Histogram.builder().name("backstop_client_retry_latency_seconds")
        .help("Measured time from a failed attempt to the start of the next one (the decided delay is"
            + " backstop_client_retry_delay_seconds).")
        .classicOnly().classicUpperBounds(DELAY_BUCKETS).labelNames("policy", "target").register(registry);
    state = Gauge.builder().name("backstop_client_circuit_state")
        .help("Circuit breaker state last seen by this process: 1 for the current state, 0 for the others.")
        .labelNames("policy", "target", "state").register(registry);
    transitions = Counter.builder().name("backstop_client_circuit_transitions_total")
        .help("Circuit breaker state changes seen by this process.")
        .labelNames("policy", "target", "from", "to").register(registry);
    budget = Gauge.builder().name("backstop_client_budget_tokens")
        .help("Retry budget left as last seen by this process: a token bucket's tokens (retries pass while more than"
            + " half remain), or the retries a window budget still allows. Absent without a budget.")
        .labelNames("policy", "target").register(registry);
  }

  /**
   * The recorder of one policy and target in registry, registering the
   * families on first use; later calls on the same registry reuse them.
   *
   * @throws IllegalArgumentException when policy or target is empty, or the
   *     registry holds other metrics under these names
   */
  public static RetryMetrics recorder(PrometheusRegistry registry, String policy, String target) {
    Objects.requireNonNull(registry, "registry");
    for (String[] nv : new String[][] {{"policy", policy}, {"target", target}}) {
      if (nv[1] == null || nv[1].isEmpty()) throw new IllegalArgumentException("`" + nv[0] + "` must be a non-empty string");
    }
    BackstopMetrics fam;
    synchronized (REGISTRIES) {
      fam = REGISTRIES.get(registry);
      if (fam == null) {
        try {
          fam = new BackstopMetrics(registry);
        } catch (IllegalStateException | IllegalArgumentException e) {
          throw new IllegalArgumentException("BackstopMetrics: the registry holds other metrics of backstop's names: "
              + e.getMessage(), e);
        }
        REGISTRIES.put(registry, fam);
      }
    }
    return fam.new Recorder(policy, target);
  }

  private final class Recorder implements RetryMetrics {
    private final String policy;
    private final String target;
    private final String key;

    Recorder(String policy, String target) {
      this.policy = policy;
      this.target = target;
      this.key = policy + "\u0000" + target;
    }

    @Override
    public void attempt(String outcome) {
      switch (outcome) {
        case "success":
        case "retry":
        case "dead_letter":
        case "refused":
          attempts.labelValues(policy, target, outcome).inc();
          return;
        default:
          throw new IllegalArgumentException("outcome must be one of success, retry, dead_letter, refused (got "
              + outcome + ")");
      }
    }

    @Override
    public void retry(Decision.Reason reason, long delayMs) {
      retries.labelValues(policy, target, reason.toString()).inc();
      delay.labelValues(policy, target).observe(delayMs / 1000.0);
    }

    @Override
    public void latency(long ms) {
      latency.labelValues(policy, target).observe(Math.max(0, ms) / 1000.0);
    }

    @Override
    public void refused(String reason) {
      attempts.labelValues(policy, target, "refused").inc();
      refused.labelValues(policy, target, reason).inc();
    }

    @Override
    public void budget(double tokens) {
      if (Double.isFinite(tokens)) budget.labelValues(policy, target).set(tokens);
    }

    @Override
    public void state(CircuitState s) {
      CircuitState prev = last.put(key, s);
      if (prev == s) return;
      for (CircuitState c : STATES) state.labelValues(policy, target, c.toString()).set(c == s ? 1 : 0);
      if (prev != null) transitions.labelValues(policy, target, prev.toString(), s.toString()).inc();
    }
  }
}
