package dev.backstop;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.GetResponse;
import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * One work queue with its DLQ and delays ({@link RabbitBroker#queue}): the
 * topology of queue/rabbitmq/README.md, declared idempotently by
 * {@link #declare}, {@link #enqueue} and {@link #work}.
 */
public final class RabbitQueue {
  final RabbitBroker broker;
  final String name;
  final int maxDeliveries;
  final boolean existing; // declared by someone else: never declared again (RabbitBroker#existingQueue)

  RabbitQueue(RabbitBroker broker, String name, int maxDeliveries, boolean existing) {
    this.broker = broker;
    this.name = name;
    this.maxDeliveries = maxDeliveries;
    this.existing = existing;
  }

  /** Declares this queue's part of the topology on ch (after the shared levels). */
  void declareOn(Channel ch) throws IOException {
    if (existing) {
      Rabbit.adoptQueue(ch, name);
    } else {
      Rabbit.declareQueue(ch, name, maxDeliveries);
    }
  }

  /** The work queue's name. */
  public String name() {
    return name;
  }

  /** Declares the topology (idempotent): the shared delay levels, the queue, its DLQ and delay exchanges. */
  public void declare() throws IOException, InterruptedException {
    broker.op(this, c -> null);
  }

  /** enqueue(jobId, payload, jobType, null, Duration.ZERO). */
  public void enqueue(String jobId, byte[] payload, String jobType) throws IOException, InterruptedException {
    enqueue(jobId, payload, jobType, null, Duration.ZERO);
  }

  /**
   * Publishes job jobId (confirmed) as its attempt 1, now or after delay (at
   * most 30 days) through the delay levels; jobType may be null.
   */
  public void enqueue(String jobId, byte[] payload, String jobType, String contentType, Duration delay)
      throws IOException, InterruptedException {
    if (jobId == null || jobId.isEmpty()) throw new IllegalArgumentException("enqueue: jobId must be a non-empty string");
    Objects.requireNonNull(payload, "payload");
    if (jobType != null && !QueueMetrics.JOB_TYPE.matcher(jobType).matches()) {
      throw new IllegalArgumentException("enqueue: jobType must be 1..64 of [A-Za-z0-9_./-] (got " + jobType + ")");
    }
    if (delay == null || delay.isNegative()) throw new IllegalArgumentException("enqueue: delay must be >= 0");
    if (delay.toMillis() > Rabbit.MAX_DUE_AHEAD_MS) {
      throw new IllegalArgumentException("enqueue: delay must be at most 30 days (got " + delay + ")");
    }
    long ms = delay.toMillis() + (delay.minusMillis(delay.toMillis()).isZero() ? 0 : 1); // rounded up: never early
    broker.op(this, c -> {
      Rabbit.Publish p = Rabbit.enqueued(name, jobId, jobType, ms, System.currentTimeMillis());
      c.publishAndWait(p.exchange(), p.routingKey(), RabbitBroker.props(null, p.headers(), p.messageId(), contentType),
          payload);
      return null;
    });
  }

  /**
   * Starts a worker: it runs handler on each job of this queue under policy
   * (the core decides each outcome), until {@link RabbitWorker#close}.
   */
  public RabbitWorker work(Policy policy, QueueHandler<RabbitJob> handler, WorkOptions options) {
    Objects.requireNonNull(policy, "policy");
    Objects.requireNonNull(handler, "handler");
    Objects.requireNonNull(options, "options");
    return new RabbitWorker(this, policy, handler, options);
  }

  /**
   * Moves up to limit dead letters (of reason, or any when null) back to
   * their queue, afresh (attempt 1) or keeping their attempt; looks at most
   * 10 × limit. Returns how many moved.
   */
  public int replay(int limit, String reason, boolean keepAttempts) throws IOException, InterruptedException {
    if (limit < 1) throw new IllegalArgumentException("replay: limit must be >= 1 (got " + limit + ")");
    long scan = 10L * limit;
    String want = reason == null ? "" : reason;
    return broker.op(this, c -> {
      List<GetResponse> held = new ArrayList<>();
      int moved = 0;
      for (long i = 0; i < scan && moved < limit; i++) {
        GetResponse g = c.ch.basicGet(name + ".dlq", false);
        if (g == null) break;
        RabbitDeadLetter d = Rabbit.deadLetterFrom(g.getProps(), g.getBody());
        if (d.id().isEmpty() || (!want.isEmpty() && !d.reason().equals(want))) {
          held.add(g);
          continue;
        }
        Rabbit.Publish p = Rabbit.replayed(name, d, keepAttempts, System.currentTimeMillis());
        c.publishAndWait(p.exchange(), p.routingKey(), RabbitBroker.props(g.getProps(), p.headers(), "", null),
            g.getBody());
        c.ch.basicAck(g.getEnvelope().getDeliveryTag(), false);
        moved++;
      }
      giveBack(c, held);
      return moved;
    });
  }

  /** A peek at up to n dead letters: every one goes back to the DLQ, in order. */
  public List<RabbitDeadLetter> inspect(int n) throws IOException, InterruptedException {
    if (n < 1 || n > 10000) throw new IllegalArgumentException("inspect: n must be in 1..10000 (got " + n + ")");
    return broker.op(this, c -> {
      List<GetResponse> held = new ArrayList<>();
      List<RabbitDeadLetter> out = new ArrayList<>();
      for (int i = 0; i < n; i++) {
        GetResponse g = c.ch.basicGet(name + ".dlq", false);
        if (g == null) break;
        held.add(g);
        out.add(Rabbit.deadLetterFrom(g.getProps(), g.getBody()));
      }
      giveBack(c, held);
      return out;
    });
  }

  // Dead letters looked at go back so that looking never uses them up: nack
  // (requeue), or fresh copies once one was looked at 10 times or more.
  private void giveBack(RabbitConfirms c, List<GetResponse> held) throws IOException, InterruptedException {
    List<Map<String, Object>> hs = new ArrayList<>();
    for (GetResponse g : held) hs.add(g.getProps().getHeaders());
    if (!Rabbit.refresh(hs)) {
      for (GetResponse g : held) c.ch.basicNack(g.getEnvelope().getDeliveryTag(), false, true);
      return;
    }
    for (GetResponse g : held) {
      Map<String, Object> h = g.getProps().getHeaders() == null ? Map.of() : g.getProps().getHeaders();
      c.publishAndWait("", name + ".dlq", RabbitBroker.props(g.getProps(), Rabbit.without(h, Rabbit.X_COUNT), "", null),
          g.getBody());
      c.ch.basicAck(g.getEnvelope().getDeliveryTag(), false);
    }
  }

  /** A queue's depths, read live. */
  public record Stats(long ready, long consumers, long dlq, long delayLevels) {}

  /** The work queue's ready jobs and consumers, the DLQ's depth, the messages ready in the shared delay levels. */
  public Stats stats() throws IOException, InterruptedException {
    return broker.op(this, c -> {
      Channel ch = c.ch;
      AMQP.Queue.DeclareOk q = ch.queueDeclarePassive(name);
      AMQP.Queue.DeclareOk d = ch.queueDeclarePassive(name + ".dlq");
      long levels = 0;
      for (int n = 0; n < Rabbit.HOLD_LEVELS; n++) levels += ch.queueDeclarePassive(Rabbit.hold(n)).getMessageCount();
      for (int n = 0; n < Rabbit.LEVELS; n++) levels += ch.queueDeclarePassive(Rabbit.level(n)).getMessageCount();
      return new Stats(q.getMessageCount(), q.getConsumerCount(), d.getMessageCount(), levels);
    });
  }

  @Override
  public String toString() {
    return "RabbitQueue[" + name + ", maxDeliveries=" + maxDeliveries + "]";
  }
}
