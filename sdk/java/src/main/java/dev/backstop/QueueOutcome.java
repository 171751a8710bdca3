package dev.backstop;

import java.util.Optional;

/**
 * An outcome a queue worker applied to a job (or could not apply), as the
 * worker's {@code onOutcome} hook sees it; the same events as Node's
 * {@code onOutcome}: every outcome of a job the worker decided, once the
 * broker has it or once it failed to apply it (not an early job's delay
 * again, nor a plain message's adoption).
 *
 * @param action {@code ack}, {@code retry}, {@code defer} or {@code dead_letter}
 * @param reason the decision's reason ({@code success} for an ack, {@code malformed}, {@code crash_loop}, …)
 * @param decision the core's outcome of the handler's failure; empty when the handler did not fail or run
 * @param applied whether the broker confirmed the next message and the delivery was acked
 * @param delayMs how long a retried or deferred job waits
 * @param refusals how often in a row the broker refused to take the outcome (0: not refused)
 */
public record QueueOutcome(String action, String reason, Optional<Outcome> decision, boolean applied, long delayMs,
    int refusals) {}
