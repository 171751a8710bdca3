// What a queue worker does about the outcome of a job, shared by the Redis
// worker (redis/worker.js) and the RabbitMQ one (rabbitmq/worker.js),
// through the Runner (runner.js) and the Redis queue's apply(). The core
// decides it (policy.outcome(), wasm/ABI.md "outcome": ack, retry, defer or
// dead-letter, the delay, the pause, what to count); this gives it the
// error, classified as retry() does, with the job's own facts. The brokers
// only move what it decides.
import { failureOf, isFailedResponse } from './retry.js';

/**
 * The plan for the outcome of running job ({id, attempt, firstEnqueuedMs,
 * prevDelayMs, malformed}): the core's outcome ({action: ack|retry|defer|
 * dead_letter, reason, delayMs, pause, count}) with decision (the policy's
 * answer to a failure: {action, reason, delayMs}, else null) and msg (the
 * error's text). error is what the handler threw (or a failed Response),
 * null or undefined for a success. malformed is the text a malformed job is
 * dead-lettered with (each broker names its own fields). enqueueNowMs is
 * now on the clock that stamped job.firstEnqueuedMs (the Redis server's:
 * the job's elapsed time is measured on it; default nowMs).
 */
export function planOutcome(job, error, policy, { classify, nowMs, random, malformed, enqueueNowMs }) {
  const failed = error !== undefined && error !== null;
  const wellFormed = typeof job.id === 'string' && job.id !== '' && Number.isSafeInteger(job.attempt) && job.attempt >= 1;
  if (job.malformed || !wellFormed || job.attempt >= 1e14) {
    // The same text in every language (testdata/queue): the dead letter keeps
    // every field of the job, so the text repeats none.
    const msg = failed ? `${malformed} (${errorText(error)})` : malformed;
    return { action: 'dead_letter', reason: 'malformed', decision: null, msg, delayMs: 0, pause: false, count: 'dead_letter' };
  }
  const now = nowMs ?? Date.now();
  if (!failed) return { ...policy.outcome({ event: 'success', nowMs: now }), decision: null };
  // A RetryError is a retry() inside the handler giving up (failureOf): its
  // last failure says what failed, and it is marked retriedDownstream
  // (unless circuit_open: no call made), so the job is dead-lettered with
  // retried_downstream rather than retried again (docs/layers.md).
  const failure = failureOf(error, classify);
  // The job's own facts win over whatever the classification said. A
  // queue job has no method: it is not gated (docs/policy.md), in every
  // language (testdata/queue: method/*).
  for (const f of ['attempt', 'idempotency_key', 'elapsed_ms', 'now_ms', 'prev_delay_ms', 'method']) delete failure[f];
  failure.event = 'failure';
  failure.attempt = job.attempt;
  failure.idempotencyKey = job.id;
  failure.nowMs = now;
  const since = Number.isFinite(enqueueNowMs) ? enqueueNowMs : now;
  failure.elapsedMs = Math.max(0, since - (Number.isFinite(job.firstEnqueuedMs) ? job.firstEnqueuedMs : since));
  // The delay before this attempt, kept across the delay (decorrelated backoff).
  failure.prevDelayMs = Number.isSafeInteger(job.prevDelayMs) && job.prevDelayMs > 0 ? job.prevDelayMs : 0;
  if (random !== undefined) failure.random = random;
  const msg = errorText(error);
  const o = policy.outcome(failure);
  if (o.invalid) return { ...o, decision: null, msg: `${msg} (policy refused the failure: ${o.error.message})` };
  const decision = { action: o.action === 'retry' ? 'retry' : 'dead_letter', reason: o.reason, class: o.class, delayMs: o.action === 'dead_letter' ? 0 : o.delayMs };
  return { ...o, decision, msg };
}

export function checkPolicy(policy) {
  if (typeof policy?.outcome !== 'function') {
    throw new TypeError('Expected `policy` to be a Policy from loadPolicy()');
  }
}

/** The text the DLQ and the next attempt see for a failure. */
export function errorText(e) {
  if (e instanceof Error) {
    const name = e.name && e.name !== 'Error' ? e.name : '';
    return name && e.message ? `${name}: ${e.message}` : e.message || name || 'Error';
  }
  if (isFailedResponse(e)) return `HTTP ${e.status}${e.statusText ? ` ${e.statusText}` : ''}`;
  if (typeof e === 'string') return e;
  try {
    return JSON.stringify(e) ?? String(e);
  } catch {
    return String(e);
  }
}

/** Spreads loop intervals ±20% so a fleet of workers does not poll in step. */
export function jitter(ms) {
  return ms * (0.8 + 0.4 * Math.random());
}

/** Waits ms, or less when signal aborts. */
export function pause(ms, signal) {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener('abort', done, { once: true });
  });
}
