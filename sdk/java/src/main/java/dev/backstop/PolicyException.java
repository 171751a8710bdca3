package dev.backstop;

import java.util.ArrayList;
import java.util.List;

/**
 * A policy (bytes or preset name) that backstop.wasm refused. The message
 * is the module's and names every invalid field:
 * {@code invalid policy: backoff.cap: must be >= backoff.base (got 100ms < 1s)}.
 */
public final class PolicyException extends BackstopException {
  private static final long serialVersionUID = 1L;

  /** One invalid field of a policy and why. */
  public record Problem(String field, String reason) {}

  private final List<Problem> problems;

  PolicyException(String message) {
    super(message);
    String rest = message.startsWith("invalid policy: ") ? message.substring(16) : message;
    List<Problem> ps = new ArrayList<>();
    for (String p : rest.split("; ", -1)) {
      int i = p.indexOf(": ");
      ps.add(i < 0 ? new Problem("", p) : new Problem(p.substring(0, i), p.substring(i + 2)));
    }
    this.problems = List.copyOf(ps);
  }

  /** Every problem the module named, in its order. */
  public List<Problem> problems() {
    return problems;
  }

  /** The field of the first problem ("" when the message names none). */
  public String field() {
    return problems.get(0).field();
  }
}
