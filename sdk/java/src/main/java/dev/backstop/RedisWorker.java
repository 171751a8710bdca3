package dev.backstop;

import io.lettuce.core.RedisException;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.codec.ByteArrayCodec;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;

/**
 * A running worker of a Redis Streams queue ({@link RedisQueue#work}): it
 * reads new entries for its consumer (XREADGROUP, on a connection of its own),
 * promotes due delayed jobs every second, reclaims the entries of crashed
 * consumers (idle 60 s; past 5 deliveries dead-lettered {@code crash_loop}),
 * runs each job through the core ({@link Policy#outcome}: the breaker before
 * the job, the handler within its deadline while the entry is held, the
 * failure decided) and applies the outcome with the contract's scripts
 * (acked, retried, deferred or dead-lettered in one atomic step). The
 * counters are the scripts' (the stats hash the exporter reads).
 * {@link #close} stops it: the job in hand finishes and is applied first.
 */
public final class RedisWorker implements AutoCloseable {
  static final long MIN_IDLE_MS = 60_000;
  static final int MAX_DELIVERIES = 5;

  private final RedisQueue q;
  private final QueueHandler<RedisJob> handler;
  private final QueueRunner runner;
  private final String consumer;
  private final CountDownLatch stop = new CountDownLatch(1);
  private final CountDownLatch done = new CountDownLatch(1);
  private final ScheduledExecutorService holds = Executors.newSingleThreadScheduledExecutor(r -> {
    Thread t = new Thread(r, "backstop-redis-hold");
    t.setDaemon(true);
    return t;
  });
  private final WorkOptions o;
  private volatile long offsetMs; // the server's clock less this one: elapsed time is the server's

  RedisWorker(RedisQueue q, Policy policy, QueueHandler<RedisJob> handler, WorkOptions o) {
    this.q = q;
    this.handler = handler;
    this.o = o;
    this.runner = new QueueRunner(q.name, policy, o, Redis.MALFORMED);
    this.consumer = hostName() + "-" + ProcessHandle.current().pid() + "-"
        + Long.toString(ThreadLocalRandom.current().nextLong(1L << 30, 1L << 35), 36);
    Thread t = new Thread(this::loop, "backstop-redis-worker-" + q.name);
    t.setDaemon(true);
    t.start();
  }

  private static String hostName() {
    try {
      return java.net.InetAddress.getLocalHost().getHostName();
    } catch (java.io.IOException e) {
      return "host";
    }
  }

  private boolean stopping() {
    return stop.getCount() == 0;
  }

  private void loop() {
    long backoff = 100;
    try {
      while (!stopping()) {
        try (StatefulRedisConnection<byte[], byte[]> reads = q.client.connect(ByteArrayCodec.INSTANCE)) {
          q.ensureGroup();
          offsetMs = q.serverTimeMs() - System.currentTimeMillis();
          long promoted = 0;
          long reclaimed = 0;
          backoff = 100;
          while (!stopping()) {
            long now = System.currentTimeMillis();
            if (now - promoted >= 1000) {
              q.promote(1000);
              promoted = now;
            }
            if (now - reclaimed >= MIN_IDLE_MS / 6) {
              reclaimed = now;
              for (RedisJob j : q.reclaim(consumer, MIN_IDLE_MS, 100, MAX_DELIVERIES).jobs()) {
                if (stopping()) break;
                process(j);
              }
            }
            // The worker's breaker refused a job: read none until it may
            // half-open (the jobs in hand were gated, and deferred, one by one).
            long wait = runner.pausedUntil() - System.currentTimeMillis();
            if (wait > 0) {
              stop.await(Math.min(wait, 1000), TimeUnit.MILLISECONDS);
              continue;
            }
            for (RedisJob j : q.read(reads.sync(), consumer, o.prefetch, 1000)) {
              // A job read while stopping stays pending to this consumer: reclaimed later.
              if (stopping()) break;
              process(j);
            }
          }
        } catch (InterruptedException e) {
          return;
        } catch (RedisException e) {
          runner.report(e, null);
          try {
            stop.await((long) (backoff * (0.5 + Math.random() / 2)), TimeUnit.MILLISECONDS);
          } catch (InterruptedException ie) {
            return;
          }
          backoff = Math.min(2 * backoff, 5000);
        }
      }
    } finally {
      holds.shutdownNow();
      done.countDown();
    }
  }

  private void process(RedisJob job) {
    QueueRunner.Typed typed = runner.policyFor(job.jobType());
    boolean own = runner.owns(job.jobType());
    QueuePlan plan;
    if (job.malformed()) {
      plan = runner.plan(typed.policy(), 0, "", 0, 0, true, null, 0);
    } else {
      plan = runner.gate(typed.policy(), System.currentTimeMillis());
      if (plan == null) {
        // due_ms is promote's, on the server's clock.
        QueueRunner.measure(typed, job.attempt(), job.dueMs(), job.prevDelayMs(), job.lastReason(),
            System.currentTimeMillis() + offsetMs);
        // Held while it runs, so that no other worker reclaims it.
        long every = Math.max(10, MIN_IDLE_MS / 3);
        ScheduledFuture<?> hold = holds.scheduleAtFixedRate(() -> {
          try {
            q.hold(consumer, List.of(job.entryId()));
          } catch (RuntimeException e) {
            runner.report(e, job);
          }
        }, every, every, TimeUnit.MILLISECONDS);
        Throwable t;
        try {
          t = runner.run(handler, job, job.id());
        } finally {
          hold.cancel(false);
        }
        long now = System.currentTimeMillis() + offsetMs;
        plan = runner.plan(typed.policy(), job.attempt(), job.id(), job.firstEnqueuedMs(), job.prevDelayMs(), false, t, now);
      }
      runner.count(typed, plan, own);
    }
    RedisQueue.Applied a;
    try {
      a = q.apply(job, plan);
    } catch (RedisException e) {
      // Refused (a full memory, a key of the wrong type): the entry stays
      // pending and is reclaimed, its outcome decided again.
      runner.report(e, job);
      return;
    }
    if (a.applied()) runner.tell(job, plan); // not pending any more: another worker moved it
  }

  /** Whether the worker still runs. */
  public boolean isRunning() {
    return done.getCount() > 0;
  }

  /** Stops the worker and waits: the job in hand finishes and is applied first. */
  @Override
  public void close() throws InterruptedException {
    stop.countDown();
    done.await();
  }
}
