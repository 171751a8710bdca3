package dev.backstop;

/**
 * The error of every call on a stateful policy (one with a retry budget or
 * a circuit breaker) whose module instance trapped: its budget and breaker
 * were lost with it (wasm/ABI.md, "When an instance traps"). Load the
 * policy again; closing it succeeds.
 */
public final class StateLostException extends BackstopException {
  private static final long serialVersionUID = 1L;

  StateLostException(String message, Throwable cause) {
    super(message, cause);
  }
}
