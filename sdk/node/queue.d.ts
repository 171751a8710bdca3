/**
What every broker's worker shares, as Go's `queue` package: the outcome actions, the handler's context and the job-type rule. The brokers sit beside it: `backstop-policy/redis` and `backstop-policy/rabbitmq`.

At first this entry point was the Redis queue: its names are still exported here, deprecated; import them from `backstop-policy/redis`.
*/

/** What a worker does with a job, on every broker: ack a success, retry a failure after a delay, defer a job the breaker or the budget refused (its attempt not spent), or dead-letter it. */
export type Action = 'ack' | 'retry' | 'defer' | 'dead_letter';

/** Every `Action`, in that order. */
export const ACTIONS: readonly Action[];

/** The longest job type. */
export const MAX_JOB_TYPE_LENGTH: 64;

/**
Whether `t` is a job type every broker accepts: 1..64 of `[A-Za-z0-9_./-]` (no `:`).

@example
```
isJobType('charge_card'); //=> true
```
*/
export function isJobType(t: unknown): t is string;

/** The policy's answer to a job's failure, as the core's outcome carries it: a retry with its delay, or a dead letter (a deferral's too) with its reason and the failure's class. */
export interface JobDecision {
	readonly action: DecisionAction;
	readonly reason: Reason;
	/** The failure's class, as the policy decided it. */
	readonly class: FailureClass;
	/** A retry's delay, a deferral's wait; 0 for a dead letter. */
	readonly delayMs: number;
}

/** What a handler gets besides its job, on every broker. */
export interface HandlerContext {
	/** Aborts when the worker stops and at the handler's deadline (`handlerTimeoutMs`): pass it to the calls the handler makes. */
	readonly signal: AbortSignal;
}

import type {DecisionAction, FailureClass, Reason} from './index.js';
import * as redis from './redis.js';

/** @deprecated Import `createQueue` from `backstop-policy/redis`. */
export const createQueue: typeof redis.createQueue;
/** @deprecated Import `keysFor` from `backstop-policy/redis`. */
export const keysFor: typeof redis.keysFor;
/** @deprecated Import `scriptSource` from `backstop-policy/redis`. */
export const scriptSource: typeof redis.scriptSource;
/** @deprecated Import these types from `backstop-policy/redis`. */
export type {
	ApplyOptions, EnqueueOptions, Handler, Job, Outcome, Promoted, Queue, QueueClient, QueueKeys, QueueOptions,
	QueueStats, Ran, ReadOptions, ReclaimOptions, Reclaimed, ReplayOptions, RunOptions, WorkOptions,
} from './redis.js';
