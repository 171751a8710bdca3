// What lib/idempotency.js (the store, the node:http middleware, once) and
// lib/idempotency-fastify.js (the Fastify plugin) both use: the key rules,
// the request hash, the replay header, which statuses release a key and
// which headers of a response are stored, named as Go names them, and what
// a request gets instead of a run (claimAnswer). It
// imports no other module of the package, so the two depend on it and never
// on each other.
import { createHash } from 'node:crypto';
import { validateHeaderName, validateHeaderValue } from 'node:http';

export const MAX_KEY_LENGTH = 255;
export const REPLAYED_HEADER = 'Idempotent-Replayed';

/** Why key cannot be an idempotency key, thrown as a TypeError: 1..255 printable ASCII characters. */
export function checkKey(key) {
  if (typeof key !== 'string' || key === '') throw new TypeError('Expected the idempotency key to be a non-empty string');
  if (key.length > MAX_KEY_LENGTH) {
    throw new TypeError(`Expected the idempotency key to be at most ${MAX_KEY_LENGTH} bytes (got ${key.length})`);
  }
  if (!/^[\x20-\x7e]+$/.test(key)) throw new TypeError('Expected the idempotency key to be printable ASCII');
}

/** SHA-256 (hex) of method, "\n", path, "\n", body: the request hash every adapter stores. */
export function fingerprint(method, path, body) {
  return createHash('sha256').update(`${method}\n`).update(path).update('\n').update(body ?? '').digest('hex');
}

/**
 * The request hash of a request-target as it arrived (Express's originalUrl, Fastify's url):
 * its path before any "?", every %XX escape decoded to its byte, as Go's r.URL.Path, so every
 * adapter hashes a request alike (testdata/idempotency/requests.json).
 */
export function requestHash(method, target, body) {
  return fingerprint(method, decodePath(target.split('?')[0]), body);
}

const HEX = /^[0-9a-fA-F]{2}$/;

/** path's %XX escapes as bytes (a "%" not followed by two hex digits stays as it is). */
export function decodePath(path) {
  if (!path.includes('%')) return path;
  const bytes = [];
  const raw = Buffer.from(path, 'utf8');
  for (let i = 0; i < raw.length; i++) {
    const hex = raw[i] === 0x25 ? raw.subarray(i + 1, i + 3).toString('latin1') : '';
    if (HEX.test(hex)) {
      bytes.push(parseInt(hex, 16));
      i += 2;
    } else {
      bytes.push(raw[i]);
    }
  }
  return Buffer.from(bytes);
}

/** Whether a response status releases the key (the policy's retryable statuses) instead of being stored. */
export function defaultRelease(status) {
  return [408, 429, 502, 503, 504].includes(status);
}

// Content-Type, as Go's http.CanonicalHeaderKey writes it, so every adapter stores the same names.
export function canonical(name) {
  return name.toLowerCase().replace(/(^|-)([a-z])/g, (_, d, c) => d + c.toUpperCase());
}

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const blank = (c) => c === 0x20 || c === 0x09;

/**
 * value as every adapter stores and replays it, or undefined when a header
 * called name may not be stored at all: the rule Go's idempotency.SafeHeader
 * and Python's _safe_header apply too (docs/idempotency.md, "Stored
 * headers"). A name that is not an RFC 9110 token is refused; value is
 * UTF-8-encoded, spaces and tabs trimmed at both ends, and each byte outside
 * 0x21-0x7E written %XX (uppercase hex), except a single space or tab
 * between two other bytes: '/orders/€42' → '/orders/%E2%82%AC42'.
 * Visible ASCII is unchanged, so the rule applied twice gives the same value.
 */
export function safeHeader(name, value) {
  if (typeof name !== 'string' || !TOKEN.test(name)) return undefined;
  const b = Buffer.from(String(value), 'utf8');
  let start = 0;
  let end = b.length;
  while (start < end && blank(b[start])) start++;
  while (end > start && blank(b[end - 1])) end--;
  let out = '';
  for (let i = start; i < end; i++) {
    const c = b[i];
    if ((c >= 0x21 && c <= 0x7e) || (blank(c) && !blank(b[i - 1]) && !blank(b[i + 1]))) out += String.fromCharCode(c);
    else out += `%${c.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return out;
}

/** headers ({name: [values]}) through safeHeader; each name it drops is given to dropped. */
export function safeHeaders(headers, dropped = () => {}) {
  const out = {};
  for (const [name, values] of Object.entries(headers ?? {})) {
    if (safeHeader(name, '') === undefined) {
      dropped(name);
      continue;
    }
    out[name] = (Array.isArray(values) ? values : [values]).map((v) => safeHeader(name, v));
  }
  return out;
}

/**
 * Sets each of headers on a response through set(name, value), skipping
 * (and telling skipped of) any the HTTP server still refuses: a replay never
 * crashes on a stored header.
 */
export function setHeaders(headers, set, skipped) {
  for (const [name, value] of Object.entries(headers)) {
    const v = Array.isArray(value) && value.length === 1 ? value[0] : value;
    try {
      validateHeaderName(name);
      for (const one of Array.isArray(v) ? v : [v]) validateHeaderValue(name, one);
      set(name, v);
    } catch (err) {
      skipped(name, err);
    }
  }
}

/** The headers a store keeps of a response: each of names that get(name) has, as canonical() writes it → its values. */
export function storedHeaderValues(names, get) {
  const headers = {};
  for (const name of names) {
    const v = get(name);
    if (v !== undefined) headers[canonical(name)] = (Array.isArray(v) ? v : [v]).map(String);
  }
  return headers;
}

/**
 * What a request gets for claim (store.begin()) instead of running its
 * handler: {status, headers, body}, each answer counted in m.requests; null
 * for a first run (counted too), whose handler runs. header is the key's
 * header name, as the answers name it.
 */
export function claimAnswer(claim, header, m) {
  const text = { 'content-type': 'text/plain' };
  if (claim.state === 'conflict') {
    m.requests.conflict++;
    return { status: 422, headers: text, body: `${header} was used with a different request\n` };
  }
  if (claim.state === 'in_progress') {
    m.requests.in_progress++;
    return {
      status: 409, headers: { ...text, 'retry-after': String(claim.retryAfterS) },
      body: `a request with this ${header} is in progress\n`,
    };
  }
  if (claim.state === 'completed') {
    const r = claim.response;
    if (r.tooLarge) {
      m.requests.too_large++;
      return {
        status: 500, headers: { ...text, [REPLAYED_HEADER]: 'true' },
        body: 'idempotency: the first response to this key was too large to store; it cannot be replayed\n',
      };
    }
    m.requests.replayed++;
    return { status: r.status, headers: { ...r.headers, [REPLAYED_HEADER]: 'true' }, body: r.body };
  }
  m.requests.first_run++;
  return null;
}

/** The longest a client still there waits for the first store call after its handler (Go: each attempt's timeout). */
export const ANSWER_WITHIN_MS = 5000;

/**
 * Runs call (an owner's complete or fail, after its handler ran) at once
 * and, when that fails for any reason but a lost lease, again in the
 * background: 10 ms doubling (at most 1 s), jittered, while the owner's lease
 * lasts (until, unix ms). The store counts each failure; log(message, fields)
 * tells of the first failure and of how the retries ended. Returns
 * {first, done}: first resolves when the first attempt is over, whatever it
 * gave, or after ANSWER_WITHIN_MS (the time to answer a client still
 * there); done resolves when the call succeeded and rejects with the last
 * error when it did not (the key may run again once the lease is over).
 */
export function settle(call, { op, key, until, log }) {
  const attempt = () => Promise.resolve().then(call).then(() => null, (err) => err);
  const firstAttempt = attempt();
  // A store that hangs (a client queueing commands while it reconnects)
  // holds a waiting client ANSWER_WITHIN_MS at most; the attempt goes on.
  let timer;
  const first = Promise.race([firstAttempt, new Promise((resolve) => { timer = setTimeout(resolve, ANSWER_WITHIN_MS); })])
    .finally(() => clearTimeout(timer));
  const lost = (err) => err?.name === 'LeaseLostError';
  const done = firstAttempt.then(async (err) => {
    if (err === null) return;
    const fields = (e, more) => ({ op, key, ...more, error: String(e?.message ?? e) });
    if (lost(err)) {
      log('store call refused: the lease was lost', fields(err));
      throw err;
    }
    log('store call failed after the handler ran; retrying while the lease lasts', fields(err));
    let attempts = 1;
    for (let delay = 10; ; delay = Math.min(delay * 2, 1000)) {
      const wait = delay / 2 + (Math.random() * delay) / 2;
      if (!(Date.now() + wait < until)) break; // an until that is not a number (a store without leaseMs) retries nothing
      await new Promise((resolve) => setTimeout(resolve, wait));
      err = await attempt();
      attempts++;
      if (err === null) {
        log('store call succeeded after retries', { op, key, attempts });
        return;
      }
      if (lost(err)) {
        log('store call refused: the lease was lost', fields(err, { attempts }));
        throw err;
      }
    }
    log('store call still failing when the lease ended: the key may run again', fields(err, { attempts }));
    throw err;
  });
  done.catch(() => {}); // a caller answering a client does not wait for it
  return { first, done };
}

/** The caller no longer owns its key: the lease ran out and another request took it over, or the record expired. */
export class LeaseLostError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'LeaseLostError';
  }
}

/** The store could not be reached or refused the call. */
export class StoreError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'StoreError';
  }
}

const OUTCOMES = ['first_run', 'replayed', 'in_progress', 'conflict', 'too_large'];
const OPERATIONS = ['begin', 'complete', 'fail'];

/**
 * Counters with the names the Go and Python adapters use; text() renders
 * them in the Prometheus text format for a /metrics endpoint.
 */
export class Metrics {
  constructor() {
    this.requests = Object.fromEntries(OUTCOMES.map((o) => [o, 0]));
    this.leaseExpiries = 0;
    this.leaseLost = 0;
    this.storeErrors = Object.fromEntries(OPERATIONS.map((o) => [o, 0]));
  }

  text() {
    const lines = [
      '# HELP backstop_idempotency_requests_total Requests carrying an idempotency key, by outcome: first_run, replayed, in_progress, conflict, too_large.',
      '# TYPE backstop_idempotency_requests_total counter',
      ...OUTCOMES.map((o) => `backstop_idempotency_requests_total{outcome="${o}"} ${this.requests[o]}`),
      '# HELP backstop_idempotency_lease_expiries_total Keys taken over because their owner\'s lease ran out (a crashed or slow request).',
      '# TYPE backstop_idempotency_lease_expiries_total counter',
      `backstop_idempotency_lease_expiries_total ${this.leaseExpiries}`,
      '# HELP backstop_idempotency_lease_lost_total Complete or fail refused because the caller no longer owned its key.',
      '# TYPE backstop_idempotency_lease_lost_total counter',
      `backstop_idempotency_lease_lost_total ${this.leaseLost}`,
      '# HELP backstop_idempotency_store_errors_total Calls to the idempotency store that failed, by operation: begin, complete, fail.',
      '# TYPE backstop_idempotency_store_errors_total counter',
      ...OPERATIONS.map((o) => `backstop_idempotency_store_errors_total{operation="${o}"} ${this.storeErrors[o]}`),
    ];
    return `${lines.join('\n')}\n`;
  }
}

/** The counters of stores created without a `metrics` option. */
export const defaultMetrics = new Metrics();

/** Another call holds the key; retry after retryAfterS seconds. */
export class InProgressError extends Error {
  constructor(key, retryAfterS) {
    super(`idempotency key ${JSON.stringify(key)} is in progress; retry after ${retryAfterS}s`);
    this.name = 'InProgressError';
    this.retryAfterS = retryAfterS;
  }
}

/** The key was used for a different request. */
export class ConflictError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ConflictError';
  }
}

/** The first result was over maxBody and was not kept: it cannot be replayed. */
export class TooLargeError extends Error {
  constructor(message) {
    super(message);
    this.name = 'TooLargeError';
  }
}

/**
 * What once() and onceTx() give for a claim they did not take: the first
 * call's result (a Buffer), or InProgressError, ConflictError or
 * TooLargeError; counted in m.
 */
export function onceAnswer(claim, key, m) {
  if (claim.state === 'conflict') {
    m.requests.conflict++;
    throw new ConflictError(`idempotency key ${JSON.stringify(key)} was used for a different request`);
  }
  if (claim.state === 'in_progress') {
    m.requests.in_progress++;
    throw new InProgressError(key, claim.retryAfterS);
  }
  if (claim.response.tooLarge) {
    m.requests.too_large++;
    throw new TooLargeError(`the first result for idempotency key ${JSON.stringify(key)} was too large to store`);
  }
  m.requests.replayed++;
  return claim.response.body;
}
