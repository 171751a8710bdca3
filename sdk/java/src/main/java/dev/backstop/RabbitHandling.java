package dev.backstop;

import com.rabbitmq.client.AMQP;
import java.io.IOException;
import java.util.Objects;

/**
 * Backstop's outcome for deliveries that another consumer takes from a
 * queue (a Spring listener container's): the same steps as
 * {@link RabbitWorker}'s, the core deciding each outcome
 * ({@link Policy#outcome}), for a consumer that acks the delivery itself
 * once {@link #handle} returned. The next message (a retry through the
 * delay levels, a deferral, a dead letter with its reason) is published on
 * the broker's shared connection and confirmed before handle returns; when it
 * throws, the outcome was not applied and the delivery must not be acked
 * (handed back, it runs again: a duplicate, never a loss). It runs the mover
 * of the delay levels until {@link #close} (unless options have none).
 */
public final class RabbitHandling implements AutoCloseable {
  private final RabbitQueue q;
  private final QueueRunner runner;
  private final QueueMetrics qm;
  private final RabbitMover mover;
  private volatile boolean throughQueue;

  /** A step of one delivery: its job, plan and the message to publish before the ack; told: an outcome of the job's. */
  record Step(RabbitJob job, QueuePlan plan, Rabbit.Publish pub, boolean told) {}

  /** Whether a job of type may start now (false: hand the delivery back). */
  interface Pause {
    boolean await(String type, boolean own);
  }

  /** Handles deliveries of queue under policy (per-type policies, classifier, metrics and hooks from options). */
  public RabbitHandling(RabbitQueue queue, Policy policy, WorkOptions options) {
    this.q = Objects.requireNonNull(queue, "queue");
    Objects.requireNonNull(policy, "policy");
    Objects.requireNonNull(options, "options");
    this.runner = new QueueRunner(q.name, policy, options, Rabbit.MALFORMED);
    this.qm = options.registry == null ? null : QueueMetrics.of(options.registry, q.name);
    this.mover = options.mover ? new RabbitMover(q.broker) : null;
  }

  /**
   * Dead letters go through the queue's own dead-letter exchange (a queue
   * Spring declared with one, which routes to Q.dlq): published back to the
   * queue with backstop's reason, then rejected by {@link #isDeadLetter}'s
   * consumer, so that the broker dead-letters them and they reach the DLQ
   * with its x-death beside backstop's headers. Only for a queue whose
   * dead-letter exchange routes to its DLQ, and whose every consumer rejects
   * such a message (a replay removes backstop-reason, so a replayed job runs).
   */
  public RabbitHandling deadLetterThroughQueue() {
    throughQueue = true;
    return this;
  }

  /** Whether a delivery is a dead letter on its way to the DLQ ({@link #deadLetterThroughQueue}): reject it, no requeue. */
  public boolean isDeadLetter(AMQP.BasicProperties props) {
    return throughQueue && props.getHeaders() != null && !Rabbit.text(props.getHeaders().get(Rabbit.H_REASON)).isEmpty();
  }

  /**
   * Decides job's step as a worker does: malformed, adopted (no message id),
   * a crash loop, due too far or early, the breaker's gate, else the handler
   * run and its outcome. Null: the pause was cut short (hand it back).
   */
  static Step decide(QueueRunner runner, RabbitQueue q, QueueHandler<RabbitJob> handler, RabbitJob job, long now,
      Pause pause) {
    QueueRunner.Typed typed = runner.policyFor(job.jobType());
    boolean own = runner.owns(job.jobType());
    QueuePlan plan;
    if (job.malformed()) {
      plan = runner.plan(typed.policy(), 0, "", 0, 0, true, null, now);
    } else if (job.id().isEmpty()) {
      return new Step(job, null, Rabbit.adopted(q.name, job), false);
    } else if (job.deliveryCount() > 0 && runner.ask(typed.policy(), Outcome.Event.DELIVERED, Failure.builder().build(),
        job.deliveryCount(), q.maxDeliveries).action() == Outcome.Action.DEAD_LETTER) {
      plan = QueuePlan.deadLetter(Decision.Reason.CRASH_LOOP, Rabbit.crashLoopError(job, q.maxDeliveries));
    } else if (job.dueMs() > now + Rabbit.MAX_DUE_AHEAD_MS) {
      // It would cycle through the delay levels for ever.
      plan = QueuePlan.deadLetter(Decision.Reason.MALFORMED, Rabbit.DUE_TOO_FAR);
    } else if (job.dueMs() > now) {
      return new Step(job, null, Rabbit.early(q.name, job, now), false);
    } else {
      if (!pause.await(job.jobType(), own)) return null;
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
    return new Step(job, plan, Rabbit.move(q.name, job, plan, System.currentTimeMillis()), true);
  }

  /** Counts and tells an applied step. */
  static void applied(QueueRunner runner, QueueMetrics qm, Step s) {
    if (s.plan() == null) return;
    if (qm != null) qm.observe(s.job().jobType(), s.job().malformed() ? 0 : s.job().attempt(), s.plan());
    if (s.told()) runner.tell(s.job(), s.plan());
  }

  /**
   * Runs one delivery (its properties, body and redelivered flag) through
   * handler and applies the outcome: on return the caller acks the delivery.
   * Returns the outcome applied, or null when it was no outcome of the job's
   * (a plain message without message_id given an id, an early one delayed
   * again).
   *
   * @throws IOException the outcome's message was refused or not confirmed: do not ack
   */
  public QueueOutcome<RabbitJob> handle(AMQP.BasicProperties props, byte[] body, boolean redelivered,
      QueueHandler<RabbitJob> handler) throws IOException, InterruptedException {
    long now = System.currentTimeMillis();
    RabbitJob job = Rabbit.jobFrom(q.name, props, body, now, redelivered);
    // No pause: a container's consumer is not the worker's; the gate defers each job while the breaker is open.
    Step s = decide(runner, q, handler, job, now, (type, own) -> true);
    if (s.pub() != null) {
      Rabbit.Publish p = s.pub();
      if (throughQueue && s.plan() != null && s.plan().action() == Outcome.Action.DEAD_LETTER) {
        p = new Rabbit.Publish("", q.name, p.headers(), p.messageId());
      }
      Rabbit.Publish pub = p;
      try {
        q.broker.op(q, c -> {
          c.publishAndWait(pub.exchange(), pub.routingKey(),
              RabbitBroker.props(props, pub.headers(), job.malformed() ? "" : pub.messageId(), null), body);
          return null;
        });
      } catch (IOException e) {
        runner.report(new IOException("rabbitmq queue " + q.name + ": outcome of job " + job.id()
            + " not applied (the delivery goes back): " + e.getMessage(), e), job);
        throw e;
      }
    }
    applied(runner, qm, s);
    return s.plan() == null ? null : QueueOutcome.of(q.name, job, s.plan());
  }

  /** Stops the mover (what it held goes back to the delay levels). */
  @Override
  public void close() {
    if (mover != null) mover.stop();
  }
}
