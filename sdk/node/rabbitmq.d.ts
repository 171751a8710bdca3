import type {FailureFields, Metrics, Policy} from './index.js';
import type {HandlerContext, JobDecision} from './queue.js';

export interface ConnectOptions {
	/**
	The amqplib module, when it cannot be imported from this package's location.

	@default await import('amqplib')
	*/
	readonly amqplib?: unknown;

	/** Passed to amqplib's `connect` (TLS, timeouts). */
	readonly socketOptions?: unknown;

	/**
	Called with connection errors (the broker closing it, a lost socket). Workers reconnect on their own.

	@default console.error
	*/
	readonly onError?: (error: unknown) => void;
}

/**
Connects to a RabbitMQ broker (3.10 or newer): resolves once connected, rejects when that first connection fails.

@example
const broker = await connect('amqp://guest:guest@127.0.0.1:5672/');
const emails = broker.queue('emails');
await emails.enqueue('job-1', JSON.stringify({to: 'a@example.com'}), {jobType: 'send_email'});
*/
export function connect(url: string, options?: ConnectOptions): Promise<Broker>;

/** One connection to a broker; its queues share it (and make it again when it is lost). */
export interface Broker {
	/** The work queue `name`, with `name.dlq`, `name.delay` and `name.due` (queue/rabbitmq/README.md). */
	queue(name: string, options?: QueueOptions): Queue;

	/** Closes the connection. Stop the workers first (abort their signal): a closed broker also ends them. */
	close(): Promise<void>;
}

export interface QueueOptions {
	/**
	Deliveries without an outcome (a worker that died, a lost channel) before a job is dead-lettered with reason `crash_loop`, not run again. The queue's `x-delivery-limit` is this + 2, for when no worker is left to do it.

	@default 5
	*/
	readonly maxDeliveries?: number;
}

/** A job as the handler sees it: one delivery. */
export interface Job {
	/** The job's stable id (`message_id`), its idempotency key: the same on every attempt. A plain delivery (neither `backstop-attempt` nor `backstop-first-enqueued-ms`) without `message_id` is first adopted (published again with `amqp-` and 32 random hex digits), and runs under that id. */
	readonly id: string;
	/** The 1-based number of this execution (`backstop-attempt`): it travels with the message, so it survives crashes. */
	readonly attempt: number;
	/** When the job was first enqueued (unix ms; a plain delivery: its `timestamp` property, else when it was received). */
	readonly firstEnqueuedMs: number;
	/** The body, byte for byte. */
	readonly payload: Buffer;
	/** The `content_type` property, as enqueued. */
	readonly contentType: string | undefined;
	/** The job type (`backstop-job-type`), '' when none. */
	readonly jobType: string;
	/** The previous attempt's reason: a retry reason, `circuit_open` after a deferral, or after a replay the dead letter's reason. */
	readonly lastReason: string;
	/** The previous attempt's error. */
	readonly lastError: string;
	/** The delay before this attempt in milliseconds (0 for the first): the decorrelated strategy's input. */
	readonly prevDelayMs: number;
	/** Not before (unix ms) for a delayed message, else null. */
	readonly dueMs: number | null;
	/** The broker's `x-delivery-count`: deliveries of this message that ended without an outcome. */
	readonly deliveryCount: number;
	/** The work queue. */
	readonly queue: string;
	/** Every header of the delivery. */
	readonly headers: Readonly<Record<string, unknown>>;
	/** No `message_id`, or no valid `backstop-attempt` / `backstop-first-enqueued-ms` (a plain delivery, with neither header, is not malformed): dead-lettered with reason `malformed`, never run; so is one whose `backstop-due-ms` is more than 30 days ahead. */
	readonly malformed: boolean;
}

/** Runs one job. Resolving is a success; throwing (or resolving to a failed fetch `Response`) is a failure that the policy decides. `signal` aborts when the worker stops and at the handler's deadline (`handlerTimeoutMs`): pass it to the calls the handler makes. */
export type Handler = (job: Job, context: HandlerContext) => unknown;

/** What a worker did with a delivery, once the broker confirmed it. */
export interface Outcome {
	readonly action: 'ack' | 'retry' | 'defer' | 'dead_letter';
	/** `success`, the retry or dead letter reason, `circuit_open` / `budget_exhausted` for a deferral, `malformed`, `crash_loop`. */
	readonly reason: string;
	/** The policy's decision, null when it was not asked (success, malformed, crash loop, refused by the breaker). */
	readonly decision: JobDecision | null;
	readonly applied: true;
	/** The delay of a retry or a deferral (ms). */
	readonly delayMs?: number;
}

export interface WorkOptions {
	/** Stops the worker: it stops consuming, lets the jobs in hand finish, applies their outcomes, then resolves. */
	readonly signal?: AbortSignal;

	/**
	Deliveries in hand at once (basic.qos): also how many handlers run at once.

	@default 16
	*/
	readonly prefetch?: number;

	/** Maps the error to failure fields, as in retry(); `undefined` uses the built-in mapping (`status`, `Retry-After`, Node.js error codes). */
	readonly classify?: (errorOrResponse: unknown) => FailureFields | undefined;

	/**
	The process metrics from `createMetrics()` with `target` = the queue's name: the backstop_client_* families, and on the same registry the queue families (`backstop_attempts_total`, `backstop_retries_total`, `backstop_deferrals_total`, `backstop_dead_letters_total`, `backstop_max_attempts_reached_total`, `backstop_job_attempts`, labelled `queue` and `job_type`) that the broker cannot count itself.

	@example createMetrics(promClient, {policy: 'default', target: 'emails'})
	*/
	readonly metrics?: Metrics;

	/**
	A policy per job type (`backstop-job-type`): its jobs are decided by it, with its own breaker, and counted under `policy=<type>`. Keys are job types (1..64 of `[A-Za-z0-9_./-]`).

	@example {send_email: await loadPolicy('critical')}
	*/
	readonly policies?: Readonly<Record<string, Policy>>;

	/** Called after each outcome the broker confirmed. */
	readonly onOutcome?: (outcome: Outcome, job: Job) => unknown;

	/**
	Called with errors the worker survives: a lost connection (it reconnects with backoff), an outcome not applied (kept, and applied when the message comes back).

	@default console.error
	*/
	readonly onError?: (error: unknown, job?: Job) => void;

	/** @default `${hostname}-${pid}-<random>` */
	readonly consumerTag?: string;

	/**
	The handler's deadline, in milliseconds (a whole number >= 1). At it the handler's `signal` aborts with a `TimeoutError` and the attempt fails with it (`handler deadline exceeded after <ms> ms`, error kind `timeout`), decided by the policy and applied as any failure (retried through the delay levels, or dead-lettered); a handler that ignores its signal is not waited for (reported once through `onError`; it runs on). Keep it below the broker's `consumer_timeout` (30 minutes by default on RabbitMQ 3.10), past which the broker closes the channel of a delivery not acked.

	@default 300_000 (5 minutes)
	*/
	readonly handlerTimeoutMs?: number;
}

export interface EnqueueOptions {
	/** The job type (`backstop-job-type`: 1..64 of `[A-Za-z0-9_./-]`), kept through every move. */
	readonly jobType?: string;
	/** The `content_type` property. */
	readonly contentType?: string;
	/**
	The first attempt waits this long in the delay levels (rounded up to whole seconds; never early): at most 30 days (2,592,000,000 ms; longer is refused with a RangeError).

	@default 0
	*/
	readonly delayMs?: number;
	/** Until it aborts, a lost connection is made again and the job published again (at least once). Without it, one attempt. */
	readonly signal?: AbortSignal;
}

export interface ReplayOptions {
	/**
	At most this many dead letters move (1 or more).

	@default 1000
	*/
	readonly limit?: number;
	/** Only dead letters with this reason (1..128 printable ASCII characters; `crash_loop` includes the broker's delivery_limit); '' for any. @default '' */
	readonly reason?: string;
	/** Keep the attempt count and first-enqueued time instead of starting afresh (attempt 1). @default false */
	readonly keepAttempts?: boolean;
	/** Dead letters looked at, at most: limit..max(limit, 100000). @default max(limit, min(100000, 10 × limit)) */
	readonly scan?: number;
	/** Who replays (at most 256 bytes): each dead letter replayed is recorded first in the audit queue `<name>.audit` (its headers with `backstop-audit-action` replay, `-actor`, `-at-ms`; no body), as the Go CLI's `dlq replay` records its own. '' records nothing. @default '' */
	readonly actor?: string;
}

/** Which delayed jobs run() moves: one job id, or those due before a time. */
export type RunOptions =
	| {readonly id: string}
	| {
		/** Unix ms, or a Date: the jobs due at or before it, earliest first per level and per mover. */
		readonly dueBefore: number | Date;
		/** The most moved: 1..10000. */
		readonly limit: number;
	};

/** What run() did. */
export interface Ran {
	/** The jobs published to the queue. */
	readonly moved: number;
	/** Those due before `dueBefore` beyond the limit. */
	readonly left: number;
	/** The movers that did not answer within 5 s (0 when run() resolves). */
	readonly silent: number;
}

/** A dead letter, as inspect() shows it. */
export interface DeadLetter {
	/** The job id; '' for a message that had none (replay leaves it for a person). */
	readonly id: string;
	/** `backstop-reason` (`unroutable`: a delayed job whose work queue was gone, or that a full queue refused 30 times), or `crash_loop` for a message the broker moved at its delivery limit. */
	readonly reason: string;
	readonly error: string;
	readonly attempt: number | null;
	readonly firstEnqueuedMs: number | null;
	readonly deadLetteredMs: number | null;
	readonly jobType: string;
	/** The work queue replay sends it to ('' when missing: this queue). */
	readonly destination: string;
	readonly payload: Buffer;
	readonly contentType: string | undefined;
	/** Every header but `x-delivery-count` (the broker's count of looks). */
	readonly headers: Readonly<Record<string, unknown>>;
}

export interface QueueStats {
	/** Ready messages of the work queue. */
	readonly ready: number;
	/** Consumers of the work queue. */
	readonly consumers: number;
	/** Ready messages of the DLQ. */
	readonly dlq: number;
	/** Ready messages in the shared delay levels (`backstop.hold.L0..L10` and the first topology's `backstop.delay.L0..L17`; not those a worker's mover holds), for every queue of the virtual host: one queue's cannot be counted apart. */
	readonly delayLevels: number;
}

export interface Queue {
	readonly name: string;
	/** `name.dlq`. */
	readonly dlq: string;
	readonly maxDeliveries: number;

	/** Declares the topology (idempotent); enqueue(), replay() and work() do it once per Broker. Rejects when an existing queue has other arguments. */
	declare(): Promise<void>;

	/** Publishes job `id` (attempt 1) and resolves once the broker confirmed it; rejects when the broker refuses it (a negative confirm). */
	enqueue(id: string, payload?: string | Uint8Array, options?: EnqueueOptions): Promise<void>;

	/**
	Consumes until `signal` aborts, applying the policy to each outcome: publish (confirmed), then ack. Reconnects with backoff (100 ms doubling to 5 s) after a lost connection or a broker restart.

	While any `work()` of a Broker runs, its connection also runs the delay mover: it moves the delayed messages of every queue of the virtual host down the levels (`backstop.hold.L<n>`), and returns those it holds to their level when the last `work()` stops.

	@throws When the queue exists with other arguments (PRECONDITION_FAILED): no retry mends that.
	*/
	work(policy: Policy, handler: Handler, options?: WorkOptions): Promise<void>;

	/**
	Moves dead letters back to their work queue only (the default exchange, routing key `backstop-destination`), confirmed before each is acked; resolves to how many moved. Those looked at and not moved stay in the DLQ, and so does a dead letter without a job id.

	@throws A TypeError for an invalid option, before the broker; an error when the broker refuses a replay or the destination queue does not exist (what moved before stays moved).
	*/
	replay(options?: ReplayOptions): Promise<number>;

	/** A peek at up to `n` (0..100000) dead letters, oldest first: all stay in the DLQ, and looking does not use them up (a quorum queue's delivery limit: given back with `basic.nack`, or as fresh copies once one was looked at 10 times). @default 20 */
	inspect(n?: number): Promise<DeadLetter[]>;

	/**
	Moves delayed jobs of this queue to it now, whatever their due time (Cloud Tasks' RunTask; Go's `Queue.Run`, `backstop queue run --amqp.url`; the README's "Run a delayed job now"): from the delay levels' ready messages (at most 100,000 looked at) and from the workers' movers (the `backstop.run` exchange), each published to the queue with its attempt kept and without its due time (confirmed), then acked.

	@example await q.run({id: 'order-42'})
	@example await q.run({dueBefore: Date.now(), limit: 100})
	@throws A TypeError for options that select nothing or two things, or a limit outside 1..10000, before the broker; an error for a queue that does not exist, or when a mover did not answer within 5 s (`err.ran` says what moved).
	*/
	run(options: RunOptions): Promise<Ran>;

	/** Passive declares: declares nothing, and rejects for a queue that does not exist. */
	stats(): Promise<QueueStats>;
}

/** The routing key of a delay through the levels: its seconds, rounded up (at most 2^11 - 1: a longer delay arrives early and is delayed again for the rest), as 18 one-bit words. */
export function delayRoutingKey(delayMs: number): string;

/** The name of delay level `n` (0..17): `backstop.delay.L<n>`, a topic exchange and the first topology's TTL queue. */
export function levelName(n: number): string;

/** The queue of delay level `n` (0..10) the workers' movers hold messages from: `backstop.hold.L<n>`. */
export function holdName(n: number): string;
