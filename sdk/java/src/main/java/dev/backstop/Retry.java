package dev.backstop;

import java.net.http.HttpResponse;
import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.Function;

/**
 * A retry loop's options: immutable, each {@code withX} returns a copy.
 * Defaults: no method, no idempotency key (so the idempotency gate lets
 * every request be retried, as for a GET), no metrics, the built-in
 * classification. Safe to share between threads.
 */
public final class Retry {
  /** Called before each retry's sleep: the attempt that failed, its error (null for a failed response), the decision. */
  @FunctionalInterface
  public interface Listener {
    void onRetry(int attempt, Throwable error, Decision decision);
  }

  /** The loop's clock and sleep: real by default; tests replace it (never exported). */
  interface Ticker {
    long nowMs();

    long nanos();

    void sleep(long ms) throws InterruptedException;
  }

  static final Ticker REAL = new Ticker() {
    @Override
    public long nowMs() {
      return System.currentTimeMillis();
    }

    @Override
    public long nanos() {
      return System.nanoTime();
    }

    @Override
    public void sleep(long ms) throws InterruptedException {
      Thread.sleep(ms);
    }
  };

  // Attempts bounded by attempt_timeout run here, so the loop can stop
  // waiting for them; their thread is interrupted at the deadline.
  private static final ExecutorService TIMED = Executors.newCachedThreadPool(r -> {
    Thread t = new Thread(r, "backstop-attempt");
    t.setDaemon(true);
    return t;
  });

  private final Policy policy;
  private final String method;
  private final String idempotencyKey;
  private final RetryMetrics metrics;
  private final Function<Throwable, Failure.Builder> classifier;
  private final Listener listener;
  private final Ticker ticker;

  Retry(Policy policy) {
    this(Objects.requireNonNull(policy, "policy"), null, null, null, null, null, REAL);
  }

  private Retry(Policy policy, String method, String idempotencyKey, RetryMetrics metrics,
      Function<Throwable, Failure.Builder> classifier, Listener listener, Ticker ticker) {
    this.policy = policy;
    this.method = method;
    this.idempotencyKey = idempotencyKey;
    this.metrics = metrics;
    this.classifier = classifier;
    this.listener = listener;
    this.ticker = ticker;
  }

  /** The request's HTTP method, for the idempotency gate (POST and PATCH need a key to be retried). */
  public Retry withMethod(String method) {
    return new Retry(policy, method, idempotencyKey, metrics, classifier, listener, ticker);
  }

  /** The request's idempotency key, if it has one. */
  public Retry withIdempotencyKey(String key) {
    return new Retry(policy, method, key, metrics, classifier, listener, ticker);
  }

  /** Records attempts, retries, refusals, the breaker and the budget ({@link BackstopMetrics#recorder}). */
  public Retry withMetrics(RetryMetrics metrics) {
    return new Retry(policy, method, idempotencyKey, metrics, classifier, listener, ticker);
  }

  /**
   * Classifies errors first: return the failure's fields for an error you
   * know (a status, an error kind), or null to leave it to the built-in
   * classification.
   */
  public Retry withClassifier(Function<Throwable, Failure.Builder> classifier) {
    return new Retry(policy, method, idempotencyKey, metrics, classifier, listener, ticker);
  }

  /** Called before each retry's sleep. */
  public Retry withListener(Listener listener) {
    return new Retry(policy, method, idempotencyKey, metrics, classifier, listener, ticker);
  }

  Retry withTicker(Ticker ticker) {
    return new Retry(policy, method, idempotencyKey, metrics, classifier, listener, ticker);
  }

  /**
   * Runs op until it succeeds or the policy says stop. Inside op,
   * {@link Backstop#attempt()} is the attempt number; a loop that gives up
   * tells the request {@link OneLayerFilter} serves on this thread, if any.
   *
   * @return what op returned on its first success
   * @throws RetryException when the policy says stop (its cause is the last error)
   * @throws InterruptedException when the thread is interrupted while waiting
   */
  public <T> T call(Callable<T> op) throws InterruptedException {
    Objects.requireNonNull(op, "op");
    long start = ticker.nanos();
    boolean guarded = policy.isStateful();
    long prevDelayMs = 0;
    long failedAt = -1; // ticker.nanos() of the last failure, when a retry follows it
    for (int attempt = 1; ; attempt++) {
      if (guarded) {
        Permit permit = policy.acquire(ticker.nowMs());
        if (metrics != null) metrics.state(permit.state());
        if (!permit.allowed()) {
          if (metrics != null) metrics.refused("circuit_open");
          Layers.recordGaveUp(Decision.Reason.CIRCUIT_OPEN);
          Throwable cause = new BackstopException("the circuit breaker refused the call; it may admit one in "
              + permit.retryInMs() + " ms");
          throw new RetryException(Decision.Reason.CIRCUIT_OPEN, attempt - 1, cause, null, null, permit.retryInMs());
        }
      }
      // The measured latency of this retry: its delay plus however late the
      // sleep returned (the decided delay is in metrics.retry).
      if (failedAt >= 0 && metrics != null) metrics.latency((ticker.nanos() - failedAt) / 1_000_000);
      Throwable error = null;
      HttpResponse<?> response = null;
      long timeoutMs = policy.boundsAttempts() ? policy.attemptTimeout(elapsedMs(start)) : 0;
      long called = ticker.nanos();
      try {
        T result = timeoutMs > 0 ? timed(op, attempt, timeoutMs) : Layers.run(attempt, Layers.request(), op);
        if (!(result instanceof HttpResponse) || ((HttpResponse<?>) result).statusCode() < 400) {
          if (guarded) { // a stateless policy has nothing to feed
            policy.recordDuration(ticker.nowMs(), tookMs(called));
            policy.recordSuccess(ticker.nowMs());
          }
          if (metrics != null) {
            metrics.attempt("success");
            if (guarded) observe();
          }
          return result;
        }
        response = (HttpResponse<?>) result;
        error = HttpStatusException.of(response);
      } catch (InterruptedException e) {
        throw e; // the caller's decision, never a failure to retry
      } catch (Error e) {
        throw e;
      } catch (Exception e) {
        error = e;
      }
      // The call's duration (monotonic), failed as it is, for the breaker's
      // slow-call rate.
      if (guarded) policy.recordDuration(ticker.nowMs(), tookMs(called));
      failedAt = ticker.nanos();
      Failure.Builder fields = response != null ? responseFields(response) : failureOf(error);
      fields.attempt(attempt).elapsedMs(elapsedMs(start)).prevDelayMs(prevDelayMs).nowMs(ticker.nowMs());
      Failure failure = fields.build();
      if (method != null && failure.method.length == 0) fields.method(method);
      if (idempotencyKey != null && !failure.idempotencyKey) fields.idempotencyKey(idempotencyKey);
      Decision decision = policy.decide(fields.build());
      if (metrics != null) {
        metrics.attempt(decision.isRetry() ? "retry" : "dead_letter");
        if (guarded) observe();
        if (decision.isRetry()) metrics.retry(decision.reason(), decision.delayMs());
      }
      if (!decision.isRetry()) {
        Layers.recordGaveUp(decision.reason());
        throw new RetryException(decision.reason(), attempt, error, response, decision, 0);
      }
      if (listener != null) listener.onRetry(attempt, response != null ? null : error, decision);
      if (decision.delayMs() > 0) ticker.sleep(decision.delayMs());
      prevDelayMs = decision.delayMs();
    }
  }

  private long tookMs(long called) {
    return Math.max(0, (ticker.nanos() - called) / 1_000_000);
  }

  private long elapsedMs(long start) {
    return Math.max(0, (ticker.nanos() - start) / 1_000_000);
  }

  // Runs op on another thread and waits for it at most timeoutMs; at the
  // deadline its thread is interrupted and the attempt fails as a timeout.
  // The attempt number and the request served go with it.
  private static <T> T timed(Callable<T> op, int attempt, long timeoutMs) throws Exception {
    Layers.GaveUp request = Layers.request();
    Future<T> f = TIMED.submit(() -> Layers.run(attempt, request, op));
    try {
      return f.get(timeoutMs, TimeUnit.MILLISECONDS);
    } catch (TimeoutException e) {
      f.cancel(true);
      throw new TimeoutException("attempt " + attempt + " timed out after " + timeoutMs + " ms");
    } catch (InterruptedException e) {
      f.cancel(true);
      throw e;
    } catch (ExecutionException e) {
      Throwable c = e.getCause();
      if (c instanceof Exception) throw (Exception) c;
      if (c instanceof Error) throw (Error) c;
      throw e;
    }
  }

  // The breaker's state and the budget left, after each outcome.
  private void observe() {
    long now = ticker.nowMs();
    metrics.state(policy.circuitState(now));
    policy.budgetTokens(now).ifPresent(metrics::budget);
  }

  /**
   * The failure fields of an error: the classifier's, else those of an
   * HttpStatusException or a RetryException on it or its causes, else its
   * error kind by the shared table. A RetryException is a retry loop below
   * giving up: its last failure is classified and marked retried_downstream
   * so this layer gives up too (docs/layers.md), unless the breaker refused
   * it before any call.
   */
  Failure.Builder failureOf(Throwable t) {
    if (classifier != null) {
      Failure.Builder b = classifier.apply(t);
      if (b != null) return b;
    }
    Set<Throwable> seen = Collections.newSetFromMap(new IdentityHashMap<>());
    for (Throwable e = t; e != null && seen.size() < 8 && seen.add(e); e = e.getCause()) {
      if (e instanceof RetryException) {
        RetryException r = (RetryException) e;
        Object resp = r.response().orElse(null);
        Failure.Builder b = resp instanceof HttpResponse ? responseFields((HttpResponse<?>) resp)
            : r.getCause() != null ? failureOf(r.getCause()) : Failure.builder();
        return r.reason() == Decision.Reason.CIRCUIT_OPEN ? b : b.retriedDownstream(true);
      }
      if (e instanceof HttpStatusException) return ((HttpStatusException) e).describe();
    }
    Failure.Builder b = Failure.builder();
    String kind = ErrorKinds.of(t);
    if (kind != null) b.errorKind(kind);
    return b;
  }

  /** The fields of a failed response: status, Retry-After, the layer signals, its request's method and key. */
  static Failure.Builder responseFields(HttpResponse<?> r) {
    Failure.Builder b = HttpStatusException.of(r).describe();
    if (r.request() != null) {
      b.method(r.request().method());
      r.request().headers().firstValue("Idempotency-Key").ifPresent(b::idempotencyKey);
    }
    return b;
  }
}
