package dev.backstop;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.AlreadyClosedException;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.Delivery;
import com.rabbitmq.client.ShutdownSignalException;
import java.io.IOException;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.logging.Level;

/**
 * A running worker of a RabbitMQ queue ({@link RabbitQueue#work}): it
 * consumes on a channel in confirm mode (made again with backoff when lost),
 * decides each delivery's outcome with the core ({@link Policy#outcome}: the
 * breaker before the job, the handler's failure, a crash loop), publishes the
 * next message, waits for the broker's confirm and only then acks the
 * delivery (a crash in between duplicates, never loses). Handlers run with a
 * deadline on threads of their own while the client's heartbeats keep the
 * connection alive. A mover on a connection of its own moves the delayed
 * messages of every queue of the virtual host down the delay levels.
 *
 * <p>{@link #close} stops it gracefully: no new delivery is taken, the jobs in
 * hand finish (at most their deadline) and are applied, the confirms still
 * pending are awaited up to 10 s; then the connection closes.
 */
public final class RabbitWorker implements AutoCloseable {
  private static final int KEPT_MAX = 10_000;
  private static final long BACKOFF_MIN_MS = 100;
  private static final long BACKOFF_MAX_MS = 5000;
  private static final ScheduledExecutorService LATER = Executors.newSingleThreadScheduledExecutor(r -> {
    Thread t = new Thread(r, "backstop-rabbitmq-later");
    t.setDaemon(true);
    return t;
  });

  private final RabbitQueue q;
  private final Policy policy;
  private final QueueHandler<RabbitJob> handler;
  private final WorkOptions o;
  private final QueueRunner runner;
  private final QueueMetrics qm;
  private final Thread thread;
  private final CountDownLatch stop = new CountDownLatch(1);
  private final CountDownLatch done = new CountDownLatch(1);
  private final Map<String, Kept> kept = new LinkedHashMap<>();
  private volatile Throwable failure;
  private final RabbitMover mover;

  /** An outcome known and not applied (its publish refused or the channel lost), by job id and attempt. */
  private record Kept(QueuePlan plan, boolean published, int refusals) {}

  RabbitWorker(RabbitQueue q, Policy policy, QueueHandler<RabbitJob> handler, WorkOptions o) {
    this.q = q;
    this.policy = policy;
    this.handler = handler;
    this.o = o;
    this.runner = new QueueRunner(q.name, policy, o, Rabbit.MALFORMED);
    this.qm = o.registry == null ? null : QueueMetrics.of(o.registry, q.name);
    this.mover = o.mover ? new RabbitMover(q.broker) : null;
    thread = new Thread(this::loop, "backstop-rabbitmq-worker-" + q.name);
    thread.setDaemon(true);
    thread.start();
  }

  private boolean stopping() {
    return stop.getCount() == 0 || q.broker.isClosed();
  }

  private void loop() {
    long backoff = BACKOFF_MIN_MS;
    try {
      while (!stopping()) {
        try {
          if (session()) backoff = BACKOFF_MIN_MS;
        } catch (IOException | ShutdownSignalException e) {
          if (refused(e)) {
            // Q exists with other arguments, or no permission: no retry mends that.
            failure = new IOException("rabbitmq queue " + q.name + ": the broker refused the topology: "
                + closeText(e), e);
            runner.report(failure, null);
            return;
          }
          runner.report(new IOException("rabbitmq queue " + q.name + ": connection lost, connecting again: "
              + e.getMessage(), e), null);
        } catch (InterruptedException e) {
          return;
        } catch (RuntimeException e) {
          runner.report(e, null);
        }
        if (stopping()) break;
        try {
          stop.await((long) (backoff * (0.5 + Math.random() / 2)), TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
          return;
        }
        backoff = Math.min(2 * backoff, BACKOFF_MAX_MS);
      }
    } finally {
      if (mover != null) mover.stop(); // what it held goes back to the levels
      done.countDown();
    }
  }

  // The broker's reply text of a closed channel (a declare it refused).
  private static String closeText(Throwable e) {
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (t instanceof ShutdownSignalException && ((ShutdownSignalException) t).getReason() instanceof AMQP.Channel.Close) {
        return ((AMQP.Channel.Close) ((ShutdownSignalException) t).getReason()).getReplyText();
      }
    }
    return String.valueOf(e);
  }

  // A channel closed by the broker for a declaration it refuses: 403, 404, 406.
  private static boolean refused(Throwable e) {
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (t instanceof ShutdownSignalException) {
        Object r = ((ShutdownSignalException) t).getReason();
        if (r instanceof AMQP.Channel.Close) {
          int code = ((AMQP.Channel.Close) r).getReplyCode();
          return code == 403 || code == 404 || code == 406;
        }
      }
    }
    return false;
  }

  // Consumes until the channel is lost or the worker stops; true when it consumed.
  private boolean session() throws IOException, InterruptedException {
    Connection conn = q.broker.newConnection("backstop-worker-" + q.name);
    ExecutorService pool = Executors.newFixedThreadPool(o.concurrency(), r -> {
      Thread t = new Thread(r, "backstop-rabbitmq-job-" + q.name);
      t.setDaemon(true);
      return t;
    });
    AtomicInteger inflight = new AtomicInteger();
    AtomicInteger confirming = new AtomicInteger();
    CountDownLatch lost = new CountDownLatch(1);
    try {
      Channel ch = conn.createChannel();
      RabbitConfirms c = new RabbitConfirms(ch);
      ch.addShutdownListener(s -> lost.countDown());
      ch.basicQos(o.prefetch);
      Rabbit.declareShared(ch);
      q.declareOn(ch);
      String tag = ch.basicConsume(q.name, false, (t, d) -> {
        if (stopping()) return; // left unacked: returned with the channel
        inflight.incrementAndGet();
        pool.execute(() -> {
          try {
            handle(ch, c, d, confirming);
          } catch (RuntimeException e) {
            runner.report(e, null);
          } finally {
            inflight.decrementAndGet();
          }
        });
      }, t -> {
        // Cancelled by the broker (the queue was deleted): declared again on a new channel.
        q.broker.forget(q.name);
        lost.countDown();
      });
      while (!stopping() && lost.getCount() > 0) {
        stop.await(100, TimeUnit.MILLISECONDS);
      }
      if (lost.getCount() > 0) {
        try {
          ch.basicCancel(tag);
        } catch (IOException | AlreadyClosedException e) {
          // lost meanwhile
        }
      }
      // The jobs in hand finish; once only confirms are left they are awaited
      // APPLY_GRACE_MS at most, then the channel closes (what is unconfirmed
      // comes back: a duplicate, never a loss).
      long idle = 0;
      while (inflight.get() > 0) {
        Thread.sleep(20);
        idle = inflight.get() > 0 && confirming.get() >= inflight.get() ? idle + 20 : 0;
        if (idle >= Rabbit.APPLY_GRACE_MS) {
          runner.report(new IOException("rabbitmq queue " + q.name + ": " + confirming.get()
              + " confirms still pending after " + Rabbit.APPLY_GRACE_MS + " ms: closing the channel"), null);
          break;
        }
      }
      return true;
    } finally {
      pool.shutdown();
      if (conn.isOpen()) {
        try {
          conn.close(1000);
        } catch (IOException | AlreadyClosedException e) {
          QueueRunner.LOG.log(Level.FINE, "close", e);
        }
      }
      pool.awaitTermination(30, TimeUnit.SECONDS);
    }
  }

  private static String keyOf(RabbitJob job) {
    return job.malformed() || job.id().isEmpty() ? null : job.id() + "\u0000" + job.attempt();
  }

  private void keep(RabbitJob job, QueuePlan plan, boolean published, int refusals) {
    String k = keyOf(job);
    if (k == null || plan == null) return;
    synchronized (kept) {
      kept.remove(k);
      kept.put(k, new Kept(plan, published, refusals));
      while (kept.size() > KEPT_MAX) kept.remove(kept.keySet().iterator().next());
    }
  }

  private Kept take(RabbitJob job) {
    String k = keyOf(job);
    if (k == null) return null;
    synchronized (kept) {
      return kept.remove(k);
    }
  }

  // One delivery: its plan decided (malformed, kept, adopted, crash loop,
  // early, the breaker, or run), applied, counted and told.
  private void handle(Channel ch, RabbitConfirms c, Delivery d, AtomicInteger confirming) {
    long now = System.currentTimeMillis();
    AMQP.BasicProperties props = d.getProperties();
    long tag = d.getEnvelope().getDeliveryTag();
    RabbitJob job = Rabbit.jobFrom(q.name, props, d.getBody(), now, d.getEnvelope().isRedeliver());
    QueueRunner.Typed typed = runner.policyFor(job.jobType());
    boolean own = runner.owns(job.jobType());
    QueuePlan plan = null;
    Rabbit.Publish pub = null;
    boolean published = false;
    int refusals = 0;
    boolean told = true; // an adoption or an early delay is no outcome of the job's (not told)
    Kept k;
    if (job.malformed()) {
      plan = runner.plan(typed.policy(), 0, "", 0, 0, true, null, now);
    } else if ((k = take(job)) != null) {
      plan = k.plan();
      published = k.published();
      refusals = k.refusals();
    } else if (job.id().isEmpty()) {
      pub = Rabbit.adopted(q.name, job);
      told = false;
    } else if (job.deliveryCount() > 0 && runner.ask(typed.policy(), Outcome.Event.DELIVERED, Failure.builder().build(),
        job.deliveryCount(), q.maxDeliveries).action() == Outcome.Action.DEAD_LETTER) {
      plan = QueuePlan.deadLetter(Decision.Reason.CRASH_LOOP, Rabbit.crashLoopError(job, q.maxDeliveries));
    } else if (job.dueMs() > now + Rabbit.MAX_DUE_AHEAD_MS) {
      // It would cycle through the delay levels for ever.
      plan = QueuePlan.deadLetter(Decision.Reason.MALFORMED, Rabbit.DUE_TOO_FAR);
    } else if (job.dueMs() > now) {
      pub = Rabbit.early(q.name, job, now);
      told = false;
    } else {
      if (!waitPause(job.jobType(), own)) {
        nack(ch, tag);
        return;
      }
      plan = runner.gate(typed.policy(), System.currentTimeMillis());
      if (plan == null) {
        // The mover's and the worker's clocks are the workers': due was set on one.
        QueueRunner.measure(typed, job.attempt(), job.dueMs(), job.prevDelayMs(), job.lastReason(),
            System.currentTimeMillis());
        Throwable t = runner.run(typed.policy(), handler, job, job.id());
        plan = runner.plan(typed.policy(), job.attempt(), job.id(), job.firstEnqueuedMs(), job.prevDelayMs(), false, t,
            System.currentTimeMillis());
      }
      runner.count(typed, plan, own);
    }
    if (pub == null && plan != null) pub = Rabbit.move(q.name, job, plan, System.currentTimeMillis());
    try {
      if (pub != null && !published) {
        confirming.incrementAndGet();
        try {
          c.publishAndWait(pub.exchange(), pub.routingKey(),
              RabbitBroker.props(props, pub.headers(), job.malformed() ? "" : pub.messageId(), null), d.getBody());
        } finally {
          confirming.decrementAndGet();
        }
        published = true;
      }
      ch.basicAck(tag, false);
    } catch (RabbitConfirms.Rejected e) {
      // Refused: kept, and the delivery handed back after a pause (each
      // return counts in x-delivery-count: not at once).
      int n = refusals + 1;
      keep(job, plan, published, n);
      LATER.schedule(() -> nack(ch, tag), Rabbit.refusedPauseMs(n), TimeUnit.MILLISECONDS);
      runner.report(new IOException("rabbitmq queue " + q.name + ": outcome of job " + job.id()
          + " refused by the broker, kept for its redelivery: " + e.getMessage(), e), job);
      return;
    } catch (IOException | ShutdownSignalException e) {
      keep(job, plan, published, 0);
      runner.report(new IOException("rabbitmq queue " + q.name + ": outcome of job " + job.id()
          + " not applied (kept for its redelivery): " + e.getMessage(), e), job);
      return;
    } catch (InterruptedException e) {
      keep(job, plan, published, 0);
      Thread.currentThread().interrupt();
      return;
    }
    if (plan == null) return;
    if (qm != null) qm.observe(job.jobType(), job.malformed() ? 0 : job.attempt(), plan);
    if (told) runner.tell(job, plan);
  }

  private static void nack(Channel ch, long tag) {
    try {
      ch.basicNack(tag, false, true);
    } catch (IOException | AlreadyClosedException e) {
      // the channel is gone: the broker returned it
    }
  }

  // The worker's breaker refused a job: start none (but those of a type with
  // its own policy) until it may half-open. False when stopped meanwhile.
  private boolean waitPause(String type, boolean own) {
    if (own) return true;
    try {
      long wait;
      while ((wait = runner.pausedUntil() - System.currentTimeMillis()) > 0) {
        if (stop.await(wait, TimeUnit.MILLISECONDS)) return false;
      }
      return true;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return false;
    }
  }

  /** Why the worker stopped by itself (a topology the broker refuses), if it did. */
  public Optional<Throwable> failure() {
    return Optional.ofNullable(failure);
  }

  /** Whether the worker still runs. */
  public boolean isRunning() {
    return done.getCount() > 0;
  }

  /** Waits until the worker has stopped (closed, or failed: see {@link #failure}). */
  public void await() throws InterruptedException {
    done.await();
  }

  /** Stops the worker gracefully and waits: the jobs in hand finish and are applied first. */
  @Override
  public void close() throws InterruptedException {
    stop.countDown();
    done.await();
  }
}
