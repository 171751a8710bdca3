import type {FailureFields, Policy, Reason} from './index.js';
import type {HandlerContext, JobDecision} from './queue.js';

/**
A Redis client the queue can drive: an ioredis `Redis` or `Cluster` (version 5 or newer), or a node-redis (`redis`) v4+ client from `createClient` or `createCluster`. The client stays yours: the queue never connects, configures or closes it.
*/
export type QueueClient =
	| {call(...args: any[]): Promise<unknown>; evalsha(...args: any[]): unknown}
	| {sendCommand(...args: any[]): Promise<unknown>; evalSha(...args: any[]): unknown};

/**
The Redis keys of one queue. On a Redis Cluster the four must hash to one slot (share a hash tag).
*/
export interface QueueKeys {
	/** Stream of work, with the consumer group. */
	readonly jobs: string;
	/** Sorted set of cold retries, scored by due time (unix ms). */
	readonly delayed: string;
	/** Stream of dead letters. */
	readonly dlq: string;
	/** Hash of counters. */
	readonly stats: string;
}

export interface QueueOptions {
	/**
	The key layout, to drive an existing one.

	@default keysFor(name)
	@example {jobs: 'jobs:main', delayed: 'delayed:retries', dlq: 'jobs:dlq', stats: 'jobs:stats'}
	*/
	readonly keys?: QueueKeys;

	/**
	The consumer group.

	@default 'workers'
	*/
	readonly group?: string;
}

/**
A job as a worker sees it: one delivery of a stream entry.
*/
export interface Job {
	/** The stream entry id: what ack(), retry() and deadLetter() take. */
	readonly entryId: string;
	/** The job's stable id, its idempotency key: the same on every attempt (a plain entry's: its entry id). */
	readonly id: string;
	/** The 1-based number of this execution. It lives in Redis, so it survives crashes. */
	readonly attempt: number;
	/** When the job was first enqueued (unix ms, the server's clock). */
	readonly firstEnqueuedMs: number;
	/** The payload, decoded as UTF-8 (a plain entry without a payload field: its fields JSON, see the README's "Plain producers"). */
	readonly payload: string;
	/** The error of the previous attempt, after a retry. */
	readonly lastError: string;
	/** The previous attempt's retry reason, or after a replay the dead letter reason. */
	readonly lastReason: string;
	/** The delay before this attempt in milliseconds (0 for the first): the decorrelated strategy's input. */
	readonly prevDelayMs: number;
	/** The job type (`''`: untyped), as the entry holds it: one written by someone else may not be a valid type; it runs all the same, counted as `other`. */
	readonly type: string;
	/** An entry with some of the fields id, attempt, first_enqueued_ms but without an id, a valid attempt (digits, 1 or more) or first_enqueued_ms (or a plain entry whose id's time is past 2^53 - 1 ms): apply() dead-letters it with reason `malformed`. */
	readonly malformed: boolean;
	/** Every field of the entry. */
	readonly fields: Readonly<Record<string, string>>;
}

/**
What apply() did with a job. `applied` is false when the entry was no longer pending (another worker moved it first): then nothing changed.
*/
export type Outcome =
	| {readonly action: 'ack'; readonly reason: 'success'; readonly decision: null; readonly applied: boolean}
	| {
		readonly action: 'retry';
		readonly reason: Reason;
		readonly decision: JobDecision;
		readonly applied: boolean;
		/** When the retry is due (unix ms, the server's clock); null when not applied. */
		readonly dueMs: number | null;
	}
	| {
		/** The policy refused the job (an open breaker, an empty budget) and its `on_open` is `defer`: back to the delayed set, its attempt unchanged. */
		readonly action: 'defer';
		readonly reason: 'circuit_open' | 'budget_exhausted';
		/** The decision after a failure; null when the breaker refused the job before it ran. */
		readonly decision: JobDecision | null;
		readonly applied: boolean;
		/** How long the job waits: until the breaker may half-open (`acquire().retryInMs`), or its backoff for the budget. */
		readonly delayMs: number;
		/** When the job is due again (unix ms, the server's clock); null when not applied. */
		readonly dueMs: number | null;
	}
	| {
		readonly action: 'dead_letter';
		/** The decision's reason, or `malformed` (a malformed job, or a failure the policy refused; then `decision` is null). */
		readonly reason: Reason | 'malformed';
		readonly decision: JobDecision | null;
		readonly applied: boolean;
		/** The DLQ entry id; null when not applied. */
		readonly dlqId: string | null;
	};

export interface Ran {
	/** How many delayed jobs moved to the stream: 0 when the id is not in the delayed set. */
	readonly moved: number;
	/** Jobs still due at or before `dueBefore` (beyond `limit`); 0 for `id`. */
	readonly left: number;
}

export type RunOptions = (
	| {
		/** The job id of the delayed job to run now. */
		readonly id: string;
	}
	| {
		/**
		The jobs due at or before this time (a Date or unix ms), earliest first.

		@example new Date()
		*/
		readonly dueBefore: Date | number;
		/**
		At most this many jobs (1..10000).

		@default 100
		*/
		readonly limit?: number;
	}
) & {
	/**
	Who runs them (at most 256 bytes): each job moved is recorded in the audit stream (`{name}:audit`: action `run`, actor, at_ms, id, reason). Absent: nothing recorded.
	*/
	readonly actor?: string;
};

export interface Promoted {
	/** How many due retries moved to the stream. */
	readonly moved: number;
	/** Milliseconds until the next retry is due (0: already due); null when none is left. */
	readonly nextDueMs: number | null;
}

export interface Reclaimed {
	/** Entries delivered `maxDeliveries` times, moved to the DLQ with reason `crash_loop`. */
	readonly deadLettered: number;
	/** The entries now claimed by the consumer, to run. */
	readonly jobs: Job[];
	/**
	Crash loops the DLQ refused (a key of the wrong type, an entry too large for it, Redis out of memory), with why: they stay pending, their delivery count unchanged, and are tried again after `minIdleMs`. Counted in the stats hash as `reclaim_skipped`.
	*/
	readonly skipped: ReadonlyArray<{readonly entryId: string; readonly reason: string}>;
}

export interface QueueStats {
	/** Entries in the stream (pending ones included). */
	readonly jobs: number;
	/** Entries delivered and not yet finished. */
	readonly pending: number;
	readonly delayed: number;
	readonly dlq: number;
	/** The stats hash: `enqueued`, `attempts:success`, `retries:transient`, `dead_letters:permanent_error`, … */
	readonly counters: Readonly<Record<string, number>>;
}

export interface ReadOptions {
	/**
	At most this many jobs.

	@default 16
	*/
	readonly count?: number;

	/**
	Wait up to this many milliseconds for a job when none is there. A blocking read holds the connection: give it a client of its own.

	@default undefined (return at once)
	*/
	readonly blockMs?: number;
}

export interface ReclaimOptions {
	/**
	Take over entries pending for at least this long.

	@default 60_000
	*/
	readonly minIdleMs?: number;

	/**
	At most this many entries (1..1000).

	@default 100
	*/
	readonly count?: number;

	/**
	An entry delivered this many times already is a crash loop: dead-lettered (`crash_loop`) instead of claimed.

	@default 5
	*/
	readonly maxDeliveries?: number;
}

export interface ReplayOptions {
	/**
	At most this many dead letters, moved in batches of 1000. `Infinity` replays them all.

	@default 1000
	*/
	readonly limit?: number;

	/**
	Only dead letters with this reason; `''` for any.

	@default ''
	@example 'crash_loop'
	*/
	readonly reason?: string;

	/**
	Only dead letters of this job type; absent for any.

	@example 'charge_card'
	*/
	readonly type?: string;

	/**
	Who replays (at most 256 bytes): each dead letter replayed is recorded first in the audit stream (`{name}:audit`: action `replay`, actor, at_ms, id, reason, type, dlq_entry), as the Go CLI's `dlq replay` records its own. Absent: nothing recorded.

	@example 'ann@ops1'
	*/
	readonly actor?: string;
}

export interface EnqueueOptions {
	/**
	The job type: 1..64 of `[A-Za-z0-9_./-]`. Its outcomes are counted per type (`t:<type>:…` in the stats hash) and `work({policies})` decides it with that type's policy.

	@default '' (untyped)
	@example 'send_email'
	*/
	readonly type?: string;
}

export interface ApplyOptions {
	/**
	Maps the error to failure fields, as in retry(); `undefined` uses the built-in mapping (`status`, `Retry-After`, Node.js error codes).
	*/
	readonly classify?: (errorOrResponse: unknown) => FailureFields | undefined;

	/**
	The current time for the decision (unix ms).

	@default Date.now()
	*/
	readonly nowMs?: number;

	/**
	The jitter draw in [0, 1).

	@default Math.random()
	*/
	readonly random?: number;
}

/**
Runs one job. Resolving is a success; throwing (or resolving to a failed fetch `Response`) is a failure that the policy decides. `signal` aborts when the worker stops and at the handler's deadline (`handlerTimeoutMs`): pass it to the calls the handler makes.
*/
export type Handler = (job: Job, context: HandlerContext) => unknown;

export interface WorkOptions {
	/**
	A policy per job type: a job whose `type` is a key is acquired, decided and recorded by that policy (its metrics under `policy: <type>`), every other job by work()'s policy. A type's breaker defers that type's jobs without pausing the reads.

	@example {charge_card: await loadPolicy('critical'), render_report: await loadPolicy('batch')}
	*/
	readonly policies?: Readonly<Record<string, Policy>>;

	/** Stops the worker: it stops reading, finishes the jobs it read, applies their outcomes and resolves. Handlers get this signal; one that gives up on it has its error applied like any other failure. */
	readonly signal?: AbortSignal;

	/**
	This worker's name in the consumer group: unique per running worker.

	@default `${os.hostname()}-${process.pid}`
	*/
	readonly consumer?: string;

	/** As in apply(). */
	readonly classify?: ApplyOptions['classify'];

	/**
	Jobs per read.

	@default 16
	*/
	readonly batch?: number;

	/**
	How long a read waits for jobs, in milliseconds: stopping can take this long.

	@default 1000
	*/
	readonly blockMs?: number;

	/**
	How often due retries are promoted (±20%); 0 leaves promoting to others.

	@default 1000
	*/
	readonly promoteEveryMs?: number;

	/**
	Retries per promote call (1..10000); the worker calls again while full batches move.

	@default 500
	*/
	readonly promoteLimit?: number;

	/**
	How often entries of crashed consumers are reclaimed (±20%); 0 turns it off.

	@default 30_000
	*/
	readonly reclaimEveryMs?: number;

	/** @default 60_000 */
	readonly minIdleMs?: number;

	/** @default 5 */
	readonly maxDeliveries?: number;

	/**
	The handler's deadline, in milliseconds (a whole number >= 1). At it the handler's `signal` aborts with a `TimeoutError` and the attempt fails with it (`handler deadline exceeded after <ms> ms`, error kind `timeout`), decided by the policy and applied as any failure; a handler that ignores its signal is not waited for (reported once through `onError`; it runs on). While a handler runs, the worker holds its entry and the batch's (`hold()`, every third of `minIdleMs`), so a worker alive and inside the deadline is never reclaimed.

	@default 5 × minIdleMs (5 minutes with the default minIdleMs; 5 minutes when minIdleMs is 0)
	*/
	readonly handlerTimeoutMs?: number;

	/** Called after each outcome is applied. When Redis refused it first (see `work()`), the outcome also says how many times, as `refusals`. */
	readonly onOutcome?: (outcome: Outcome & {readonly refusals?: number}, job: Job) => unknown;

	/**
	Called with errors that do not stop the worker: Redis unreachable (the worker tries again a second later); the first refusal of an outcome that the worker then keeps sending (see `work()`); an outcome not applied (the entry stays pending and is reclaimed later); each crash loop reclaim could not dead-letter (see `Reclaimed.skipped`), without a job, as an `Error` with the `entryId` and the `reason` the DLQ refused it for.

	@default console.error
	*/
	readonly onError?: (error: unknown, job?: Job) => void;
}

/**
One queue in Redis. Every move between its keys is one atomic script that also acknowledges the entry, so a crash loses nothing, and an outcome is applied at most once.
*/
export interface Queue {
	readonly name: string;
	readonly keys: QueueKeys;
	readonly group: string;

	/** Creates the stream and the consumer group when missing; true when it created the group. */
	ensureGroup(): Promise<boolean>;

	/**
	Adds a job, attempt 1, stamped with the server's clock.

	@param id - The job's stable id: the idempotency key a downstream can deduplicate on.
	@returns The stream entry id.
	*/
	enqueue(id: string, payload?: string | Uint8Array, options?: EnqueueOptions): Promise<string>;

	/** Reads new jobs for `consumer` (XREADGROUP). */
	read(consumer: string, options?: ReadOptions): Promise<Job[]>;

	/**
	Records a success. False when the entry was no longer pending.

	@param entry - A job, or its full stream entry id (`<ms>-<seq>`; anything else is a TypeError, as `retry` and `deadLetter` do).
	*/
	ack(entry: string | Job): Promise<boolean>;

	/**
	Moves a job to the delayed set, due in `delayMs` by the server's clock, attempt + 1.

	@param reason - The decision's reason: `transient`, `retry_after` or `uncertain`.
	@returns The due time (unix ms), or null when the entry was no longer pending.
	@throws When the entry is malformed (dead-letter it with reason `malformed`); it stays pending.
	*/
	retry(entry: string | Job, delayMs: number, reason: string, lastError?: string): Promise<number | null>;

	/**
	Moves a job the policy refused to run back to the delayed set, due in `delayMs` by the server's clock, its attempt count unchanged (a deferral spends no attempt). Counted in `attempts:deferred` and `deferred:<reason>`, apart from retries.

	@param reason - `circuit_open` or `budget_exhausted`; the script refuses others.
	@param lastError - @default '' (keeps the entry's last error)
	@returns The due time (unix ms), or null when the entry was no longer pending.
	@throws When the entry is malformed (dead-letter it with reason `malformed`); it stays pending.
	*/
	defer(entry: string | Job, delayMs: number, reason: string, lastError?: string): Promise<number | null>;

	/**
	Moves a job to the DLQ. Returns the DLQ entry id, or null when the entry was no longer pending.

	@param reason - 1..128 printable ASCII characters without spaces (it names a counter and a metric label); the script refuses others.
	*/
	deadLetter(entry: string | Job, reason: string, lastError?: string): Promise<string | null>;

	/**
	Moves at most `limit` due retries (1..10000) to the stream.

	@param limit - @default 500
	*/
	promote(limit?: number): Promise<Promoted>;

	/**
	Moves delayed jobs to the stream now, before they are due, counted in `force_run` (Cloud Tasks' RunTask). A member that is not a job `retry` wrote moves raw, as `promote` moves it.

	@example await queue.run({ id: 'order-42' })
	@example await queue.run({ dueBefore: new Date(), limit: 500 })
	*/
	run(options: RunOptions): Promise<Ran>;

	/** The server's clock (Redis TIME) in unix ms: the clock the scripts stamp due times and `first_enqueued_ms` with. */
	serverTimeMs(): Promise<number>;

	/** Claims entries crashed consumers left pending for `consumer`; dead-letters crash loops. */
	reclaim(consumer: string, options?: ReclaimOptions): Promise<Reclaimed>;

	/**
	Keeps entries pending to `consumer` from being reclaimed, without delivering them again: their idle time is reset (XCLAIM … JUSTID) and their delivery count left alone. Redis runs it when it refuses ack, retry and dead-letter for lack of memory (maxmemory with noeviction).

	@param entries - At most 1000 entry ids or jobs.
	@returns Per entry, whether `consumer` holds it: false when it is pending to another consumer (left alone) or no longer pending.
	*/
	hold(consumer: string, entries: ReadonlyArray<string | Job>): Promise<boolean[]>;

	/** Moves dead letters back to the stream, attempt reset to 1. Returns how many moved. */
	replay(options?: ReplayOptions): Promise<number>;

	/** Sizes, read live, and counters. */
	stats(): Promise<QueueStats>;

	/**
	Applies the outcome of running `job`. `error` is what it threw, or a failed fetch Response; null or undefined is a success (acked, and reported to the policy's budget and breaker).

	A failure is classified as retry() classifies it (a RetryError, a retry() in the handler that gave up, by its last failure, marked `retriedDownstream` unless it is `circuit_open`: the default policy dead-letters it with `retried_downstream`) and decided with the job's attempt, its id as the idempotency key, the time since its first enqueue and its previous delay; a retry goes to the delayed set after the decided delay; `circuit_open` and `budget_exhausted` defer the job (`defer()`: until the breaker may half-open, or after its backoff) unless the policy's `onOpen` is `dead_letter`; anything else goes to the DLQ with the decision's reason. A malformed job, and a failure the policy refuses, go to the DLQ as `malformed`.

	@example
	```
	for (const job of await queue.read('worker-1', {blockMs: 1000})) {
		let error = null;
		try {
			await handle(job);
		} catch (err) {
			error = err;
		}
		await queue.apply(job, error, policy);
	}
	```
	*/
	apply(job: Job, error: unknown, policy: Policy, options?: ApplyOptions): Promise<Outcome>;

	/**
	Consumes the queue until `signal` aborts: reads jobs, runs `handler` one at a time and applies each outcome, promotes due retries and reclaims entries of crashed consumers. A malformed job is dead-lettered without running the handler.

	Before each job the worker asks the policy's breaker (`policy.acquire()`): refused, the handler does not run, the job is deferred (or dead-lettered as `circuit_open` when `policy.onOpen` is `dead_letter`), and the worker reads nothing until `retryInMs` has passed (abortable; promoting and reclaiming go on). In half-open only the admitted trials run. XREADGROUP blocks the connection: give the worker a client of its own (`client.duplicate()`), one per concurrent worker.

	When Redis refuses to apply an outcome for a while (out of memory with noeviction, a read-only replica during a failover, a server loading or busy, a lost connection), the worker keeps the outcome, decided once, and sends it again with jittered backoff (20 ms doubling to at most 2 s and a quarter of `minIdleMs`) until Redis takes it or the entry is no longer pending. Meanwhile it holds the job and the jobs read with it (`hold()`), so that reclaim does not run them a second time elsewhere, and reads nothing new. Aborted meanwhile, it makes one last attempt and reports the outcome not applied (`onError`): the entry stays pending, for reclaim. A request Redis rejects as such (bad arguments, a key of the wrong type) is reported and not sent again. A job that waited in its batch for half of `minIdleMs` is held again before it runs, and skipped when another consumer took it meanwhile.

	@returns Resolves once stopped, every outcome applied. Rejects only when the group cannot be created at start.
	*/
	work(policy: Policy, handler: Handler, options?: WorkOptions): Promise<void>;
}

/**
Returns the queue called `name` over `client`.

@example
```
import {Redis} from 'ioredis';
import {loadPolicy} from 'backstop-policy';
import {createQueue} from 'backstop-policy/redis';

const queue = createQueue(new Redis(), 'orders');
await queue.enqueue('order-42', JSON.stringify({sku: 7}));
```
*/
export function createQueue(client: QueueClient, name: string, options?: QueueOptions): Queue;

/** The default keys of queue `name`: `{name}:jobs`, `{name}:delayed`, `{name}:dlq`, `{name}:stats`: one hash tag, for Redis Cluster. */
export function keysFor(name: string): QueueKeys;

/** The Lua source of one of the contract's scripts as sent to Redis: the package's `scripts/lib.lua` (the helpers the scripts share), a newline, then `scripts/<name>.lua`. */
export function scriptSource(name: 'enqueue' | 'ack' | 'retry' | 'defer' | 'dead_letter' | 'promote' | 'reclaim' | 'replay' | 'hold'): string;
