// retry(): run a function until it succeeds or the policy says stop.
import { readFileSync } from 'node:fs';
import { after, startDeadline } from './deadline.js';
import { RetryError } from './errors.js';
import { attemptHeaderSetter, isHeaderTarget, NO_RETRY_HEADER, OVERLOADED_HEADER, recordGaveUp } from './layers.js';
import { loadPolicy } from './host/policy.js';
import { readBundledWasm } from './host/wasm-file.js';

// Presets have no budget or breaker, so one shared handle per name is the
// same as a fresh one per call, and cheaper.
const presets = new Map();

// Node.js and undici error codes → backstop error kinds: the "codes" of
// errorkinds.json (contract/errorkinds.json, copied into the package), the one
// table every language reads; error-kinds.test.js checks each row.
const ERROR_KINDS = Object.freeze(
  JSON.parse(readFileSync(new URL('../errorkinds.json', import.meta.url), 'utf8')).codes,
);

export async function retry(fn, options = {}) {
  if (typeof fn !== 'function') throw new TypeError('Expected `fn` to be a function');
  if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
  const { signal, onRetry, method, idempotencyKey, classify, metrics, headers, reraise } = options;
  if (signal !== undefined && !(signal && typeof signal.aborted === 'boolean' && typeof signal.addEventListener === 'function')) {
    throw new TypeError('Expected `signal` to be an AbortSignal');
  }
  if (onRetry !== undefined && typeof onRetry !== 'function') throw new TypeError('Expected `onRetry` to be a function');
  if (classify !== undefined && typeof classify !== 'function') throw new TypeError('Expected `classify` to be a function');
  if (metrics !== undefined && typeof metrics?.attempt !== 'function') {
    throw new TypeError('Expected `metrics` to be the result of createMetrics()');
  }
  if (method !== undefined && typeof method !== 'string') throw new TypeError('Expected `method` to be a string');
  if (idempotencyKey !== undefined && typeof idempotencyKey !== 'string') {
    throw new TypeError('Expected `idempotencyKey` to be a string');
  }
  if (reraise !== undefined && typeof reraise !== 'boolean') throw new TypeError('Expected `reraise` to be a boolean');
  if (headers !== undefined && !isHeaderTarget(headers)) {
    throw new TypeError('Expected `headers` to be a Headers or a plain object');
  }
  // Before the first attempt: a header the caller set is left alone.
  const setAttempt = headers === undefined ? undefined : attemptHeaderSetter(headers);
  const policy = await resolvePolicy(options.policy ?? 'default');

  const start = performance.now();
  // The breaker is asked before each call (a policy without one allows all).
  const guarded = policy.stateful === true && typeof policy.acquire === 'function';
  // The policy's attempt_timeout (and what max_elapsed leaves) bounds each attempt.
  const timed = typeof policy.attemptTimeout === 'function';
  const measured = guarded && typeof policy.recordDuration === 'function';
  let prevDelayMs = 0;
  let failedAt = -1; // Date.now() of the last failure, when a retry follows it
  try {
    for (let attempt = 1; ; attempt++) {
      signal?.throwIfAborted();
      if (guarded) {
        const permit = policy.acquire();
        metrics?.state(permit.state);
        if (!permit.allowed) {
          metrics?.refused('circuit_open');
          const cause = new Error(`the circuit breaker refused the call; it may admit one in ${permit.retryInMs} ms`);
          const err = new RetryError({ reason: 'circuit_open', attempts: attempt - 1, cause });
          err.retryInMs = permit.retryInMs;
          recordGaveUp(err.reason);
          throw err;
        }
      }
      // The measured latency of this retry: its delay plus however late
      // the sleep returned (the decided delay is in metrics.retry).
      if (failedAt >= 0) metrics?.latency(Date.now() - failedAt);
      setAttempt?.(attempt);
      let error;
      let response;
      const timeoutMs = timed ? policy.attemptTimeout(performance.now() - start) : 0;
      const called = performance.now();
      const deadline = timeoutMs > 0 ? startDeadline(timeoutMs, `attempt ${attempt} timed out after ${timeoutMs} ms`, signal) : null;
      try {
        // fn gets a signal that aborts at the attempt's deadline, and is
        // not waited for past it (it may ignore the signal).
        const result = deadline
          ? await Promise.race([fn(attempt, deadline.context), deadline.expired])
          : await fn(attempt, { signal });
        if (!isFailedResponse(result)) {
          if (measured) policy.recordDuration(performance.now() - called);
          policy.recordSuccess();
          if (metrics) {
            metrics.attempt('success');
            if (guarded) observe(metrics, policy);
          }
          return result;
        }
        response = result;
      } catch (err) {
        // An abort is the caller's decision, never a failure to retry.
        if (signal?.aborted || err?.name === 'AbortError') throw err;
        error = err;
      } finally {
        deadline?.clear();
      }
      // The call's duration (monotonic), failed as it is, for the
      // breaker's slow-call rate.
      if (measured) policy.recordDuration(performance.now() - called);
      const failure = failureOf(response ?? error, classify);
      failedAt = Date.now();
      // Set fields one by one: an object spread here costs more than the decision.
      failure.attempt = attempt;
      failure.elapsedMs = performance.now() - start;
      failure.prevDelayMs = prevDelayMs;
      if (method !== undefined && failure.method === undefined) failure.method = method;
      if (idempotencyKey !== undefined && failure.idempotencyKey === undefined && failure.idempotency_key === undefined) {
        failure.idempotencyKey = idempotencyKey;
      }
      const decision = policy.decide(failure);
      if (metrics) {
        metrics.attempt(decision.action === 'retry' ? 'retry' : 'dead_letter');
        if (guarded) observe(metrics, policy);
        if (decision.action === 'retry') metrics.retry(decision.reason, decision.delayMs);
      }
      if (decision.action !== 'retry') {
        recordGaveUp(decision.reason);
        // reraise: the attempt's own error, as p-retry gives it; a failed
        // Response threw nothing, so it stays in the RetryError.
        if (reraise && response === undefined) throw error;
        throw new RetryError({ reason: decision.reason, attempts: attempt, cause: error, response, decision });
      }
      // Free the connection of a response that nobody will read.
      await response?.body?.cancel?.().catch(() => {});
      await onRetry?.({ attempt, error, response, decision, delayMs: decision.delayMs });
      if (decision.delayMs > 0) await sleep(decision.delayMs, signal);
      prevDelayMs = decision.delayMs;
    }
  } finally {
    setAttempt?.clear();
  }
}

async function resolvePolicy(p) {
  if (typeof p === 'string') {
    let loaded = presets.get(p);
    if (!loaded) {
      loaded = loadPolicy(p, {}, readBundledWasm);
      presets.set(p, loaded);
      loaded.catch(() => presets.delete(p));
    }
    return loaded;
  }
  if (p && typeof p.decide === 'function' && typeof p.recordSuccess === 'function') return p;
  throw new TypeError('Expected `policy` to be a Policy from loadPolicy() or a preset name');
}

// A fresh object with the failure fields of x, from classify or describe.
// The queue workers (lib/outcome.js) classify a job's error the same way.
//
// A RetryError is a retry() below (a nested loop, or the one inside a
// queue job's handler) giving up: its last failure (its response, else its
// cause) is classified, and marked retriedDownstream so that this layer
// gives up too (retry at one layer, docs/layers.md). A circuit_open one,
// refused by its breaker before it made a call, retried nothing: it is
// classified by what it says, unmarked.
export function failureOf(x, classify) {
  if (!isRetryError(x)) return fieldsOf(x, classify);
  const fields = failureOf(x.response ?? x.cause, classify);
  if (x.reason !== 'circuit_open') {
    delete fields.retried_downstream;
    fields.retriedDownstream = true;
  }
  return fields;
}

function isRetryError(x) {
  return x instanceof RetryError || (x instanceof Error && x.name === 'RetryError' && typeof x.reason === 'string');
}

function fieldsOf(x, classify) {
  const fields = classify?.(x);
  if (fields === undefined || fields === null) return describe(x);
  if (typeof fields !== 'object') throw new TypeError('Expected `classify` to return an object or undefined');
  return Object.assign({}, fields);
}

export function isFailedResponse(r) {
  return (
    r !== null && typeof r === 'object' && r.ok === false && typeof r.status === 'number' && r.status >= 400 &&
    typeof r.headers?.get === 'function'
  );
}

/**
 * The failure fields of a failed fetch Response or a thrown error: HTTP
 * status and Retry-After (fetch, axios, got, …), the signals of a layer
 * below (Backstop-No-Retry: it retried and gave up; X-Envoy-Overloaded: do
 * not retry), timeouts and Node.js network error codes.
 */
function describe(x) {
  if (x === null || typeof x !== 'object') return {};
  if (isFailedResponse(x)) return signals({ httpStatus: x.status, retryAfter: x.headers.get('retry-after') ?? undefined }, x.headers);
  const res = x.response;
  const status = x.status ?? x.statusCode ?? res?.status ?? res?.statusCode;
  if (Number.isInteger(status) && status >= 400 && status <= 599) {
    const headers = res?.headers ?? x.headers;
    return signals({ httpStatus: status, retryAfter: header(headers, 'retry-after') }, headers);
  }
  if (x.name === 'TimeoutError') return { errorKind: 'timeout' };
  const kind = ERROR_KINDS[x.code] ?? ERROR_KINDS[x.cause?.code];
  return kind ? { errorKind: kind } : {};
}

function header(headers, name) {
  const v = rawHeader(headers, name);
  return typeof v === 'string' || typeof v === 'number' ? v : undefined;
}

function rawHeader(headers, name) {
  if (!headers || typeof headers !== 'object') return undefined;
  return typeof headers.get === 'function' ? headers.get(name) : headers[name];
}

// A header with a value: an empty one is absent, as Go's Header.Get reads it.
function present(headers, name) {
  const v = rawHeader(headers, name);
  return v !== undefined && v !== null && v !== '' && !(Array.isArray(v) && v.length === 0);
}

// fields with the response signals of headers, those that are set.
function signals(fields, headers) {
  if (present(headers, NO_RETRY_HEADER)) fields.retriedDownstream = true;
  if (present(headers, OVERLOADED_HEADER)) fields.serverDeclined = true;
  return fields;
}

// Waits ms, or rejects with the signal's reason as soon as it aborts.
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      cancel();
      reject(signal.reason);
    };
    const cancel = after(ms, () => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    });
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

// The breaker's state and the budget left, after each outcome.
function observe(metrics, policy) {
  metrics.state(policy.circuitState());
  if (typeof policy.budgetTokens === 'function') metrics.budget(policy.budgetTokens());
}
