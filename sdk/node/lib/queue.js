// backstop-policy/queue: what every broker's worker shares, as Go's queue
// package: the outcome actions and the job-type rule. The brokers sit beside
// it: backstop-policy/redis and backstop-policy/rabbitmq.
import { JOB_TYPE } from './jobtypes.js';

/** What a worker does with a job, on every broker. */
export const ACTIONS = Object.freeze(['ack', 'retry', 'defer', 'dead_letter']);

/** The longest job type, in bytes (each of [A-Za-z0-9_./-]). */
export const MAX_JOB_TYPE_LENGTH = 64;

/** Whether t is a job type every broker accepts: 1..64 of [A-Za-z0-9_./-]. */
export function isJobType(t) {
  return typeof t === 'string' && JOB_TYPE.test(t);
}

// Deprecated: this entry point was the Redis queue at first; its names stay
// here so that no import breaks. Import them from backstop-policy/redis.
export { createQueue, keysFor, scriptSource, sender } from './redis.js';
