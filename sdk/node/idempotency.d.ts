// Types of backstop-policy/idempotency (lib/idempotency.js): the server side
// of idempotency keys over an ioredis or node-redis client.
import type { IncomingMessage, ServerResponse } from 'node:http';

/** The longest idempotency key accepted, in bytes. */
export declare const MAX_KEY_LENGTH: 255;
/** The response header that marks a replayed response (value `true`). */
export declare const REPLAYED_HEADER: 'Idempotent-Replayed';

/** The caller no longer owns its key (its lease ran out and another request took it over, or the record expired); nothing was written. */
export declare class LeaseLostError extends Error {}
/** The store could not be reached or refused the call. */
export declare class StoreError extends Error {}

/** Counters with the names the Go and Python adapters use. */
export declare class Metrics {
  readonly requests: Record<'first_run' | 'replayed' | 'in_progress' | 'conflict' | 'too_large', number>;
  readonly leaseExpiries: number;
  readonly leaseLost: number;
  readonly storeErrors: Record<'begin' | 'complete' | 'fail', number>;
  /** The counters in the Prometheus text format. */
  text(): string;
}
/** The counters of stores created without a `metrics` option. */
export declare const defaultMetrics: Metrics;

export interface StoreOptions {
  /** Key prefix: a record lives at `<prefix>:{<scope>:<key>}`. @default 'idem' */
  readonly prefix?: string;
  /** How long a started request owns its key before another may take it over. @default 30000 */
  readonly leaseMs?: number;
  /** How long a record is kept. @default 86400000 */
  readonly retentionMs?: number;
  /** The largest body stored; a larger one is recorded as too large to replay. @default 1048576 */
  readonly maxBody?: number;
  /** @default defaultMetrics */
  readonly metrics?: Metrics;
  /**
   * Where the store, its middleware and once() tell of a header name that
   * cannot be stored (once per name) and of a store call that failed after a
   * handler ran (a fixed message and its fields: op, key, attempts, error).
   * @default (message, fields) => console.error(`backstop idempotency: ${message}`, fields)
   */
  readonly log?: (message: string, fields: Readonly<Record<string, unknown>>) => void;
}

export interface StoredResponse {
  readonly status: number;
  readonly headers: Readonly<Record<string, readonly string[]>>;
  readonly body: Buffer;
  /** The response was over maxBody: not kept, never replayed. */
  readonly tooLarge: boolean;
  /** The client left before the response was finished: body is what was captured. Replayed as it is. */
  readonly truncated: boolean;
}

export type Claim =
  | { readonly state: 'started'; readonly token: string; readonly takenOver: boolean }
  | { readonly state: 'in_progress'; readonly retryAfterS: number }
  | { readonly state: 'conflict' }
  | { readonly state: 'completed'; readonly response: StoredResponse };

/**
 * What the middleware, the Fastify plugin and once() run on: the Redis store
 * (createIdempotencyStore) and the PostgreSQL one (createPgIdempotencyStore).
 */
export interface IdempotencyBackend {
  readonly metrics: Metrics;
  /** The store's lease: how long its store calls after a handler are retried. */
  readonly leaseMs: number;
  /** Tells the store's log option of message; never throws. */
  log(message: string, fields: Readonly<Record<string, unknown>>): void;
  begin(scope: string, key: string, request: string): Promise<Claim>;
  /**
   * Headers are stored as safeHeader has them; one whose name is not an HTTP token is dropped.
   * @throws LeaseLostError when the caller no longer owns the key.
   */
  complete(scope: string, key: string, token: string,
    response: {
      status: number; headers?: Record<string, readonly string[]>; body?: Buffer | string; tooLarge?: boolean;
      /** The client left before the response was finished. @default false */
      truncated?: boolean;
    }): Promise<void>;
  /** @throws LeaseLostError when the caller no longer owns the key. */
  fail(scope: string, key: string, token: string): Promise<void>;
}

/** The Redis store. */
export interface IdempotencyStore extends IdempotencyBackend {
  /** The Redis key of key within scope: `<prefix>:{<scope>:<key>}`. */
  recordKey(scope: string, key: string): string;
}

/** A store over an ioredis Redis or Cluster, or a node-redis v4+ client or cluster. */
export declare function createIdempotencyStore(client: unknown, options?: StoreOptions): IdempotencyStore;
/** @throws TypeError unless key is 1..255 printable ASCII characters. */
export declare function checkKey(key: string): void;
/** SHA-256 (hex) of method, "\n", path, "\n", body. */
export declare function fingerprint(method: string, path: Buffer | string, body: Buffer | string): string;
/**
 * The request hash of a request-target as it arrived (`/caf%C3%A9?x=1`): fingerprint of its path
 * before any `?`, with every `%XX` escape decoded to its byte, as Go's `r.URL.Path`; what both
 * middlewares store, the same in every language (testdata/idempotency/requests.json).
 */
export declare function requestHash(method: string, target: string, body: Buffer | string): string;
/** The policy's retryable statuses (408, 429, 502, 503, 504): such a response releases the key. */
export declare function defaultRelease(status: number): boolean;
/**
 * A header value as every adapter stores and replays it, or undefined when
 * name is not an RFC 9110 token (the header is not stored): UTF-8 bytes
 * outside visible ASCII written %XX, spaces and tabs trimmed.
 * @example safeHeader('Location', '/orders/€42') //=> '/orders/%E2%82%AC42'
 */
export declare function safeHeader(name: string, value: string): string | undefined;

export interface MiddlewareOptions {
  /** @default 'Idempotency-Key' */
  readonly header?: string;
  /** Scope of keys (per user, per route). @default () => '' */
  readonly scope?: (req: IncomingMessage) => string;
  /** @default ['POST', 'PATCH'] */
  readonly methods?: readonly string[];
  /** Response headers kept for a replay. @default ['content-type', 'location'] */
  readonly storedHeaders?: readonly string[];
  /** Run the handler without the store when Redis cannot be reached. @default false (503 and Retry-After) */
  readonly failOpen?: boolean;
  /** Statuses that release the key instead of being stored. @default defaultRelease */
  readonly release?: (status: number) => boolean;
}

/** Connect/Express-style middleware. @example app.post('/charges', idempotencyMiddleware(store), handler) */
export declare function idempotencyMiddleware(store: IdempotencyBackend, options?: MiddlewareOptions):
  (req: IncomingMessage & { body?: unknown }, res: ServerResponse, next: () => unknown) => Promise<void>;
/** A node:http handler wrapped. @example http.createServer(idempotent(store, handler)) */
export declare function idempotent(store: IdempotencyBackend, handler: (req: IncomingMessage & { body?: Buffer }, res: ServerResponse) => unknown,
  options?: MiddlewareOptions): (req: IncomingMessage, res: ServerResponse) => void;

/** What the Fastify plugin reads of a request (a FastifyRequest has it); fastify's own types stay an optional peer's. */
export interface FastifyRequestLike {
  readonly method: string;
  readonly url: string;
  readonly headers: Readonly<Record<string, string | string[] | undefined>>;
}

export interface FastifyIdempotencyOptions extends Omit<MiddlewareOptions, 'scope'> {
  /** The store the keys live in. */
  readonly store: IdempotencyBackend;
  /** Scope of keys (per user, per route). @default () => '' */
  readonly scope?: (request: FastifyRequestLike) => string;
}

/**
 * The Fastify plugin (Fastify 4 or 5): the semantics of idempotencyMiddleware
 * as onRequest, preParsing, preHandler, onError and onSend hooks on the
 * instance it is registered on. The request hash covers the raw body bytes,
 * as in every other adapter; an error the handler throws or sends releases the key.
 * @example await fastify.register(fastifyIdempotency, { store })
 */
export declare function fastifyIdempotency(fastify: unknown, options: FastifyIdempotencyOptions): Promise<void>;

/** Another call holds the key; retry after retryAfterS seconds. */
export declare class InProgressError extends Error {
  readonly retryAfterS: number;
}
/** The key was used for a different request. */
export declare class ConflictError extends Error {}
/** The first result was over maxBody and was not kept: it cannot be replayed. */
export declare class TooLargeError extends Error {}

/**
 * Runs fn at most once for key within scope; a later call with the same key
 * and request resolves to the first call's result without running fn.
 * Storing the result is retried while the lease lasts; it rejects with the
 * store's last error when the lease ended first (the key may run again).
 * @example await once(store, 'jobs', job.id, job.id, () => charge(job))
 */
export declare function once(store: IdempotencyBackend, scope: string, key: string, request: string,
  fn: () => Promise<Buffer | string>): Promise<Buffer>;

export interface PgStoreOptions extends Omit<StoreOptions, 'prefix'> {
  /** The table (a plain identifier, quoted by the store). @default 'backstop_idempotency' */
  readonly table?: string;
}

/** The PostgreSQL store: the Redis store's begin/complete/fail on a table (docs/idempotency.md, "PostgreSQL"). */
export interface PgIdempotencyStore extends IdempotencyBackend {
  readonly table: string;
  /** Runs pgSchema(table): CREATE TABLE IF NOT EXISTS and its expiry index. */
  createTable(): Promise<void>;
  /** Deletes up to limit rows past their retention; resolves to how many. @default limit 1000 */
  purge(limit?: number): Promise<number>;
}

/** The table's DDL, as Go's pgstore.Schema writes it. @default table 'backstop_idempotency' */
export declare function pgSchema(table?: string): string;

/**
 * A store over a node-postgres (pg) Pool: begin claims in a transaction of
 * its own (an advisory lock, SELECT … FOR UPDATE, an upsert on the primary
 * key); complete and fail are single statements guarded by the owner's token.
 */
export declare function createPgIdempotencyStore(pool: unknown, options?: PgStoreOptions): PgIdempotencyStore;

/** A pg client in a transaction (the caller ran BEGIN on it). */
export interface PgClientLike {
  query(text: string, values?: unknown[]): Promise<{ rows: any[]; rowCount: number | null }>;
}

/**
 * Runs fn at most once for key within scope with the record written in the
 * caller's transaction on client: fn's writes and the record commit
 * together, or neither does. fn runs in a savepoint, rolled back when it
 * throws. A duplicate while the transaction runs rejects with
 * InProgressError at once; another request under the key with ConflictError.
 * @example
 * await client.query('BEGIN');
 * await onceTx(store, client, 'charges', job.id, job.id, async (tx) => {
 *   await tx.query('INSERT INTO charges (order_id) VALUES ($1)', [job.orderId]);
 *   return 'charged';
 * });
 * await client.query('COMMIT');
 */
export declare function onceTx<C extends PgClientLike>(store: PgIdempotencyStore, client: C, scope: string, key: string, request: string,
  fn: (client: C) => Promise<Buffer | string>): Promise<Buffer>;
