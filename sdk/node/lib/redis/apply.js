// The outcome of a Redis job, decided once and applied through the
// contract's scripts: what Queue.apply() (queue.js) does in one call, and
// what the worker (worker.js) sends again while Redis refuses it.
import { planOutcome } from '../outcome.js';

// What a malformed entry is dead-lettered with: the dead letter keeps
// every field of the entry (entry.<name>).
export const MALFORMED = 'malformed entry: needs id, attempt >= 1 and first_enqueued_ms';

/**
 * What to do about the outcome of running job, decided once (locally:
 * backstop.wasm): {action, reason, decision, msg, delayMs}. Only
 * applyPlan talks to Redis.
 */
export function planFor(job, error, policy, { classify, nowMs, random }) {
  return planOutcome(job, error, policy, { classify, nowMs, random, malformed: MALFORMED });
}

/** One attempt at applying plan to job's entry on queue: the Outcome. */
export async function applyPlan(queue, job, { action, reason, decision, msg, delayMs }) {
  if (action === 'ack') return { action, reason, decision, applied: await queue.ack(job) };
  if (action === 'retry') {
    const dueMs = await queue.retry(job, delayMs, reason, msg);
    return { action, reason, decision, applied: dueMs !== null, dueMs };
  }
  if (action === 'defer') {
    const dueMs = await queue.defer(job, delayMs, reason, msg ?? '');
    return { action, reason, decision, applied: dueMs !== null, dueMs, delayMs };
  }
  const dlqId = await queue.deadLetter(job.entryId, reason, msg);
  return { action, reason, decision, applied: dlqId !== null, dlqId };
}
