// The broker-neutral part of a queue worker, as Go's queue.Runner
// (queue/runner.go, queue/policies.go): it asks the core before a job (the
// breaker), runs the handler within its deadline, asks the core the outcome
// (outcome.js), counts what the core says, and holds new jobs back while the
// breaker refuses them; the jobs of a type with a policy of its own
// (work()'s `policies`) run with it. It touches no broker: the Redis worker (redis/worker.js) and the
// RabbitMQ one (rabbitmq/worker.js) read deliveries and apply the plans it
// returns through their own moves.
import { checkFunction, checkSignal, checkWhole } from './args.js';
import { startDeadline } from './deadline.js';
import { typedPolicies } from './jobtypes.js';
import { checkPolicy, planOutcome } from './outcome.js';
import { isFailedResponse } from './retry.js';

/** Checks what every broker's work(policy, handler, options) takes first. */
export function checkWork(policy, handler, options) {
  checkPolicy(policy);
  checkFunction('handler', handler);
  if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
}

export class Runner {
  #policy;
  #handler;
  #typed; // job type → {policy, metrics}: work()'s policies
  // The rest of work()'s options: classify, metrics, handlerTimeoutMs,
  // onOutcome, onError; and the broker's malformed and error.
  #o;
  #pausedUntil = 0; // unix ms: the breaker refused a job; take none before

  /**
   * The runner of work(policy, handler, options) on queue name. options are
   * the work() options every broker takes, its defaults applied (signal is
   * only checked: the broker stops on it); malformed is the text a malformed
   * job is dead-lettered with, error(what, err) the broker's error, named
   * after the queue; enqueueClock() (optional) is now in unix ms on the
   * clock that stamps first_enqueued_ms (Redis' TIME): a job's elapsed time
   * is measured on it (default Date.now()).
   */
  constructor(name, policy, handler, options, { malformed, error, enqueueClock }) {
    const { signal, classify, metrics, policies, onOutcome, onError, handlerTimeoutMs } = options;
    checkSignal(signal);
    checkFunction('classify', classify, true);
    checkWhole('handlerTimeoutMs', handlerTimeoutMs, 1);
    checkFunction('onOutcome', onOutcome, true);
    checkFunction('onError', onError);
    if (metrics !== undefined) {
      if (typeof metrics?.attempt !== 'function') throw new TypeError('Expected `metrics` to be the result of createMetrics()');
      if (metrics.target !== name) {
        throw new TypeError(`Expected \`metrics\` to have target ${JSON.stringify(name)}, the queue's name (got ${JSON.stringify(metrics.target)})`);
      }
    }
    this.#typed = typedPolicies(policies, metrics);
    this.#policy = policy;
    this.#handler = handler;
    this.#o = { classify, metrics, handlerTimeoutMs, onOutcome, onError, malformed, error, enqueueClock };
  }

  /** Tells onError of err (about job, when given); a failing logger must not stop the worker. */
  report(err, job) {
    try {
      this.#o.onError(err, job);
    } catch {
      // A failing logger must not stop the worker.
    }
  }

  /** Tells onOutcome of an applied outcome; what it throws is reported. */
  async tell(outcome, job) {
    try {
      await this.#o.onOutcome?.(outcome, job);
    } catch (err) {
      this.report(err, job);
    }
  }

  /** Whether jobs of type run with a policy of their own (work()'s policies). */
  owns(type) {
    return this.#typed.has(type);
  }

  /**
   * When the worker's breaker (not a type's) may let a job through again,
   * in unix ms, after it refused one or a failure found it open: a worker
   * takes no new job before. 0 when never paused.
   */
  get pausedUntil() {
    return this.#pausedUntil;
  }

  /**
   * Runs job (not malformed: the broker dead-letters those), of job type
   * type, and resolves to its plan (outcome.js), as the core decides it:
   * the breaker asked first (refused, the handler does not run), the
   * handler run until its deadline or until stop aborts, the outcome
   * decided, counted and, when the breaker refused, the worker paused.
   * Resolves to null when the policy could not decide (reported): the
   * broker leaves the job to be delivered again.
   */
  async run(job, type, stop) {
    // A job type with its own policy runs with it, and its metrics
    // (policy=<type>); its breaker defers its jobs without pausing the
    // worker.
    const own = this.#typed.get(type);
    const policy = own?.policy ?? this.#policy;
    const metrics = own ? own.metrics : this.#o.metrics;
    let plan = this.#before(policy, metrics);
    if (plan === null) {
      if (metrics !== undefined) measure(metrics, job, this.#o.enqueueClock?.() ?? Date.now());
      const started = performance.now();
      const error = await runHandler(this.#handler, job, stop, this.#o.handlerTimeoutMs, (err) => this.report(this.#o.error(`job ${job.id}`, err), job));
      // The run's duration (monotonic) for the breaker's slow-call rate,
      // success or failure; the outcome below applies whatever it says.
      if (policy.stateful && typeof policy.recordDuration === 'function') {
        try {
          policy.recordDuration(performance.now() - started);
        } catch (err) {
          this.report(err, job);
        }
      }
      try {
        plan = planOutcome(job, error, policy, { classify: this.#o.classify, malformed: this.#o.malformed, enqueueNowMs: this.#o.enqueueClock?.() });
      } catch (err) {
        this.report(err, job);
        return null;
      }
    }
    // The breaker refused (before the job, or its failure found it open):
    // the worker takes no job until it may half-open.
    if (!own && plan.pause) this.#pausedUntil = Math.max(this.#pausedUntil, Date.now() + plan.delayMs);
    if (metrics !== undefined) count(metrics, plan, policy);
    return plan;
  }

  // The breaker protects the dependency before the call: the plan of a job
  // it refuses (deferred, or dead-lettered with on_open: dead_letter), or
  // null to run it. A policy that cannot answer lets it run: its decision
  // after the call still applies.
  #before(policy, metrics) {
    const now = Date.now();
    let o;
    try {
      o = policy.outcome({ event: 'before', nowMs: now });
      metrics?.state(policy.stateful ? policy.circuitState(now) : 'closed');
    } catch {
      return null;
    }
    if (o.action === 'run') return null;
    return { ...o, decision: null, msg: o.action === 'dead_letter' ? 'circuit breaker open: the job was not run' : '' };
  }
}

// Records the latency of retried job as it starts (as Go's Runner): now on
// the broker's clock minus the failure's time, its due time minus the delay
// decided then. A job deferred since its failure (the breaker, the budget)
// is not measured: its due time is the deferral's.
function measure(metrics, job, nowMs) {
  const { attempt, dueMs, prevDelayMs, lastReason } = job;
  if (!(attempt >= 2) || !(dueMs > 0) || !(prevDelayMs >= 0) || prevDelayMs > dueMs ||
      lastReason === 'circuit_open' || lastReason === 'budget_exhausted') return;
  metrics.latency(nowMs - (dueMs - prevDelayMs));
}

// Counts a plan in the process metrics (createMetrics: the families retry()
// uses, target = the queue) as the core says (count), then the breaker's
// state and the budget left.
function count(metrics, plan, policy) {
  if (plan.count === 'refused') return metrics.refused(plan.reason);
  if (plan.count !== 'none') metrics.attempt(plan.count);
  if (plan.count === 'retry') metrics.retry(plan.reason, plan.delayMs);
  if (policy.stateful === true) {
    metrics.state(policy.circuitState());
    metrics.budget(policy.budgetTokens());
  }
}

/**
 * Runs handler(job, {signal}) for at most timeoutMs: resolves to the
 * failure (what it threw, or a failed Response, its body cancelled), null
 * for a success. signal aborts when stop does (the worker stopping) or at
 * the deadline. At the deadline the failure is a TimeoutError (`handler
 * deadline exceeded after <ms> ms`: error kind timeout, decided as any
 * failure) and the handler is not waited for: one that ignores its signal
 * and is still running a moment later is told to onIgnored(error), once.
 */
export async function runHandler(handler, job, stop, timeoutMs, onIgnored) {
  const d = startDeadline(timeoutMs, `handler deadline exceeded after ${timeoutMs} ms`, stop);
  let running;
  try {
    running = Promise.resolve(handler(job, d.context));
    const result = await Promise.race([running, d.expired]);
    if (!isFailedResponse(result)) return null;
    await result.body?.cancel?.().catch(() => {}); // free the connection of a body nobody will read
    return result;
  } catch (err) {
    if (d.error === null || err !== d.error) return err ?? new Error(`handler threw ${err}`);
    const settled = () => true;
    if (!(await Promise.race([running.then(settled, settled), new Promise((resolve) => setImmediate(resolve, false))]))) {
      onIgnored(new Error(`${err.message}; its handler ignores its signal and runs on: the worker moved on`, { cause: err }));
    }
    return err;
  } finally {
    d.clear();
  }
}
