package dev.backstop;

import java.util.Collections;
import java.util.Map;

/**
 * One delivery of a job from a RabbitMQ work queue, read from backstop's
 * headers (queue/rabbitmq/README.md, "Headers").
 *
 * <p>{@code attempt} is the 1-based number of this execution and {@code id}
 * (the message id) the job's stable identity, its idempotency key. A plain
 * message (no backstop headers: a Spring {@code RabbitTemplate}'s) is attempt
 * 1, first enqueued at its timestamp property or when it was received.
 * {@code malformed} marks a message the worker dead-letters without running
 * it; {@code headers} holds every header. {@code deliveryCount} is the
 * broker's {@code x-delivery-count} on a redelivery, else 0.
 */
public record RabbitJob(String id, long attempt, long firstEnqueuedMs, byte[] payload, String queue,
    String contentType, String jobType, String lastReason, String lastError, long prevDelayMs, long dueMs,
    long deliveryCount, boolean malformed, Map<String, Object> headers) {

  public RabbitJob {
    headers = Collections.unmodifiableMap(headers);
  }

  /** The payload as UTF-8 text. */
  public String payloadText() {
    return Rabbit.utf8(payload);
  }

  @Override
  public String toString() {
    return "RabbitJob[id=" + id + ", attempt=" + attempt + ", queue=" + queue + ", jobType=" + jobType + "]";
  }
}
