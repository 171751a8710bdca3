// The queue families of the RabbitMQ worker (backstop_attempts_total, …):
// what the broker cannot count itself, counted by the workers with the
// names and labels of Go's internal/queuemetrics.
import { JOB_TYPE } from '../jobtypes.js';
import { registerFamilies } from '../metrics.js';

// The attempt histogram's bounds, as the exporter's backstop_job_attempts.
const ATTEMPT_BUCKETS = [1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50];
// Go's internal/queuemetrics families: names, help, labels (queue, job_type
// first) and buckets.
const QUEUE_FAMILIES = [
  ['attempts', 'Counter', 'backstop_attempts_total',
    'Attempts by outcome (success, retry, dead_letter; deferred: a job the breaker or the budget refused, its attempt not spent), counted by the workers.', ['outcome']],
  ['retries', 'Counter', 'backstop_retries_total', "Retries scheduled, by the policy's reason.", ['reason']],
  ['deferrals', 'Counter', 'backstop_deferrals_total',
    'Jobs deferred without spending an attempt, by reason (circuit_open, budget_exhausted).', ['reason']],
  ['deadLetters', 'Counter', 'backstop_dead_letters_total', 'Jobs dead-lettered, by reason.', ['reason']],
  ['maxAttempts', 'Counter', 'backstop_max_attempts_reached_total', 'Jobs dead-lettered because they used up their attempts.', []],
  ['finished', 'Histogram', 'backstop_job_attempts', 'The attempt on which each job finished, by outcome (success, dead_letter).', ['outcome']],
];
// How many job types a queue labels by name; the others are "other" (as Go's
// internal/queuemetrics and the Redis stats hash).
const TYPE_LIMIT = 50;
const queueRegistries = new WeakMap(); // registry → {fam, recorders: queue → recorder}

// The recorder of queue on registry: the queue families, registered once
// per registry (reused when another copy of this package registered the
// same), and the job types it labels by name, shared by the queue's workers.
export function queueRecorder(promClient, registry, queue) {
  let reg = queueRegistries.get(registry);
  if (!reg) {
    const fam = registerFamilies(promClient, registry, QUEUE_FAMILIES, ['queue', 'job_type'], ATTEMPT_BUCKETS, 'rabbitmq work');
    reg = { fam, recorders: new Map() };
    queueRegistries.set(registry, reg);
  }
  let r = reg.recorders.get(queue);
  if (!r) {
    r = { fam: reg.fam, queue, types: new Set() };
    reg.recorders.set(queue, r);
  }
  return r;
}

// The job_type label of t: '' untyped, t for the first TYPE_LIMIT valid
// types of the queue, else "other".
function typeLabel(r, t) {
  if (t === '') return '';
  if (!JOB_TYPE.test(t)) return 'other';
  if (r.types.has(t)) return t;
  if (r.types.size >= TYPE_LIMIT) return 'other';
  r.types.add(t);
  return t;
}

// Counts an applied plan (not an early message) in the queue families.
export function countQueue(r, job, plan) {
  if (plan.action === 'early') return;
  const fam = r.fam;
  const labels = { queue: r.queue, job_type: typeLabel(r, job.jobType) };
  if (plan.action === 'ack') {
    fam.attempts.inc({ ...labels, outcome: 'success' });
    fam.finished.observe({ ...labels, outcome: 'success' }, job.attempt);
  } else if (plan.action === 'retry') {
    fam.attempts.inc({ ...labels, outcome: 'retry' });
    fam.retries.inc({ ...labels, reason: plan.reason });
  } else if (plan.action === 'defer') {
    fam.attempts.inc({ ...labels, outcome: 'deferred' });
    fam.deferrals.inc({ ...labels, reason: plan.reason });
  } else if (plan.action === 'dead_letter') {
    fam.attempts.inc({ ...labels, outcome: 'dead_letter' });
    fam.deadLetters.inc({ ...labels, reason: plan.reason });
    if (plan.reason === 'max_attempts_reached') fam.maxAttempts.inc(labels);
    // A malformed message (a due time past the bound too) is not observed.
    if (job.attempt >= 1 && !job.malformed && plan.reason !== 'malformed') fam.finished.observe({ ...labels, outcome: 'dead_letter' }, job.attempt);
  }
}
