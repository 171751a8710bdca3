// What lib/idempotency.js (the store, the node:http middleware, once) and
// lib/idempotency-fastify.js (the Fastify plugin) both use: the key rules,
// the request hash, the replay header, which statuses release a key and
// which headers of a response are stored, named as Go names them, and what
// a request gets instead of a run (claimAnswer). It
// imports no other module of the package, so the two depend on it and never
// on each other.
import { createHash } from 'node:crypto';

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
  return createHash('sha256').update(`${method}\n${path}\n`).update(body ?? '').digest('hex');
}

/** Whether a response status releases the key (the policy's retryable statuses) instead of being stored. */
export function defaultRelease(status) {
  return [408, 429, 502, 503, 504].includes(status);
}

// Content-Type, as Go's http.CanonicalHeaderKey writes it, so every adapter stores the same names.
export function canonical(name) {
  return name.toLowerCase().replace(/(^|-)([a-z])/g, (_, d, c) => d + c.toUpperCase());
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
