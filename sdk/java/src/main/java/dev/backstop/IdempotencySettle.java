package dev.backstop;

import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;

/**
 * An owner's complete or fail after its handler (or job) ran, as every
 * language settles it (docs/idempotency.md): retried while the key's lease
 * lasts, 10ms doubling to 1s, jittered, so that a store briefly down does
 * not leave the key to run again. A lost lease is final: another call owns
 * the key. {@link IdempotencyFilter} and {@link IdempotencyStore#once} share it.
 */
final class IdempotencySettle implements AutoCloseable {
  private static final System.Logger LOG = System.getLogger("dev.backstop.idempotency");

  /** once's: its background releases outlive any one call. */
  static final IdempotencySettle SHARED = new IdempotencySettle();

  private final ScheduledExecutorService retries = Executors.newSingleThreadScheduledExecutor(r -> {
    Thread t = new Thread(r, "backstop-idempotency-settle");
    t.setDaemon(true);
    return t;
  });

  /**
   * The first attempt now (the caller waits for it), a failure other than a
   * lost lease retried in the background until the lease (until,
   * System.nanoTime) ends. Returns the first attempt's error, null when it
   * succeeded or the lease was lost.
   */
  RuntimeException later(String op, String key, long until, Runnable call) {
    try {
      call.run();
      return null;
    } catch (IdempotencyStore.LeaseLostException e) {
      LOG.log(System.Logger.Level.WARNING, "idempotency: store call refused: the lease was lost: " + op + " " + key + ": " + e.getMessage());
      return null;
    } catch (RuntimeException e) {
      LOG.log(System.Logger.Level.WARNING, "idempotency: store call failed after the handler ran; retrying while the lease lasts: "
          + op + " " + key + ": " + e);
      retry(op, key, until, call, 10, 1);
      return e;
    }
  }

  /**
   * Retries call in this thread until it succeeds or the lease ends; throws
   * its last error then (the key may run again), or the lost lease.
   */
  void now(String op, String key, long until, Runnable call) {
    long delayMs = 10;
    for (int attempts = 1;; attempts++) {
      try {
        call.run();
        if (attempts > 1) LOG.log(System.Logger.Level.INFO, "idempotency: store call succeeded after retries: " + op + " " + key + ", attempts " + attempts);
        return;
      } catch (IdempotencyStore.LeaseLostException e) {
        throw e;
      } catch (RuntimeException e) {
        long wait = jittered(delayMs);
        if (pastLease(op, key, until, wait, attempts)) throw e;
        try {
          Thread.sleep(wait);
        } catch (InterruptedException ie) {
          Thread.currentThread().interrupt();
          e.addSuppressed(ie);
          throw e;
        }
        delayMs = Math.min(2 * delayMs, 1000);
      }
    }
  }

  private void retry(String op, String key, long until, Runnable call, long delayMs, int attempts) {
    long wait = jittered(delayMs);
    if (pastLease(op, key, until, wait, attempts)) return;
    retries.schedule(() -> {
      try {
        call.run();
        LOG.log(System.Logger.Level.INFO, "idempotency: store call succeeded after retries: " + op + " " + key + ", attempts " + (attempts + 1));
      } catch (IdempotencyStore.LeaseLostException e) {
        LOG.log(System.Logger.Level.WARNING, "idempotency: store call refused: the lease was lost: " + op + " " + key);
      } catch (RuntimeException e) {
        retry(op, key, until, call, Math.min(2 * delayMs, 1000), attempts + 1);
      }
    }, wait, TimeUnit.MILLISECONDS);
  }

  /** Whether a wait of wait ms would end past the lease (until); the caller then gives up, and this logs it. */
  private static boolean pastLease(String op, String key, long until, long wait, int attempts) {
    if (System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(wait) < until) return false;
    LOG.log(System.Logger.Level.ERROR, "idempotency: store call still failing when the lease ended: the key may run again: "
        + op + " " + key + " after " + attempts + " attempts");
    return true;
  }

  private static long jittered(long delayMs) {
    return delayMs / 2 + ThreadLocalRandom.current().nextLong(Math.max(1, delayMs / 2));
  }

  /** Stops the retry thread once the retries pending have ended. */
  @Override
  public void close() {
    retries.shutdown();
  }
}
