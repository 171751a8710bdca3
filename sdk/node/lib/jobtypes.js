// Job types (issue 16), shared by the queue modules (queue.js, rabbitmq.js)
// and the Runner (runner.js): what a type may be, and work()'s policies option.
import { show } from './args.js';
import { createMetrics, metricsOrigin } from './metrics.js';
import { checkPolicy } from './outcome.js';

// work()'s policies option: job type → {policy, metrics}, each checked; the
// metrics of a type's policy are the worker's families with policy=<type>.
export function typedPolicies(policies, metrics) {
  const typed = new Map();
  if (policies === undefined) return typed;
  if (policies === null || typeof policies !== 'object') {
    throw new TypeError('Expected `policies` to be an object of job type → policy');
  }
  for (const [type, p] of Object.entries(policies)) {
    checkJobType('policies key', type);
    try {
      checkPolicy(p);
    } catch (err) {
      throw new TypeError(`Expected \`policies.${type}\` to be a policy: ${err.message}`);
    }
    // Metrics made elsewhere than createMetrics() record every type alike.
    let m = metrics;
    const origin = metrics === undefined ? undefined : metricsOrigin(metrics);
    if (origin !== undefined) {
      m = createMetrics(origin.promClient, { policy: type, target: metrics.target, registry: origin.registry });
    }
    typed.set(type, { policy: p, metrics: m });
  }
  return typed;
}

// A job type: 1..64 bytes of [A-Za-z0-9_./-] (no ':', which separates the
// stats fields t:<type>:<counter>), as enqueue.lua checks it.
export const JOB_TYPE = /^[A-Za-z0-9_./-]{1,64}$/;
export function checkJobType(name, v) {
  if (typeof v !== 'string' || !JOB_TYPE.test(v)) {
    throw new TypeError(`Expected \`${name}\` to be a job type: 1..64 of [A-Za-z0-9_./-] (got ${show(v)})`);
  }
}
