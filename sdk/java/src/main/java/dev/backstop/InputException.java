package dev.backstop;

import java.util.Collections;
import java.util.List;
import java.util.Optional;

/**
 * An invalid failure passed to {@link Policy#decide(Failure)}: a field out
 * of range, of the wrong type or unknown. The message is the one every
 * backstop host reports, {@code attempt: must be >= 1 (got 0)}
 * ({@code testdata/vectors/inputs.json}). No policy state changed for it.
 */
public final class InputException extends BackstopException {
  private static final long serialVersionUID = 1L;

  private final String field;
  private final String reason;
  private final int index;
  private final transient List<Decision> decisions;

  InputException(String field, String reason) {
    super(field + ": " + reason);
    this.field = field;
    this.reason = reason;
    this.index = -1;
    this.decisions = null;
  }

  /** The error of the first invalid failure of a batch: {@code failures[3]: attempt: must be >= 1 (got 0)}. */
  InputException(InputException first, int index, List<Decision> decisions) {
    super("failures[" + index + "]: " + first.field + ": " + first.reason);
    this.field = first.field;
    this.reason = first.reason;
    this.index = index;
    this.decisions = Collections.unmodifiableList(decisions);
  }

  /** From {@link Policy#decideMany}: the index of the first invalid failure; else -1. */
  public int index() {
    return index;
  }

  /**
   * From {@link Policy#decideMany}: the decisions of the whole batch, null
   * at each invalid index (every valid failure was decided, in order); else
   * empty.
   */
  public Optional<List<Decision>> decisions() {
    return Optional.ofNullable(decisions);
  }

  /** The field, as the vectors name it ({@code attempt}, {@code http_status}, …). */
  public String field() {
    return field;
  }

  /** Why it is invalid. */
  public String reason() {
    return reason;
  }
}
