package dev.backstop;

/**
 * What the retry loop records: {@link BackstopMetrics#recorder} gives the
 * Prometheus one (the backstop_client_* families every language exports).
 * Implement it to record elsewhere.
 */
public interface RetryMetrics {
  /** One attempt's outcome: success, retry, dead_letter (refused goes through {@link #refused}). */
  void attempt(String outcome);

  /** A retry scheduled, with the policy's reason and the delay. */
  void retry(Decision.Reason reason, long delayMs);

  /**
   * The measured time from a failed attempt to the start of the next one
   * (the delay plus however late the sleep returned). The default records
   * nothing, for recorders written before it.
   */
  default void latency(long ms) {}

  /** A call refused before it was made (circuit_open). */
  void refused(String reason);

  /** The retry budget left, as {@link Policy#budgetTokens()} reads it. */
  void budget(double tokens);

  /** The breaker's state last seen. */
  void state(CircuitState state);
}
