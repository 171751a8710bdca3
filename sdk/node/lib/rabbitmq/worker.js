// The RabbitMQ worker, Queue.work() (../rabbitmq.js), in the steps of Go's
// (queue/rabbitmq/worker.go): consume on a confirm channel, made again with
// backoff when lost; decide each delivery's plan (a kept one, malformed,
// crash loop, early, or run by the broker-neutral Runner, ../runner.js);
// publish its next message, wait for the confirm, then ack.
import { hostname } from 'node:os';
import { checkString, checkWhole } from '../args.js';
import { metricsOrigin } from '../metrics.js';
import { jitter, pause, planOutcome } from '../outcome.js';
import { checkWork, Runner } from '../runner.js';
import { anySignal, BACKOFF_MAX_MS, BACKOFF_MIN_MS, lostOrAborted, preconditionFailed, publish, Rejected, within } from './channel.js';
import { adoptedId, DUE_ERROR, H, jobOf, MALFORMED, MAX_DUE_AHEAD_MS, moveHeaders, plain, props } from './message.js';
import { countQueue, queueRecorder } from './metrics.js';
import { delayRoutingKey } from './topology.js';

// work()'s option (test only, as Go's WithoutMover) for the shared cases,
// which look at what the levels hold: no mover.
const NO_MOVER = Symbol.for('backstop-policy/rabbitmq without mover');
// Outcomes known but not acked when a channel was lost, kept per worker: at most this many.
const KEPT_MAX = 10_000;
// A handler's deadline by default: well under the broker's consumer_timeout
// (30 min by default), past which it closes the channel of an unacked delivery.
const HANDLER_TIMEOUT_MS = 5 * 60_000;
// At shutdown, how long the outcomes whose confirms are pending are awaited
// before the channel closes (their messages then come back: kept outcomes).
const APPLY_TIMEOUT_MS = 10_000;
// At shutdown, how long the consumer's cancel is awaited (a blocked connection answers nothing).
const CANCEL_WAIT_MS = 1000;

/**
 * Consumes queue until options.signal aborts (Queue.work(), rabbitmq.d.ts).
 * queue is what the worker needs of its Queue: {name, dlq, maxDeliveries,
 * core, ensure() (declares the topology once), forget() (declares it again
 * next time), error(what, err)}.
 */
export async function work(queue, policy, handler, options = {}) {
  checkWork(policy, handler, options);
  const {
    signal, prefetch = 16, classify, metrics, policies, onOutcome,
    onError = (err) => console.error(`backstop rabbitmq queue ${queue.name}:`, err),
    consumerTag = `${hostname()}-${process.pid}-${Math.random().toString(36).slice(2, 8)}`,
    handlerTimeoutMs = HANDLER_TIMEOUT_MS,
  } = options;
  checkWhole('prefetch', prefetch, 1, 65535);
  checkString('consumerTag', consumerTag);
  const runner = new Runner(queue.name, policy, handler,
    { signal, classify, metrics, policies, onOutcome, onError, handlerTimeoutMs },
    { malformed: MALFORMED, error: queue.error });
  // The queue families count what the broker cannot (as Go's WithMetrics).
  const origin = metrics === undefined ? undefined : metricsOrigin(metrics);
  const families = origin === undefined ? undefined : queueRecorder(origin.promClient, origin.registry, queue.name);
  await new Worker(queue, runner, policy, { signal, prefetch, consumerTag, families, mover: !options[NO_MOVER] }).consume();
}

class Worker {
  constructor(queue, runner, policy, { signal, prefetch, consumerTag, families, mover }) {
    Object.assign(this, { q: queue, runner, policy, prefetch, consumerTag, families, mover });
    const { signal: stop, dispose } = anySignal(signal, queue.core.closing.signal);
    this.stop = stop;
    this.dispose = dispose;
    // Outcomes decided but not acked when the channel was lost, by job id
    // and attempt: applied when the message comes back, the job not run again.
    this.kept = new Map();
  }

  // Keeps plan (its next message published or not, refused by the broker
  // refusals times in a row) for the delivery of job's return.
  keep(job, plan, published, refusals) {
    if (job.key === null) return;
    if (this.kept.size >= KEPT_MAX) this.kept.delete(this.kept.keys().next().value);
    this.kept.set(job.key, { ...plan, published, refusals });
  }

  // Consumes until stopped, on a channel made again (with backoff) whenever
  // the connection or the channel is lost.
  async consume() {
    const { q, stop } = this;
    // The delay levels' moves, for the jobs of every worker of the virtual
    // host: one mover per connection, while a work() runs.
    const stopMover = this.mover ? q.core.useMover() : async () => {};
    let backoff = BACKOFF_MIN_MS;
    while (!stop.aborted) {
      let ch;
      try {
        await q.ensure();
        ch = await q.core.channel(true);
      } catch (err) {
        if (preconditionFailed(err)) {
          // Q exists with other arguments: no retry mends that (as Go's Work).
          this.dispose();
          await stopMover();
          throw err;
        }
        this.runner.report(q.error('connect', err));
        await q.core.connection().catch(() => {}); // one more attempt at a lost connection
        await pause(jitter(backoff), stop);
        backoff = Math.min(2 * backoff, BACKOFF_MAX_MS);
        continue;
      }
      if (await this.session(ch)) backoff = BACKOFF_MIN_MS;
      if (!stop.aborted) {
        await pause(jitter(backoff), stop);
        backoff = Math.min(2 * backoff, BACKOFF_MAX_MS);
      }
    }
    this.dispose();
    await stopMover(); // what it held goes back to the levels
  }

  // Consumes on ch (at most prefetch deliveries at once) until it is lost or
  // the worker stops; true when it consumed. The jobs in hand finish and are
  // applied (or kept) before the channel closes.
  async session(ch) {
    const { q, stop } = this;
    const inflight = new Set();
    this.confirming = 0; // outcomes of this channel waiting for their confirm
    const lost = new Promise((resolve) => ch.once('close', resolve));
    let lostYet = false;
    lost.then(() => {
      lostYet = true;
    });
    let consumed = false;
    try {
      await ch.prefetch(this.prefetch);
      const { consumerTag: tag } = await ch.consume(q.name, (msg) => {
        if (msg === null) {
          // Cancelled by the broker (the queue was deleted): declare it
          // again and consume on a new channel.
          q.forget();
          ch.close().catch(() => {});
          return;
        }
        // Stopping (a cancel the broker has not read yet): left unacked, returned with the channel.
        if (stop.aborted) return;
        const t = this.handle(ch, msg).catch((err) => this.runner.report(err)).finally(() => inflight.delete(t));
        inflight.add(t);
      }, { noAck: false, consumerTag: this.consumerTag });
      consumed = true;
      await lostOrAborted(lost, stop);
      // (Deliveries that come meanwhile are left for the channel's close.)
      if (!lostYet) await within(ch.cancel(tag), CANCEL_WAIT_MS);
    } catch (err) {
      if (!lostYet) this.runner.report(q.error('consume', err));
    }
    // The jobs in hand finish; once only confirms are left, they are awaited
    // APPLY_TIMEOUT_MS at most (a blocked connection confirms nothing), then
    // the channel is closed, not waited for (the broker of a blocked
    // connection reads nothing): what is unconfirmed is unknown, its
    // delivery comes back (the crash contract: a duplicate, never a loss).
    let idle = 0;
    while (inflight.size > 0) {
      let timer;
      const tick = new Promise((resolve) => {
        timer = setTimeout(resolve, APPLY_TIMEOUT_MS / 10);
      });
      await Promise.race([Promise.all([...inflight]), tick]);
      clearTimeout(timer);
      idle = inflight.size > 0 && this.confirming === inflight.size ? idle + 1 : 0;
      if (idle >= 10 && !lostYet) {
        this.runner.report(q.error('stop', new Error(`${this.confirming} confirms still pending after ${APPLY_TIMEOUT_MS} ms: closing the channel`)));
        ch.close().catch(() => {});
        return consumed;
      }
    }
    if (!lostYet) await within(ch.close(), APPLY_TIMEOUT_MS);
    return consumed;
  }

  // One delivery: its plan decided, applied, counted and told.
  async handle(ch, msg) {
    const job = jobOf(msg, this.q.name);
    const plan = await this.decide(ch, msg, job);
    if (plan === null) return;
    const applied = await this.settle(ch, msg, job, plan);
    if (plan.action === 'adopt') return; // not run: its adopted copy will be
    // The queue families count what the broker has (as Go): published and acked.
    if (applied && this.families !== undefined) countQueue(this.families, job, plan);
    if (applied && plan.action !== 'early') {
      await this.runner.tell({ action: plan.action, reason: plan.reason, decision: plan.decision, applied, delayMs: plan.delayMs }, job);
    }
  }

  // The plan of a delivery, or null when there is nothing to apply (the
  // delivery goes back to the queue).
  async decide(ch, msg, job) {
    const { q, runner } = this;
    const keptPlan = job.key !== null && msg.fields.redelivered ? this.kept.get(job.key) : undefined;
    if (keptPlan !== undefined) {
      this.kept.delete(job.key);
      return keptPlan; // in the client metrics when it was decided; in the queue families once applied
    }
    // A plain message without message_id: published again with an id of
    // its own (adoptedId), then acked; the copy runs as attempt 1.
    if (job.adopt) return { action: 'adopt', reason: 'adopt', decision: null };
    if (job.malformed) return planOutcome(job, null, this.policy, { malformed: MALFORMED });
    // Delivered maxDeliveries times without an outcome: the core says whether that is a crash loop.
    const delivered = this.policy.outcome({ event: 'delivered', deliveries: job.deliveryCount, maxDeliveries: q.maxDeliveries });
    if (delivered.action === 'dead_letter') {
      const msg = `crash loop: delivered ${job.deliveryCount + 1} times without an outcome (max deliveries ${q.maxDeliveries})`;
      return { ...delivered, decision: null, msg };
    }
    if (job.dueMs !== null && job.dueMs > Date.now() + MAX_DUE_AHEAD_MS) {
      // It would cycle through the delay levels for ever.
      return { action: 'dead_letter', reason: 'malformed', decision: null, msg: DUE_ERROR };
    }
    if (job.dueMs !== null && job.dueMs > Date.now()) {
      // Early (a delay past the levels' range): the rest, nothing counted.
      return { action: 'early', reason: 'early', decision: null, delayMs: job.dueMs - Date.now() };
    }
    if (!(await this.waitPause(job.jobType))) return null;
    const plan = await runner.run(job, job.jobType, this.stop);
    if (plan === null) {
      try {
        ch.nack(msg, false, true); // delivered again: a crash loop in the end
      } catch {
        // The channel is gone: the broker returns it.
      }
    }
    return plan;
  }

  // The worker's breaker refused a job: start none (but those of a type
  // with its own policy) until it may half-open, as Go and the Redis worker.
  // False when stopped meanwhile: the delivery goes back to the queue with
  // the channel.
  async waitPause(type) {
    const { runner, stop } = this;
    if (runner.owns(type)) return true;
    while (runner.pausedUntil > Date.now() && !stop.aborted) await pause(runner.pausedUntil - Date.now(), stop);
    return !(stop.aborted && runner.pausedUntil > Date.now());
  }

  // The headers, exchange and routing key a plan publishes (none for an ack).
  next(job, msg, plan, now) {
    const name = this.q.name;
    if (plan.action === 'adopt') return { exchange: '', routingKey: name, headers: { ...(msg.properties.headers ?? {}) } };
    const headers = plan.action === 'dead_letter' && job.malformed
      ? { ...(msg.properties.headers ?? {}) } // every original header kept, for a person to read (as Go)
      : moveHeaders(msg.properties.headers);
    if (!job.malformed && plain(msg.properties.headers ?? {})) {
      // A plain delivery's job moves with the headers every job carries:
      // the next delivery is not plain (the same id, enqueued time).
      headers[H.attempt] = String(job.attempt);
      headers[H.first] = String(job.firstEnqueuedMs);
    }
    if (plan.action === 'dead_letter') {
      if (!(H.destination in headers) && !job.malformed) headers[H.destination] = name;
      headers[H.reason] = plan.reason;
      headers[H.error] = plan.msg ?? '';
      headers[H.deadLettered] = String(now);
      return { exchange: '', routingKey: this.q.dlq, headers };
    }
    // retry, defer, early: through the delay levels.
    headers[H.destination] = name;
    if (plan.action !== 'early') headers[H.due] = String(now + plan.delayMs); // early: the same due time
    if (plan.action === 'retry') {
      headers[H.attempt] = String(job.attempt + 1);
      headers[H.prevDelay] = String(plan.delayMs);
      headers[H.lastReason] = plan.reason;
      if (plan.msg) headers[H.lastError] = plan.msg;
    } else if (plan.action === 'defer') {
      headers[H.lastReason] = plan.reason;
      if (plan.msg) headers[H.lastError] = plan.msg;
    }
    return { exchange: `${name}.delay`, routingKey: delayRoutingKey(plan.delayMs), headers };
  }

  // Publishes the plan's message, waits for the broker's confirm (no
  // timeout: the confirm or the channel's close), then acks msg; true once
  // acked. Not applied, the plan is kept for the delivery's return; one the
  // broker refused (nack) is handed back after a pause (refusedPause).
  async settle(ch, msg, job, plan) {
    let published = plan.published === true;
    try {
      if (plan.action !== 'ack' && !published) {
        const { exchange, routingKey, headers } = this.next(job, msg, plan, Date.now());
        // The message_id is the job's id (a plain delivery's adopted one).
        const id = plan.action === 'adopt' ? { messageId: adoptedId() } : job.malformed ? {} : { messageId: job.id };
        this.confirming++;
        try {
          await publish(ch, exchange, routingKey, msg.content, { ...props(msg), ...id, headers });
        } finally {
          this.confirming--;
        }
        published = true;
      }
      ch.ack(msg);
      return true;
    } catch (err) {
      const refusals = err instanceof Rejected ? (plan.refusals ?? 0) + 1 : 0;
      this.keep(job, plan, published, refusals);
      if (refusals > 0) {
        // Refused (a full delay level or DLQ): handed back to be tried
        // again when it returns, but not at once (while a cluster elects a
        // leader, each return would count in x-delivery-count).
        setTimeout(() => {
          try {
            ch.nack(msg, false, true);
          } catch {
            // The channel is gone: the broker returned it.
          }
        }, refusedPause(refusals)).unref?.();
      }
      this.runner.report(this.q.error(`outcome ${plan.action} of job ${job.id || '(no id)'} not applied (kept for its redelivery)`, err), job);
      return false;
    }
  }
}

// How long a delivery whose outcome the broker refused n times in a row
// waits before it is handed back: 20 ms doubling to 5 s, jittered (half to
// all of it), as Go's.
export function refusedPause(n) {
  const d = Math.min(5000, 20 * 2 ** Math.min(n - 1, 10));
  return d / 2 + Math.random() * (d / 2);
}
