// The Redis worker, Queue.work() (queue.js), in the steps of Go's
// (queue/redisqueue/worker.go, settle.go): one loop promotes due retries,
// reclaims crashed consumers' entries and reads new jobs; each job is held
// while it runs (heartbeat), run by the broker-neutral Runner (../runner.js)
// and its outcome applied (settle), sent again while Redis refuses it.
import { hostname } from 'node:os';
import { checkString, checkWhole } from '../args.js';
import { jitter, pause } from '../outcome.js';
import { checkWork, Runner } from '../runner.js';
import { applyPlan, MALFORMED, planFor } from './apply.js';
import { ServerClock } from './clock.js';
import { writeRefused } from './refused.js';

const APPLY_BASE_MS = 20;
const APPLY_CAP_MS = 2000;
const BEAT_MIN_MS = 10;

/**
 * Consumes queue until options.signal aborts (Queue.work(), queue.d.ts):
 * reads jobs, runs handler and applies each outcome, promotes due retries
 * and reclaims crashed consumers' entries. Resolves once the jobs it read
 * are all applied.
 */
export async function work(queue, policy, handler, options = {}) {
  checkWork(policy, handler, options);
  const {
    signal, consumer = `${hostname()}-${process.pid}`, classify, batch = 16, blockMs = 1000,
    promoteEveryMs = 1000, promoteLimit = 500, reclaimEveryMs = 30_000, minIdleMs = 60_000, maxDeliveries = 5,
    onOutcome, onError = (err) => console.error(`backstop queue ${queue.name}:`, err), metrics, policies,
    handlerTimeoutMs = 5 * (minIdleMs > 0 ? minIdleMs : 60_000),
  } = options;
  checkString('consumer', consumer);
  checkWhole('batch', batch, 1);
  checkWhole('blockMs', blockMs, 1);
  checkWhole('promoteEveryMs', promoteEveryMs, 0);
  checkWhole('promoteLimit', promoteLimit, 1, 10000);
  checkWhole('reclaimEveryMs', reclaimEveryMs, 0);
  checkWhole('minIdleMs', minIdleMs, 0);
  checkWhole('maxDeliveries', maxDeliveries, 1);
  // The scripts stamp first_enqueued_ms with the server's clock: a job's
  // elapsed time is measured on it, whatever this machine's clock says.
  const clock = new ServerClock(queue);
  const runner = new Runner(queue.name, policy, handler,
    { signal, classify, metrics, policies, onOutcome, onError, handlerTimeoutMs },
    { malformed: MALFORMED, error: (what, err) => queueError(queue.name, what, err), enqueueClock: () => clock.now() });
  const w = new Worker(queue, runner, policy, {
    signal, consumer, batch, blockMs, promoteEveryMs, promoteLimit, reclaimEveryMs, minIdleMs, maxDeliveries, clock,
  });
  await w.loop();
}

function queueError(name, what, err) {
  return new Error(`queue ${name}: ${what}: ${err?.message ?? err}`, { cause: err });
}

class Worker {
  constructor(queue, runner, policy, options) {
    Object.assign(this, { q: queue, name: queue.name, runner, policy }, options);
    // While Redis refuses an outcome, the pauses between attempts: doubling
    // from 20 ms to 2 s, and to a quarter of minIdleMs, so that holding the
    // entry keeps its idle time below what reclaim takes.
    this.ceiling = this.minIdleMs > 0 ? Math.min(APPLY_CAP_MS, Math.max(1, this.minIdleMs / 4)) : APPLY_CAP_MS;
    this.nextPromote = 0; // performance.now() ms
    this.nextReclaim = 0;
  }

  // The worker's one loop: promote, reclaim and read, each when due, and
  // run what they hand over, until the signal aborts.
  async loop() {
    await this.q.ensureGroup();
    await this.clock.sync();
    this.nextPromote = performance.now();
    this.nextReclaim = this.nextPromote + jitter(this.reclaimEveryMs);
    while (!this.signal?.aborted) {
      let jobs;
      try {
        const now = performance.now();
        await this.promoteDue(now);
        await this.reclaimIdle(now);
        jobs = await this.read();
      } catch (err) {
        await this.readFailed(err);
        continue;
      }
      await this.processAll(jobs);
    }
  }

  // Promotes due retries when the promote interval is up: full batches
  // mean more are due, so it keeps going.
  async promoteDue(now) {
    if (this.promoteEveryMs <= 0 || now < this.nextPromote) return;
    let moved;
    do moved = (await this.q.promote(this.promoteLimit)).moved;
    while (moved === this.promoteLimit && !this.signal?.aborted);
    this.nextPromote = now + jitter(this.promoteEveryMs);
  }

  // Takes over the entries of crashed consumers when the reclaim interval
  // is up, and runs them.
  async reclaimIdle(now) {
    if (this.reclaimEveryMs <= 0 || now < this.nextReclaim) return;
    this.nextReclaim = now + jitter(this.reclaimEveryMs);
    const { jobs: claimed, skipped } = await this.q.reclaim(this.consumer, { minIdleMs: this.minIdleMs, count: 100, maxDeliveries: this.maxDeliveries });
    // Crash loops the DLQ refused stay pending: say so, one report each (Go logs them).
    for (const { entryId, reason } of skipped) {
      this.runner.report(
        Object.assign(new Error(`queue ${this.name}: crash loop ${entryId} stays pending: ${reason}`), {
          entryId,
          reason,
        }),
      );
    }
    await this.processAll(claimed);
  }

  // Reads new jobs, blocking no longer than until the next promote; none
  // while the breaker refuses jobs (promoting and reclaiming go on).
  async read() {
    const untilPromote = Math.ceil(this.nextPromote - performance.now());
    const pausedMs = this.runner.pausedUntil - Date.now();
    if (pausedMs > 0) {
      // The breaker refused a job: read nothing until it may half-open.
      await pause(this.promoteEveryMs > 0 ? Math.max(1, Math.min(pausedMs, untilPromote)) : pausedMs, this.signal);
      return [];
    }
    const wait = this.promoteEveryMs > 0 ? Math.max(1, Math.min(this.blockMs, untilPromote)) : this.blockMs;
    return this.q.read(this.consumer, { count: this.batch, blockMs: wait });
  }

  // A failed promote, reclaim or read: a deleted stream is made again,
  // anything else reported and waited out for a second.
  async readFailed(err) {
    if (/NOGROUP/.test(err?.message)) {
      // The stream was deleted: make it again.
      try {
        await this.q.ensureGroup();
        return;
      } catch (e) {
        err = e;
      }
    }
    this.runner.report(err);
    await pause(1000, this.signal);
  }

  // Runs jobs, read together, one after the other.
  async processAll(jobs) {
    const readAt = performance.now();
    for (const [i, job] of jobs.entries()) await this.process(job, jobs.slice(i + 1), readAt);
  }

  // Runs job and applies its outcome. Until then, it and the jobs read
  // with it (waiting) are held (hold()) every third of minIdleMs, so that
  // reclaim does not run them elsewhere while this worker lives.
  async process(job, waiting = [], readAt = performance.now()) {
    const ids = heldIds(job, waiting);
    const beat = this.minIdleMs > 0 ? heartbeat(() => this.q.hold(this.consumer, ids), this.minIdleMs / 3) : null;
    try {
      await this.attempt(job, waiting, readAt);
    } finally {
      beat?.stop();
    }
  }

  async attempt(job, waiting, readAt) {
    if (!(await this.stillHeld(job, readAt))) return;
    let plan;
    if (job.malformed) {
      plan = planFor(job, null, this.policy, {}); // dead-lettered without running
    } else {
      await this.clock.sync();
      plan = await this.runner.run(job, job.type, this.signal);
      if (plan === null) return; // the entry stays pending: reclaim delivers it again
    }
    await this.settle(job, plan, waiting);
  }

  // A job that waited in the batch for half of minIdleMs may have been
  // reclaimed by another consumer: hold it first, and skip it if so.
  async stillHeld(job, readAt) {
    if (this.minIdleMs > 0 && performance.now() - readAt > this.minIdleMs / 2) {
      try {
        const [held] = await this.q.hold(this.consumer, [job]);
        if (!held) return false;
      } catch {
        // Cannot tell: run it.
      }
    }
    return true;
  }

  // Applies plan, the outcome of job, holding on while Redis refuses it
  // (see the README's "When Redis refuses a write").
  async settle(job, plan, waiting) {
    const { signal, runner } = this;
    const ids = heldIds(job, waiting);
    let delay = Math.min(APPLY_BASE_MS, this.ceiling);
    let holdFailed = false;
    for (let refusals = 0; ; refusals++) {
      const stopped = signal?.aborted === true;
      let outcome;
      try {
        outcome = await applyPlan(this.q, job, plan);
      } catch (err) {
        if (!writeRefused(err)) {
          runner.report(err, job); // not worth sending again: the entry stays pending for reclaim
          return;
        }
        if (stopped) {
          runner.report(
            new Error(
              `queue ${this.name}: outcome ${plan.action} of entry ${job.entryId} (job ${job.id}) not applied: ` +
                `the worker stopped while Redis refused it (${refusals + 1} times); the entry stays pending`,
              { cause: err },
            ),
            job,
          );
          return;
        }
        if (refusals === 0) runner.report(err, job); // the first refusal; onOutcome gets the count
        try {
          await this.q.hold(this.consumer, ids);
        } catch (err) {
          // Holding is best effort (the next attempt tells): say so once.
          if (!holdFailed) runner.report(err, job);
          holdFailed = true;
        }
        await pause(delay / 2 + Math.random() * (delay / 2), signal);
        delay = Math.min(2 * delay, this.ceiling);
        continue;
      }
      await runner.tell(refusals > 0 ? { ...outcome, refusals } : outcome, job);
      return;
    }
  }
}

// The entries a worker holds for job: its own, then those of the jobs read
// with it and not started yet (at most hold()'s 1000).
function heldIds(job, waiting) {
  return [job, ...waiting].slice(0, 1000).map((j) => j.entryId);
}

// Calls beat every everyMs (at least BEAT_MIN_MS), one call at a time, its
// failures ignored (the next one tells), until stop().
function heartbeat(beat, everyMs) {
  const ended = new AbortController();
  (async () => {
    for (;;) {
      await pause(Math.max(BEAT_MIN_MS, everyMs), ended.signal);
      if (ended.signal.aborted) return;
      await Promise.resolve().then(beat).catch(() => {});
    }
  })();
  return { stop: () => ended.abort() };
}
