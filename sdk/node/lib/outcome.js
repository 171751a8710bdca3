// What a queue worker does about the outcome of a job, shared by the Redis
// worker (redis/worker.js) and the RabbitMQ one (rabbitmq/worker.js),
// through the Runner (runner.js) and the Redis queue's apply(): classify the
// error as retry() does, decide with the job's own facts, defer what the
// breaker or the budget refused. Pure apart from the policy's state: the
// brokers only move what this decides.
import { InputError } from './host/errors.js';
import { failureOf, isFailedResponse } from './retry.js';

// Decisions that defer a job instead of dead-lettering it (on_open: defer).
export const DEFERRED = new Set(['circuit_open', 'budget_exhausted']);
// A refused job's wait when the policy cannot say how long.
export const OPEN_POLL_MS = 1000;

/**
 * The plan for the outcome of running job ({id, attempt, firstEnqueuedMs,
 * prevDelayMs, malformed}): {action: ack|retry|defer|dead_letter, reason,
 * decision, msg, delayMs}. error is what the handler threw (or a failed
 * Response), null or undefined for a success. malformed is the text a
 * malformed job is dead-lettered with (each broker names its own fields).
 * enqueueNowMs is now on the clock that stamped job.firstEnqueuedMs (the
 * Redis server's: the job's elapsed time is measured on it; default nowMs).
 */
export function planOutcome(job, error, policy, { classify, nowMs, random, malformed, enqueueNowMs }) {
  const wellFormed = typeof job.id === 'string' && job.id !== '' && Number.isSafeInteger(job.attempt) && job.attempt >= 1;
  if (job.malformed || !wellFormed || job.attempt >= 1e14) {
    // The same text in every language (testdata/queue): the dead letter keeps
    // every field of the job, so the text repeats none.
    let msg = malformed;
    if (error !== undefined && error !== null) msg += ` (${errorText(error)})`;
    return { action: 'dead_letter', reason: 'malformed', decision: null, msg };
  }
  if (error === undefined || error === null) {
    policy.recordSuccess(nowMs);
    return { action: 'ack', reason: 'success', decision: null };
  }
  // A RetryError is a retry() inside the handler giving up (failureOf): its
  // last failure says what failed, and it is marked retriedDownstream
  // (unless circuit_open: no call made), so the job is dead-lettered with
  // retried_downstream rather than retried again (docs/layers.md).
  const failure = failureOf(error, classify);
  // The job's own facts win over whatever the classification said. A
  // queue job has no method: it is not gated (docs/policy.md), in every
  // language (testdata/queue: method/*).
  for (const f of ['attempt', 'idempotency_key', 'elapsed_ms', 'now_ms', 'prev_delay_ms', 'method']) delete failure[f];
  const now = nowMs ?? Date.now();
  failure.attempt = job.attempt;
  failure.idempotencyKey = job.id;
  failure.nowMs = now;
  const since = Number.isFinite(enqueueNowMs) ? enqueueNowMs : now;
  failure.elapsedMs = Math.max(0, since - (Number.isFinite(job.firstEnqueuedMs) ? job.firstEnqueuedMs : since));
  // The delay before this attempt, kept across the delay (decorrelated backoff).
  failure.prevDelayMs = Number.isSafeInteger(job.prevDelayMs) && job.prevDelayMs > 0 ? job.prevDelayMs : 0;
  if (random !== undefined) failure.random = random;
  const msg = errorText(error);
  let decision;
  try {
    decision = policy.decide(failure);
  } catch (err) {
    if (!(err instanceof InputError || err?.name === 'InputError')) throw err;
    return { action: 'dead_letter', reason: 'malformed', decision: null, msg: `${msg} (policy refused the failure: ${err.message})` };
  }
  if (decision.action === 'retry') return { action: 'retry', reason: decision.reason, decision, msg, delayMs: decision.delayMs };
  if (DEFERRED.has(decision.reason) && policy.onOpen !== 'dead_letter') {
    // Not the job's fault: it waits (until the breaker may half-open, or
    // its backoff for the budget, which budget_exhausted carries; 0 only
    // without a backoff: poll rather than spin) without spending an attempt.
    let delayMs = decision.delayMs > 0 ? decision.delayMs : OPEN_POLL_MS;
    if (decision.reason === 'circuit_open') delayMs = refusedFor(policy, now) ?? OPEN_POLL_MS;
    return { action: 'defer', reason: decision.reason, decision, msg, delayMs };
  }
  return { action: 'dead_letter', reason: decision.reason, decision, msg };
}

/**
 * The plan for a job the breaker refused before its handler ran (acquire):
 * deferred for retryInMs, or dead-lettered with on_open: dead_letter.
 */
export function refusedPlan(policy, retryInMs) {
  return policy.onOpen === 'dead_letter'
    ? { action: 'dead_letter', reason: 'circuit_open', decision: null, msg: 'circuit breaker open: the job was not run' }
    : { action: 'defer', reason: 'circuit_open', decision: null, msg: '', delayMs: retryInMs };
}

/**
 * Counts a plan in the process metrics (createMetrics): the families
 * retry() uses, target = the queue.
 */
export function countPlan(metrics, plan, policy) {
  if (plan.action === 'ack') metrics.attempt('success');
  else if (plan.action === 'retry' || plan.action === 'defer') {
    metrics.attempt('retry');
    metrics.retry(plan.reason, plan.delayMs ?? 0);
  } else metrics.attempt('dead_letter');
  if (policy.stateful === true && typeof policy.circuitState === 'function') metrics.state(policy.circuitState());
  if (policy.stateful === true && typeof policy.budgetTokens === 'function') metrics.budget(policy.budgetTokens());
}

/**
 * How long the policy's breaker refuses a call at nowMs (acquire), or null
 * when it allows one. A policy that cannot answer allows: its decision
 * after the call still applies.
 */
export function refusedFor(policy, nowMs, metrics) {
  if (typeof policy.acquire !== 'function') return null;
  let permit;
  try {
    permit = policy.acquire(nowMs);
  } catch {
    return null;
  }
  metrics?.state(permit.state);
  if (permit.allowed) return null;
  return permit.retryInMs > 0 ? permit.retryInMs : OPEN_POLL_MS;
}

export function checkPolicy(policy) {
  if (!policy || typeof policy.decide !== 'function' || typeof policy.recordSuccess !== 'function') {
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
