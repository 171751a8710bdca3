package dev.backstop;

import io.prometheus.metrics.core.metrics.Counter;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.util.Map;
import java.util.WeakHashMap;

/**
 * The idempotency families, the names and help Go's idempotency.Metrics,
 * Node's and Python's Metrics give them (docs/idempotency.md, "Metrics"):
 * one set per registry, every series there from the start.
 */
final class IdempotencyMetrics {
  private static final Map<PrometheusRegistry, IdempotencyMetrics> REGISTRIES = new WeakHashMap<>();

  private final Counter requests;
  private final Counter leaseExpiries;
  private final Counter leaseLost;
  private final Counter storeErrors;

  private IdempotencyMetrics(PrometheusRegistry r) {
    requests = Counter.builder().name("backstop_idempotency_requests_total")
        .help("Requests carrying an idempotency key, by outcome: first_run, replayed, in_progress, conflict, too_large.")
        .labelNames("outcome").register(r);
    leaseExpiries = Counter.builder().name("backstop_idempotency_lease_expiries_total")
        .help("Keys taken over because their owner's lease ran out (a crashed or slow request).").register(r);
    leaseLost = Counter.builder().name("backstop_idempotency_lease_lost_total")
        .help("Complete or fail refused because the caller no longer owned its key.").register(r);
    storeErrors = Counter.builder().name("backstop_idempotency_store_errors_total")
        .help("Calls to the idempotency store that failed, by operation: begin, complete, fail.")
        .labelNames("operation").register(r);
    for (String o : new String[] {"first_run", "replayed", "in_progress", "conflict", "too_large"}) requests.labelValues(o);
    for (String o : new String[] {"begin", "complete", "fail"}) storeErrors.labelValues(o);
  }

  /** The families on r, registered on first use. */
  static synchronized IdempotencyMetrics on(PrometheusRegistry r) {
    return REGISTRIES.computeIfAbsent(r, IdempotencyMetrics::new);
  }

  void request(String outcome) {
    requests.labelValues(outcome).inc();
  }

  void storeError(String operation) {
    storeErrors.labelValues(operation).inc();
  }

  void leaseExpiry() {
    leaseExpiries.inc();
  }

  void leaseLost() {
    leaseLost.inc();
  }
}
