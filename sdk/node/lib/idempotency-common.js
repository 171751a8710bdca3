// What lib/idempotency.js (the store, the node:http middleware, once) and
// lib/idempotency-fastify.js (the Fastify plugin) both use: the key rules,
// the request hash, the replay header, which statuses release a key and how
// stored header names are written. It imports no other module of the
// package, so the two depend on it and never on each other.
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
