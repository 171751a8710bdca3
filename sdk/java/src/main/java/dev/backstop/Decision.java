package dev.backstop;

import java.time.Duration;

/**
 * What the policy decided for one failure: retry after {@code delayMs}, or
 * give up (dead letter) for a {@code reason}. The names ({@link #toString()}
 * of each enum) are those of every backstop host and of the vectors
 * ({@code testdata/vectors/README.md}).
 *
 * @param action retry or dead_letter
 * @param delayMs a retry's delay in milliseconds; for {@code budget_exhausted}
 *     the backoff the refused retry would have had; 0 for other dead letters
 * @param reason why
 * @param failureClass how the failure was classified ({@code class} in JSON)
 */
public record Decision(Action action, long delayMs, Reason reason, FailureClass failureClass) {

  /** The action: {@code retry} or {@code dead_letter}. */
  public enum Action {
    RETRY("retry"),
    DEAD_LETTER("dead_letter");

    private final String wire;

    Action(String wire) {
      this.wire = wire;
    }

    @Override
    public String toString() {
      return wire;
    }
  }

  /** Why: the fixed set of reasons (wasm/ABI.md, "The packed decision"). */
  public enum Reason {
    TRANSIENT("transient"),
    RETRY_AFTER("retry_after"),
    UNCERTAIN("uncertain"),
    PERMANENT_ERROR("permanent_error"),
    MAX_ATTEMPTS_REACHED("max_attempts_reached"),
    MAX_ELAPSED_EXCEEDED("max_elapsed_exceeded"),
    UNCERTAIN_LIMIT_REACHED("uncertain_limit_reached"),
    NOT_IDEMPOTENT("not_idempotent"),
    BUDGET_EXHAUSTED("budget_exhausted"),
    CIRCUIT_OPEN("circuit_open"),
    RETRY_AFTER_TOO_LONG("retry_after_too_long"),
    RETRIED_DOWNSTREAM("retried_downstream"),
    SERVER_DECLINED("server_declined");

    private final String wire;

    Reason(String wire) {
      this.wire = wire;
    }

    @Override
    public String toString() {
      return wire;
    }
  }

  /** How the failure was classified. */
  public enum FailureClass {
    RETRYABLE("retryable"),
    PERMANENT("permanent"),
    UNCERTAIN("uncertain");

    private final String wire;

    FailureClass(String wire) {
      this.wire = wire;
    }

    @Override
    public String toString() {
      return wire;
    }
  }

  private static final Action[] ACTIONS = Action.values();
  private static final Reason[] REASONS = Reason.values();
  private static final FailureClass[] CLASSES = FailureClass.values();

  /** True when the action is {@code retry}. */
  public boolean isRetry() {
    return action == Action.RETRY;
  }

  /** The delay as a Duration. */
  public Duration delay() {
    return Duration.ofMillis(delayMs);
  }

  /** The decision as backstop's commands write it: {@code {"action":…,"delay_ms":…,"reason":…,"class":…}}. */
  public String toJson() {
    StringBuilder b = new StringBuilder(96);
    b.append("{\"action\":");
    Json.quote(b, action.toString()).append(",\"delay_ms\":").append(delayMs).append(",\"reason\":");
    Json.quote(b, reason.toString()).append(",\"class\":");
    return Json.quote(b, failureClass.toString()).append('}').toString();
  }

  /** Unpacks a packed decision (wasm/ABI.md, "The packed decision"). */
  static Decision unpack(long packed) {
    int reason = (int) (packed >>> 48) & 15;
    int cls = (int) (packed >>> 52) & 3;
    if (reason >= REASONS.length || cls >= CLASSES.length) {
      throw new BackstopException("backstop.wasm: decide: an unknown reason " + reason + " or class " + cls
          + " (packed 0x" + Long.toHexString(packed) + "): the module is newer than this package");
    }
    return new Decision(ACTIONS[(int) (packed >>> 54) & 1], packed & 0xffffffffffffL, REASONS[reason], CLASSES[cls]);
  }
}
