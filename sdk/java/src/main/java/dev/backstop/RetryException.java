package dev.backstop;

import java.util.Optional;

/**
 * Thrown by {@link Backstop#retry} when the policy says stop. It keeps why
 * ({@link #reason()}: {@code max_attempts_reached}, {@code permanent_error},
 * {@code circuit_open}, …), how many attempts ran, the last error
 * ({@link #getCause()}), the decision, and for a failed HTTP response
 * returned by the operation, that response.
 */
public final class RetryException extends BackstopException {
  private static final long serialVersionUID = 1L;

  private final Decision.Reason reason;
  private final int attempts;
  private final transient Decision decision;
  private final transient Object response;
  private final long retryInMs;

  RetryException(Decision.Reason reason, int attempts, Throwable cause, Object response, Decision decision,
      long retryInMs) {
    super("gave up after " + attempts + " attempt" + (attempts == 1 ? "" : "s") + " (" + reason + "): "
        + (cause == null ? "" : cause.getMessage() == null ? cause.toString() : cause.getMessage()), cause);
    this.reason = reason;
    this.attempts = attempts;
    this.decision = decision;
    this.response = response;
    this.retryInMs = retryInMs;
  }

  /** Why retrying stopped. */
  public Decision.Reason reason() {
    return reason;
  }

  /** How many attempts were made (0 when the breaker refused the first). */
  public int attempts() {
    return attempts;
  }

  /** The policy's last decision; empty when the circuit breaker refused the call before it was made. */
  public Optional<Decision> decision() {
    return Optional.ofNullable(decision);
  }

  /** The failed response the operation returned last, if it returned one (a {@code java.net.http.HttpResponse}). */
  public Optional<Object> response() {
    return Optional.ofNullable(response);
  }

  /** For {@code circuit_open}: the time until the breaker may admit a call; else 0. */
  public long retryInMs() {
    return retryInMs;
  }
}
