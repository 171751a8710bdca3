// What the shared case files (testdata/queue, testdata/rabbitmq) have in
// common for the Node tests that replay them: the failure a case's handler
// throws, the fields a spy reports, canonical JSON and times as offsets.
// (Outside test/ so that `node --test` does not take it for a test file.)

import { RetryError } from '../index.js';
import { runHandler } from '../lib/runner.js';

/**
 * The case's failure fields and their names in a Node failure; a spy
 * reports them, and the two flags the worker adds (retry at one layer).
 */
export const FIELDS = [['http_status', 'httpStatus'], ['grpc_code', 'grpcCode'], ['error_kind', 'errorKind'], ['retry_after', 'retryAfter'], ['method', 'method'],
  ['retried_downstream', 'retriedDownstream'], ['server_declined', 'serverDeclined']];

// Node's own error of a kind (errorkinds.json: its code), with the case's text.
const NATIVE_CODES = {
  connection_refused: 'ECONNREFUSED', connection_reset: 'ECONNRESET', connect_timeout: 'UND_ERR_CONNECT_TIMEOUT',
  timeout: 'ETIMEDOUT', dns_temporary: 'EAI_AGAIN', dns_not_found: 'ENOTFOUND',
};

/**
 * The failure a case's handler throws: classified by its fields (through
 * classify), or a native error left to the built-in classification. With
 * inner_retry (a reason), Node's own RetryError of an inner retry() that
 * gave up with that reason, whose cause is that failure; its text
 * (errorText) is the case's message, as the other errors' is.
 */
export function caseError(spec) {
  if (spec.inner_retry !== undefined) {
    const { inner_retry: reason, ...rest } = spec;
    const cause = caseError(rest);
    const e = new RetryError({ reason, attempts: reason === 'circuit_open' ? 0 : 1, cause });
    e.name = 'Error';
    e.message = spec.message;
    return e;
  }
  if (spec.native) return Object.assign(new Error(spec.message), { code: NATIVE_CODES[spec.native] });
  const e = new Error(spec.message);
  e.caseFields = {};
  for (const [k, f] of FIELDS) if (spec[k]) e.caseFields[f] = spec[k];
  return e;
}

/**
 * The error a worker makes at a handler's deadline of ms (runHandler, as
 * work() runs it), for the `deadline` cases: a handler that never returns.
 */
export function deadlineError(ms) {
  return runHandler(() => new Promise(() => {}), {}, undefined, ms, () => {});
}

/** The classify hook of caseError's errors. */
export const classify = (e) => e.caseFields;

/** JSON with object keys sorted, as Go and Python write it. */
export function canonical(v) {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v !== null && typeof v === 'object') {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(',')}}`;
  }
  return JSON.stringify(v);
}

const MS = /\b[0-9]{13}\b/g;

/**
 * Each 13-digit number v of s becomes {now+d} for the smallest known offset
 * d with base <= v - d <= end (left as it is when none fits).
 */
export function timesAsOffsets(s, base, end, known) {
  const offs = [...known].sort((a, b) => a - b);
  return s.replace(MS, (v) => {
    const n = Number(v);
    const d = offs.find((o) => n - o >= base && n - o <= end);
    if (d === undefined) return v;
    return d === 0 ? '{now}' : `{now${d > 0 ? '+' : ''}${d}}`;
  });
}
