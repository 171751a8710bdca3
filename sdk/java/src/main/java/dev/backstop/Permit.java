package dev.backstop;

/**
 * The answer of {@link Policy#acquire(long)}: whether one call may be made
 * now. A refused call gets {@code retryInMs}, the time until the breaker may
 * admit one. An allowed call in half-open is a trial: report its outcome
 * with {@link Policy#recordSuccess(long)}, or {@link Policy#decide(Failure)}
 * for a failure.
 *
 * @param allowed true when the call may be made
 * @param retryInMs when refused, the time until something may change; 0 when allowed
 * @param state the breaker's state
 */
public record Permit(boolean allowed, long retryInMs, CircuitState state) {

  /** Unpacks a packed permit (wasm/ABI.md, "acquire"). */
  static Permit unpack(long w) {
    return new Permit(((w >>> 50) & 1) == 1, w & 0xffffffffffffL, CircuitState.of((int) (w >>> 48) & 3));
  }
}
