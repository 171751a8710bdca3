package dev.backstop;

import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.RedisException;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.codec.ByteArrayCodec;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
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
 * consumers ({@link WorkOptions#withReclaim}: idle 60 s; past 5 deliveries
 * dead-lettered {@code crash_loop}),
 * runs each job through the core ({@link Policy#outcome}: the breaker before
 * the job, the handler within its deadline while the entry is held, the
 * failure decided) and applies the outcome with the contract's scripts
 * (acked, retried, deferred or dead-lettered in one atomic step). The
 * counters are the scripts' (the stats hash the exporter reads). An outcome
 * Redis refuses for a while is kept and sent again, the entry held, so that
 * the job does not run twice (see {@code settle}).
 * {@link #close} stops it: the job in hand finishes and is applied first.
 */
public final class RedisWorker implements AutoCloseable {
  // A refused outcome is sent again after 20 ms, doubling to at most 2 s and
  // a quarter of the min idle time (as the Go and Python workers do).
  static final long APPLY_BASE_MS = 20;
  // The error codes of a write Redis cannot apply now but may soon.
  private static final Set<String> REFUSED_CODES =
      Set.of("OOM", "READONLY", "LOADING", "BUSY", "MASTERDOWN", "MISCONF", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS");
  private static final System.Logger LOG = System.getLogger("dev.backstop");

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
  private final long minIdleMs;
  private final long applyCapMs;
  private volatile long offsetMs; // the server's clock less this one: elapsed time is the server's

  RedisWorker(RedisQueue q, Policy policy, QueueHandler<RedisJob> handler, WorkOptions o) {
    this.q = q;
    this.handler = handler;
    this.o = o;
    this.minIdleMs = o.minIdle.toMillis();
    this.applyCapMs = Math.max(1, Math.min(2000, minIdleMs / 4));
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
            if (now - reclaimed >= o.reclaimEvery.toMillis()) {
              reclaimed = now;
              List<RedisJob> claimed = q.reclaim(consumer, minIdleMs, 100, o.maxDeliveries).jobs();
              for (int i = 0; i < claimed.size(); i++) {
                if (stopping()) break;
                process(claimed.get(i), claimed.subList(i + 1, claimed.size()));
              }
            }
            // The worker's breaker refused a job: read none until it may
            // half-open (the jobs in hand were gated, and deferred, one by one).
            long wait = runner.pausedUntil() - System.currentTimeMillis();
            if (wait > 0) {
              stop.await(Math.min(wait, 1000), TimeUnit.MILLISECONDS);
              continue;
            }
            List<RedisJob> batch = q.read(reads.sync(), consumer, o.prefetch, 1000);
            for (int i = 0; i < batch.size(); i++) {
              // A job read while stopping stays pending to this consumer: reclaimed later.
              if (stopping()) break;
              process(batch.get(i), batch.subList(i + 1, batch.size()));
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

  private void process(RedisJob job, List<RedisJob> waiting) {
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
        long every = Math.max(10, minIdleMs / 3);
        ScheduledFuture<?> hold = holds.scheduleAtFixedRate(() -> {
          try {
            q.hold(consumer, List.of(job.entryId()));
          } catch (RuntimeException e) {
            runner.report(e, job);
          }
        }, every, every, TimeUnit.MILLISECONDS);
        Throwable t;
        try {
          t = runner.run(typed.policy(), handler, job, job.id());
        } finally {
          hold.cancel(false);
        }
        long now = System.currentTimeMillis() + offsetMs;
        plan = runner.plan(typed.policy(), job.attempt(), job.id(), job.firstEnqueuedMs(), job.prevDelayMs(), false, t, now);
      }
      runner.count(typed, plan, own);
    }
    settle(job, plan, waiting);
  }

  /**
   * Applies a decided outcome. While Redis refuses it for a while (out of
   * memory with noeviction, a read-only replica in a failover, loading, a
   * lost connection) the outcome is kept, decided once, and sent again with
   * jittered backoff, the entry and the batch's waiting entries held in
   * between, so that reclaim does not run the handler a second time; the
   * worker reads nothing new meanwhile. Stopped meanwhile, it makes one last
   * attempt: the entry then stays pending, for reclaim. A request Redis
   * rejects as such (a key of the wrong type) is reported and not sent again.
   */
  private void settle(RedisJob job, QueuePlan plan, List<RedisJob> waiting) {
    long delay = APPLY_BASE_MS;
    int refusals = 0;
    boolean holdFailed = false;
    List<String> ids = null;
    while (true) {
      boolean stopped = stopping();
      RedisQueue.Applied a;
      try {
        a = q.apply(job, plan);
      } catch (RedisException e) {
        String what = "backstop queue " + q.name + ": outcome " + plan.action() + " of entry " + job.entryId()
            + " (job " + job.id() + ")";
        if (!writeRefused(e)) {
          runner.report(new RedisException(what + " not applied: " + e.getMessage(), e), job);
          return;
        }
        refusals++;
        if (stopped) {
          runner.report(new RedisException(what + " not applied: the worker stopped while Redis refused it (" + refusals
              + " time(s)); the entry stays pending: " + e.getMessage(), e), job);
          return;
        }
        if (refusals == 1) runner.report(new RedisException(what + " refused, retrying: " + e.getMessage(), e), job);
        if (ids == null) {
          ids = new ArrayList<>();
          ids.add(job.entryId());
          for (RedisJob w : waiting) {
            if (ids.size() == 1000) break;
            ids.add(w.entryId());
          }
        }
        try {
          q.hold(consumer, ids);
        } catch (RuntimeException he) {
          if (!holdFailed) runner.report(he, job);
          holdFailed = true;
        }
        try {
          stop.await(delay / 2 + (long) (Math.random() * (delay / 2 + 1)), TimeUnit.MILLISECONDS);
        } catch (InterruptedException ie) {
          Thread.currentThread().interrupt();
          return;
        }
        delay = Math.min(2 * delay, applyCapMs);
        continue;
      }
      if (refusals > 0) {
        LOG.log(System.Logger.Level.INFO, "backstop queue {0}: outcome {1} of entry {2} (job {3}) applied after {4} refusal(s){5}",
            q.name, plan.action(), job.entryId(), job.id(), refusals, a.applied() ? "" : " (no longer pending)");
      }
      if (a.applied()) runner.tell(job, plan); // not pending any more: another worker moved it
      return;
    }
  }

  /**
   * Whether Redis could not apply a write now but may soon, so that the same
   * request is worth sending again: the replies OOM, READONLY, LOADING, BUSY,
   * MASTERDOWN, MISCONF, TRYAGAIN, CLUSTERDOWN, NOREPLICAS and "max number of
   * clients reached"; no reply at all (a connection lost, a timeout).
   * Anything else (bad arguments, WRONGTYPE, NOPERM) is not sent again.
   */
  static boolean writeRefused(Throwable e) {
    if (e instanceof RedisCommandExecutionException) {
      String m = e.getMessage() == null ? "" : e.getMessage();
      // A script's error keeps the code of the command it ran first.
      int sp = m.indexOf(' ');
      return REFUSED_CODES.contains(sp < 0 ? m : m.substring(0, sp)) || m.contains("max number of clients reached");
    }
    return e instanceof RedisException; // a lost connection, a timeout: no reply at all
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
