package dev.backstop;

/**
 * What a worker does about a job (the core's outcome, {@link Policy#outcome}):
 * the move it applies, the reason, the core's outcome of a handler's failure
 * (null otherwise), the job's last error, the delay, the client metric to
 * count and whether the breaker refused (the worker pauses).
 */
record QueuePlan(Outcome.Action action, Decision.Reason reason, Outcome decision, String error, long delayMs,
    Outcome.Count count, boolean pause) {

  static QueuePlan deadLetter(Decision.Reason reason, String error) {
    return new QueuePlan(Outcome.Action.DEAD_LETTER, reason, null, error, 0, Outcome.Count.NONE, false);
  }
}
