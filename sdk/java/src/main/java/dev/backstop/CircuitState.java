package dev.backstop;

/** A circuit breaker's state; a policy without a breaker is always closed. */
public enum CircuitState {
  CLOSED("closed"),
  OPEN("open"),
  HALF_OPEN("half_open");

  private final String wire;

  CircuitState(String wire) {
    this.wire = wire;
  }

  static CircuitState of(int code) {
    if (code < 0 || code > 2) throw new BackstopException("backstop.wasm: an unknown circuit state " + code);
    return values()[code];
  }

  @Override
  public String toString() {
    return wire;
  }
}
