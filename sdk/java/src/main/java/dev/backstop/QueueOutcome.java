package dev.backstop;

/**
 * An outcome a queue worker applied to a job, as its outcome hook
 * ({@link WorkOptions#withOnOutcome}) sees it: the same fields as Go's
 * queue.OutcomeEvent and Python's backstop.queue.OutcomeEvent. Told once per
 * outcome the broker took (Redis: the script ran on the pending entry;
 * RabbitMQ: the next message confirmed and the delivery acked); not for an
 * early RabbitMQ message delayed again, a plain message adopted (given an
 * id), an outcome the broker did not take, or Redis reclaim's bulk
 * crash-loop dead letters.
 *
 * @param queue the queue's name
 * @param job the job as delivered ({@link RabbitJob}, {@link RedisJob})
 * @param action {@code ack}, {@code retry}, {@code defer} or {@code dead_letter}
 * @param reason {@code success} for an ack; the policy's reason; {@code crash_loop}, {@code malformed} for a job not run
 * @param failureClass {@code retryable}, {@code permanent} or {@code uncertain} as the policy decided the failure;
 *     "" for a success or a job not run (crash loop, malformed, breaker refusal, a failure the policy refused)
 * @param delayMs a retry's or deferral's wait; 0 otherwise
 * @param error the handler's error text; "" on success; why a job not run was dead-lettered
 */
public record QueueOutcome<J>(String queue, J job, String action, String reason, String failureClass, long delayMs,
    String error) {

  static <J> QueueOutcome<J> of(String queue, J job, QueuePlan plan) {
    Outcome.Action a = plan.action();
    String cls = plan.decision() == null ? "" : plan.decision().failureClass().toString();
    long delay = a == Outcome.Action.RETRY || a == Outcome.Action.DEFER ? plan.delayMs() : 0;
    return new QueueOutcome<>(queue, job, a.toString(), plan.reason().toString(), cls, delay, plan.error());
  }
}
