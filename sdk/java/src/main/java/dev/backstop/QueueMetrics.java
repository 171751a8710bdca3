package dev.backstop;

import io.prometheus.metrics.core.metrics.Counter;
import io.prometheus.metrics.core.metrics.Histogram;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.WeakHashMap;
import java.util.regex.Pattern;

/**
 * The queue families a worker counts itself where the broker cannot count
 * outcomes by reason (RabbitMQ): the names the exporter gives the Redis stats
 * hash, with {@code queue} and {@code job_type}, as Go's internal/queuemetrics
 * and Python's backstop.rabbitmq._metrics.
 */
final class QueueMetrics {
  /** backstop_job_attempts buckets: the exporter's. */
  static final double[] ATTEMPT_BUCKETS = {1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50};
  /** How many job types a queue labels by name; the rest, and invalid ones, are "other". */
  static final int TYPE_LIMIT = 50;
  static final Pattern JOB_TYPE = Pattern.compile("[A-Za-z0-9_./-]{1,64}");

  private static final Map<PrometheusRegistry, Families> REGISTRIES = new WeakHashMap<>();

  private static final class Families {
    final Counter attempts;
    final Counter retries;
    final Counter deferrals;
    final Counter deadLetters;
    final Counter maxAttempts;
    final Histogram jobAttempts;
    final Map<String, QueueMetrics> queues = new HashMap<>();

    Families(PrometheusRegistry r) {
      attempts = Counter.builder().name("backstop_attempts_total")
          .help("Attempts by outcome (success, retry, dead_letter; deferred: a job the breaker or the budget refused, "
              + "its attempt not spent), counted by the workers.")
          .labelNames("queue", "job_type", "outcome").register(r);
      retries = Counter.builder().name("backstop_retries_total").help("Retries scheduled, by the policy's reason.")
          .labelNames("queue", "job_type", "reason").register(r);
      deferrals = Counter.builder().name("backstop_deferrals_total")
          .help("Jobs deferred without spending an attempt, by reason (circuit_open, budget_exhausted).")
          .labelNames("queue", "job_type", "reason").register(r);
      deadLetters = Counter.builder().name("backstop_dead_letters_total").help("Jobs dead-lettered, by reason.")
          .labelNames("queue", "job_type", "reason").register(r);
      maxAttempts = Counter.builder().name("backstop_max_attempts_reached_total")
          .help("Jobs dead-lettered because they used up their attempts.").labelNames("queue", "job_type").register(r);
      jobAttempts = Histogram.builder().name("backstop_job_attempts")
          .help("The attempt on which each job finished, by outcome (success, dead_letter).").classicOnly()
          .classicUpperBounds(ATTEMPT_BUCKETS).labelNames("queue", "job_type", "outcome").register(r);
    }
  }

  private final Families f;
  private final String queue;
  private final Set<String> types = new HashSet<>();

  private QueueMetrics(Families f, String queue) {
    this.f = f;
    this.queue = queue;
  }

  /** The queue families of queue in registry (shared by every worker of the queue in the process). */
  static QueueMetrics of(PrometheusRegistry registry, String queue) {
    synchronized (REGISTRIES) {
      Families f = REGISTRIES.get(registry);
      if (f == null) {
        try {
          f = new Families(registry);
        } catch (IllegalStateException | IllegalArgumentException e) {
          throw new IllegalArgumentException("work: the registry holds other metrics of backstop's names: "
              + e.getMessage(), e);
        }
        REGISTRIES.put(registry, f);
      }
      return f.queues.computeIfAbsent(queue, q -> new QueueMetrics(REGISTRIES.get(registry), q));
    }
  }

  private String type(String t) {
    if (t.isEmpty()) return "";
    if (!JOB_TYPE.matcher(t).matches()) return "other";
    synchronized (types) {
      if (types.contains(t)) return t;
      if (types.size() >= TYPE_LIMIT) return "other";
      types.add(t);
      return t;
    }
  }

  /** Counts an applied outcome; attempt 0 (a malformed message) is not observed in backstop_job_attempts. */
  void observe(String jobType, long attempt, QueuePlan plan) {
    String t = type(jobType);
    String reason = plan.reason().toString();
    if (reason.equals("malformed")) attempt = 0; // a due time past the bound too
    switch (plan.action()) {
      case ACK:
        f.attempts.labelValues(queue, t, "success").inc();
        finished(t, "success", attempt);
        break;
      case RETRY:
        f.attempts.labelValues(queue, t, "retry").inc();
        f.retries.labelValues(queue, t, reason).inc();
        break;
      case DEFER:
        f.attempts.labelValues(queue, t, "deferred").inc();
        f.deferrals.labelValues(queue, t, reason).inc();
        break;
      default:
        f.attempts.labelValues(queue, t, "dead_letter").inc();
        f.deadLetters.labelValues(queue, t, reason).inc();
        if (plan.reason() == Decision.Reason.MAX_ATTEMPTS_REACHED) f.maxAttempts.labelValues(queue, t).inc();
        finished(t, "dead_letter", attempt);
    }
  }

  private void finished(String t, String outcome, long attempt) {
    if (attempt >= 1) f.jobAttempts.labelValues(queue, t, outcome).observe(attempt);
  }
}
