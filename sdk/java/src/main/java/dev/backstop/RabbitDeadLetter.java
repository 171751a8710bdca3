package dev.backstop;

import java.util.Collections;
import java.util.Map;

/**
 * A message in a RabbitMQ dead letter queue, as {@link RabbitQueue#inspect}
 * shows it (without {@code x-delivery-count}, the broker's count of looks). A
 * message the broker moved itself (past {@code x-delivery-limit}) has reason
 * {@code crash_loop}.
 */
public record RabbitDeadLetter(String id, String reason, String error, long attempt, long firstEnqueuedMs,
    long deadLetteredMs, byte[] payload, String jobType, String destination, Map<String, Object> headers) {

  public RabbitDeadLetter {
    headers = Collections.unmodifiableMap(headers);
  }
}
