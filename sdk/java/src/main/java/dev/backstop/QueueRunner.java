package dev.backstop;

import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.Function;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * The steps around a decision that a queue worker takes for each job,
 * whatever the broker (Go's queue.Runner, Node's runner.js, Python's
 * backstop._decide.Runner): the job's policy and metrics (its type's own),
 * the breaker's gate before the handler runs, the handler within its
 * deadline, the outcome as the core decides it ({@link Policy#outcome}) and
 * the count in the client metrics. No broker I/O.
 */
final class QueueRunner {
  static final Logger LOG = Logger.getLogger("dev.backstop.queue");

  /** How the worker asks the core (the shared cases' spy replaces it). */
  interface Asker {
    Outcome ask(Policy p, Outcome.Event e, Failure f, long deliveries, long maxDeliveries);

    Asker POLICY = (p, e, f, d, m) -> p.outcome(e, f, d, m);
  }

  // Handlers run here, so that the worker can stop waiting at the deadline;
  // their thread is interrupted then.
  private static final ExecutorService HANDLERS = Executors.newCachedThreadPool(r -> {
    Thread t = new Thread(r, "backstop-handler");
    t.setDaemon(true);
    return t;
  });

  record Typed(Policy policy, RetryMetrics metrics) {}

  final String queue;
  private final Typed main;
  private final Map<String, Typed> typed = new HashMap<>();
  private final Retry classifier;
  private final Asker asker;
  private final WorkOptions o;
  private final String malformed;
  private volatile long pausedUntil;

  QueueRunner(String queue, Policy policy, WorkOptions o, String malformed) {
    this.queue = queue;
    this.o = o;
    this.malformed = malformed;
    RetryMetrics m = o.registry == null ? null : BackstopMetrics.recorder(o.registry, o.metricsPolicy, queue);
    main = new Typed(policy, m);
    o.policies.forEach((t, p) -> typed.put(t, new Typed(p,
        o.registry == null ? null : BackstopMetrics.recorder(o.registry, t, queue))));
    Function<Throwable, Failure.Builder> c = o.classifier;
    classifier = new Retry(policy).withClassifier(c);
    asker = o.asker;
  }

  /** The policy and metrics a job of type runs with: its type's own, else the worker's. */
  Typed policyFor(String type) {
    return typed.getOrDefault(type, main);
  }

  boolean owns(String type) {
    return typed.containsKey(type);
  }

  long pausedUntil() {
    return pausedUntil;
  }

  Outcome ask(Policy p, Outcome.Event e, Failure f, long deliveries, long max) {
    return asker.ask(p, e, f, deliveries, max);
  }

  /** The plan of a job the breaker refuses before it runs, or null to run it (a policy that cannot answer lets it run). */
  QueuePlan gate(Policy p, long now) {
    Outcome out;
    try {
      out = ask(p, Outcome.Event.BEFORE, Failure.builder().nowMs(now).build(), 0, 0);
    } catch (RuntimeException e) {
      return null;
    }
    if (out.action() == Outcome.Action.RUN) return null;
    String text = out.action() == Outcome.Action.DEAD_LETTER ? "circuit breaker open: the job was not run" : "";
    return new QueuePlan(out.action(), out.reason(), null, text, out.delayMs(), out.count(), out.pause());
  }

  /**
   * Runs handler on job within the deadline: null for a success, else the
   * failure (at the deadline a TimeoutException, error kind timeout). How
   * long it ran (monotonic) goes to p's breaker first, for its slow-call
   * rate, success or failure.
   */
  <J> Throwable run(Policy p, QueueHandler<J> handler, J job, String jobId) {
    long started = System.nanoTime();
    Throwable t = run(handler, job, jobId);
    if (p.isStateful()) {
      try {
        p.recordDuration(System.currentTimeMillis(), Math.max(0, (System.nanoTime() - started) / 1_000_000));
      } catch (RuntimeException e) { // the outcome the caller asks next applies all the same
        report(e, null);
      }
    }
    return t;
  }

  private <J> Throwable run(QueueHandler<J> handler, J job, String jobId) {
    long ms = o.handlerTimeout.toMillis();
    Future<?> f = HANDLERS.submit(() -> {
      handler.handle(job);
      return null;
    });
    try {
      f.get(ms, TimeUnit.MILLISECONDS);
      return null;
    } catch (ExecutionException e) {
      return e.getCause() != null ? e.getCause() : e;
    } catch (TimeoutException e) {
      f.cancel(true);
      TimeoutException t = new TimeoutException("handler deadline exceeded after " + ms + " ms");
      LOG.log(Level.WARNING, "queue " + queue + ": job " + jobId + ": " + t.getMessage()
          + ", failed as a timeout; its thread was interrupted");
      return t;
    } catch (InterruptedException e) {
      f.cancel(true);
      Thread.currentThread().interrupt();
      return e;
    }
  }

  static String errorText(Throwable t) {
    if (t == null) return "";
    String m = t.getMessage();
    return m != null && !m.isEmpty() ? m : t.getClass().getName();
  }

  /** What to do about the handler's outcome (t null: success), as the core decides it. */
  QueuePlan plan(Policy p, long attempt, String id, long firstMs, long prevDelayMs, boolean malformedJob, Throwable t,
      long now) {
    if (malformedJob) {
      return QueuePlan.deadLetter(Decision.Reason.MALFORMED, malformed + (t != null ? " (" + errorText(t) + ")" : ""));
    }
    if (t == null) {
      Outcome out = ask(p, Outcome.Event.SUCCESS, Failure.builder().nowMs(now).build(), 0, 0);
      return new QueuePlan(out.action(), out.reason(), null, "", out.delayMs(), out.count(), out.pause());
    }
    // A queue job has no method: it is not gated; its id is its idempotency key.
    Failure.Builder fields = classifier.failureOf(t).method("");
    fields.attempt(attempt).idempotencyKey(id).nowMs(now).elapsedMs(Math.max(0, now - firstMs)).prevDelayMs(prevDelayMs);
    String text = errorText(t);
    Outcome out = ask(p, Outcome.Event.FAILURE, fields.build(), 0, 0);
    if (out.invalid()) {
      return new QueuePlan(Outcome.Action.DEAD_LETTER, Decision.Reason.MALFORMED, null,
          text + " (policy refused the failure: " + out.error() + ")", 0, Outcome.Count.DEAD_LETTER, false);
    }
    return new QueuePlan(out.action(), out.reason(), out, text, out.delayMs(), out.count(), out.pause());
  }

  /**
   * Records the latency of a retried job as it starts (as Go's Runner
   * measure): now on the broker's clock minus the failure's time, its due
   * time minus the delay decided then. A job deferred since its failure (the
   * breaker, the budget) is not measured: its due time is the deferral's.
   */
  static void measure(Typed t, long attempt, long dueMs, long prevDelayMs, String lastReason, long nowMs) {
    RetryMetrics m = t.metrics();
    if (m == null || attempt < 2 || dueMs <= 0 || prevDelayMs < 0 || prevDelayMs > dueMs
        || Decision.Reason.CIRCUIT_OPEN.toString().equals(lastReason)
        || Decision.Reason.BUDGET_EXHAUSTED.toString().equals(lastReason)) {
      return;
    }
    m.latency(nowMs - (dueMs - prevDelayMs));
  }

  /** Counts a plan in the client metrics as the core's count says, then the breaker's state and the budget. */
  void count(Typed t, QueuePlan plan, boolean own) {
    if (!own && plan.pause()) pausedUntil = Math.max(pausedUntil, System.currentTimeMillis() + plan.delayMs());
    RetryMetrics m = t.metrics();
    if (m == null) return;
    switch (plan.count()) {
      case REFUSED:
        m.refused(plan.reason().toString());
        break;
      case RETRY:
        m.attempt("retry");
        m.retry(plan.reason(), plan.delayMs());
        break;
      case NONE:
        break;
      default:
        m.attempt(plan.count().toString());
    }
    if (t.policy().isStateful()) {
      m.state(t.policy().circuitState());
      t.policy().budgetTokens().ifPresent(m::budget);
    }
  }

  /** Tells onOutcome of an applied outcome; what it throws goes to onError. */
  void tell(Object job, QueuePlan plan) {
    if (o.onOutcome == null) return;
    try {
      o.onOutcome.accept(QueueOutcome.of(queue, job, plan));
    } catch (RuntimeException e) {
      report(e, job);
    }
  }

  /** Tells onError (else logs); a failing logger does not stop the worker. */
  void report(Throwable err, Object job) {
    try {
      if (o.onError != null) {
        o.onError.accept(err, job);
      } else {
        LOG.log(Level.WARNING, "backstop queue " + queue + ": " + err.getMessage(), err);
      }
    } catch (RuntimeException e) {
      // A failing logger must not stop the worker.
    }
  }
}
