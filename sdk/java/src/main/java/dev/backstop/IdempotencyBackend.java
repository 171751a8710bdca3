package dev.backstop;

import java.time.Duration;

/**
 * What {@link IdempotencyFilter} needs of a store of idempotency records
 * (Go's {@code idempotency.Backend}): {@link IdempotencyStore} on Redis and
 * {@link PgIdempotencyStore} on PostgreSQL answer alike (both replay
 * testdata/idempotency).
 */
public interface IdempotencyBackend {
  /**
   * Claims key (within scope) for a request whose fingerprint is request.
   *
   * @throws IllegalArgumentException for a key {@link IdempotencyStore#checkKey} refuses
   * @throws RuntimeException when the store fails (counted as a begin store error)
   */
  IdempotencyStore.Claim begin(String scope, String key, String request);

  /**
   * Stores resp as the key's response; only the owner (token from begin) may.
   *
   * @throws IdempotencyStore.LeaseLostException when the caller no longer owns the key
   */
  void complete(String scope, String key, String token, IdempotencyStore.Response resp);

  /**
   * Releases the key so that a retry may run; only the owner may.
   *
   * @throws IdempotencyStore.LeaseLostException when the caller no longer owns the key
   */
  void fail(String scope, String key, String token);

  /** How long a started request owns its key: the filter retries a failed complete or fail within it. */
  Duration lease();

  /**
   * Counts one request in {@code backstop_idempotency_requests_total} by
   * outcome (first_run, replayed, in_progress, conflict, too_large): what
   * the filter decided; nothing when the store has no metrics.
   */
  void countRequest(String outcome);

  /** A call that may throw, as a job's side effect may: what {@link #once} runs. */
  @FunctionalInterface
  interface Effect {
    byte[] run() throws Exception;
  }

  /**
   * Runs fn at most once for key (within scope): a later call with the same
   * key and request gets the first call's result without running fn. It is
   * the worker's side of the store (Go's {@code idempotency.Once}, Node's
   * {@code once}): with the job id as the key, a job redelivered after a
   * crash returns its recorded result instead of running its side effect
   * again. (On PostgreSQL, {@link PgIdempotencyStore#onceTx} writes the
   * record in the job's own transaction instead.)
   *
   * <pre>{@code
   * byte[] receipt = store.once("charges", job.id(), job.id(), () -> charge(job));
   * }</pre>
   *
   * <p>fn's exception releases the key (a retry runs fn again) and is
   * rethrown; the release is retried in the background while the lease lasts
   * if the store fails. fn's result (null is empty) is stored before once
   * returns, retried while the lease lasts; when it could not be stored by
   * then, once throws the store's last error (the key may run again).
   *
   * @throws IdempotencyStore.ConflictException when the key was used for a different request
   * @throws IdempotencyStore.InProgressException while another call holds the key
   * @throws IdempotencyStore.TooLargeException when the first result was too large to store
   * @throws IdempotencyStore.LeaseLostException when fn outlived its lease and another call took the key over (its result is not stored)
   */
  default byte[] once(String scope, String key, String request, Effect fn) throws Exception {
    java.util.Objects.requireNonNull(fn, "fn");
    long until = System.nanoTime() + lease().toNanos(); // the lease runs from about here on the server's clock
    IdempotencyStore.Claim c = begin(scope, key, request);
    byte[] replayed = IdempotencyRules.onceAnswer(this, c, key);
    if (replayed != null) return replayed;
    byte[] out;
    try {
      out = fn.run();
    } catch (Exception | Error e) {
      RuntimeException released = IdempotencySettle.SHARED.later("fail", key, until, () -> fail(scope, key, c.token()));
      if (released != null) e.addSuppressed(released);
      throw e;
    }
    byte[] body = out == null ? new byte[0] : out;
    IdempotencySettle.SHARED.now("complete", key, until,
        () -> complete(scope, key, c.token(), new IdempotencyStore.Response(200, java.util.Map.of(), body, false, false)));
    return body;
  }
}
