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
}
