// backstop-policy/idempotency: the server side of idempotency keys
// (queue/redisqueue/README.md in the backstop repository, "Idempotency keys") over the
// caller's ioredis or node-redis client. Every call is one run of the
// contract's script, scripts/idempotency.lua, the one the Go and Python
// adapters run too; testdata/idempotency pins what it answers.
import { createHash, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import {
  LeaseLostError, StoreError, checkKey, claimAnswer, defaultMetrics, defaultRelease, onceAnswer, safeHeaders, setHeaders,
  requestHash, settle, storedHeaderValues,
} from './idempotency-common.js';
import { sender } from './redis/client.js';

export {
  ConflictError, InProgressError, LeaseLostError, MAX_KEY_LENGTH, Metrics, REPLAYED_HEADER, StoreError, TooLargeError, checkKey, defaultMetrics,
  defaultRelease, fingerprint, requestHash, safeHeader,
} from './idempotency-common.js';
export { fastifyIdempotency } from './idempotency-fastify.js';
export { createPgIdempotencyStore, onceTx, pgSchema } from './idempotency-pg.js';

let source; // lib.lua, a newline, idempotency.lua: read on first use
function script() {
  if (!source) {
    const read = (n) => readFileSync(new URL(`../scripts/${n}.lua`, import.meta.url), 'utf8');
    const text = `${read('lib')}\n${read('idempotency')}`;
    source = { text, sha: createHash('sha1').update(text).digest('hex') };
  }
  return source;
}

function positive(name, v) {
  if (!Number.isSafeInteger(v) || v < 1) throw new TypeError(`Expected \`${name}\` to be a positive whole number of milliseconds (got ${v})`);
}

/** The default log of a store: a fixed message and its fields on stderr. */
function defaultLog(message, fields) {
  console.error(`backstop idempotency: ${message}`, fields);
}

// The header names already logged as not stored: each is logged once per
// process (up to MAX_DROPPED of them).
const dropped = new Set();
const MAX_DROPPED = 1024;

/**
 * Returns a store over client (ioredis Redis or Cluster, node-redis v4+
 * client or cluster). Options: prefix ('idem'), leaseMs (30000),
 * retentionMs (86400000), maxBody (1 MiB), metrics (defaultMetrics), log
 * (`(message, fields) => …`, default console.error: a header name that
 * cannot be stored, a store call that failed after a handler ran).
 */
export function createIdempotencyStore(client, options = {}) {
  const send = sender(client);
  const {
    prefix = 'idem', leaseMs = 30_000, retentionMs = 86_400_000, maxBody = 1 << 20, metrics = defaultMetrics, log = defaultLog,
  } = options;
  if (typeof prefix !== 'string' || prefix === '' || /[{}]/.test(prefix)) {
    throw new TypeError(`Expected \`prefix\` to be a non-empty string without braces (got ${JSON.stringify(prefix)})`);
  }
  positive('leaseMs', leaseMs);
  positive('retentionMs', retentionMs);
  if (retentionMs < leaseMs) throw new TypeError(`Expected \`retentionMs\` to be at least \`leaseMs\` (${leaseMs}), got ${retentionMs}`);
  if (!Number.isSafeInteger(maxBody) || maxBody < 0) throw new TypeError(`Expected \`maxBody\` to be a whole number >= 0 (got ${maxBody})`);
  if (typeof log !== 'function') throw new TypeError('Expected `log` to be a function');
  return new Store(send, { prefix, leaseMs, retentionMs, maxBody, metrics, log });
}

class Store {
  #send;
  #o;

  constructor(send, o) {
    this.#send = send;
    this.#o = o;
    this.metrics = o.metrics;
    this.leaseMs = o.leaseMs;
  }

  /** Logs message with fields (the store's log option); a failing log never fails a request. */
  log(message, fields) {
    try {
      this.#o.log(message, fields);
    } catch {
      // A failing logger must not fail the request.
    }
  }

  /** The Redis key of key within scope: `<prefix>:{<scope>:<key>}`, one hash tag. */
  recordKey(scope, key) {
    return `${this.#o.prefix}:{${scope}:${key}}`;
  }

  async #run(op, key, args) {
    const s = script();
    const tail = ['1', key, ...args];
    try {
      try {
        return await this.#send(['EVALSHA', s.sha, ...tail], key);
      } catch (err) {
        if (!/^NOSCRIPT/.test(err?.message)) throw err;
        return await this.#send(['EVAL', s.text, ...tail], key);
      }
    } catch (err) {
      if (/backstop idempotency: lease lost/.test(err?.message)) {
        this.#o.metrics.leaseLost++;
        throw new LeaseLostError(`idempotency: ${op} ${JSON.stringify(key)}: ${err.message}`, { cause: err });
      }
      this.#o.metrics.storeErrors[op]++;
      throw new StoreError(`idempotency: ${op} ${JSON.stringify(key)}: ${err?.message ?? err}`, { cause: err });
    }
  }

  /**
   * Claims key within scope for a request whose hash is request. Resolves to
   * {state: 'started', token, takenOver} | {state: 'in_progress', retryAfterS}
   * | {state: 'conflict'} | {state: 'completed', response: {status, headers, body: Buffer, tooLarge, truncated}}.
   * The headers are as safeHeader has them, whoever stored them.
   */
  async begin(scope, key, request) {
    checkKey(key);
    const token = randomBytes(16).toString('hex');
    const o = this.#o;
    const r = await this.#run('begin', this.recordKey(scope, key), ['begin', token, request, String(o.leaseMs), String(o.retentionMs)]);
    const str = (v) => (Buffer.isBuffer(v) ? v.toString() : String(v));
    switch (str(r[0])) {
      case 'started':
        if (Number(r[1]) === 1) o.metrics.leaseExpiries++;
        return { state: 'started', token, takenOver: Number(r[1]) === 1 };
      case 'in_progress':
        return { state: 'in_progress', retryAfterS: Number(r[1]) };
      case 'conflict':
        return { state: 'conflict' };
      case 'completed': {
        const headers = safeHeaders(str(r[2]) === '' ? {} : JSON.parse(str(r[2])));
        return {
          state: 'completed',
          response: {
            status: Number(str(r[1])), headers, body: Buffer.from(str(r[3]), 'base64'), tooLarge: Number(r[4]) === 1,
            truncated: Number(r[5]) === 1,
          },
        };
      }
    }
    o.metrics.storeErrors.begin++;
    throw new StoreError(`idempotency: begin ${JSON.stringify(key)}: unexpected reply ${JSON.stringify(r)}`);
  }

  /**
   * Stores response ({status, headers: {name: [values]}, body, truncated}) as
   * the key's; only the owner (token) may. Headers are stored as safeHeader
   * has them: one whose name is not an HTTP token is dropped (logged once per
   * name). truncated: the client left before the response was finished.
   */
  async complete(scope, key, token, response) {
    const body = Buffer.isBuffer(response.body) ? response.body : Buffer.from(response.body ?? '');
    const large = response.tooLarge === true || body.length > this.#o.maxBody;
    const headers = safeHeaders(response.headers, (name) => {
      if (dropped.has(name) || dropped.size >= MAX_DROPPED) return;
      dropped.add(name);
      this.log('response header not stored: its name is not an HTTP token', { name });
    });
    await this.#run('complete', this.recordKey(scope, key), [
      'complete', token, String(response.status), large ? '' : JSON.stringify(headers),
      large ? '' : body.toString('base64'), large ? '1' : '0', String(this.#o.retentionMs), response.truncated === true ? '1' : '0',
    ]);
  }

  /** Releases the key so that a retry may run; only the owner (token) may. */
  async fail(scope, key, token) {
    await this.#run('fail', this.recordKey(scope, key), ['fail', token]);
  }
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(Buffer.isBuffer(c) ? c : Buffer.from(c)));
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

function send(res, status, headers, body) {
  res.writeHead(status, headers);
  res.end(body);
}

/** What a store's owner tells log of: the store's log when it has one. */
function logOf(store) {
  return (message, fields) => store.log?.(message, fields);
}

/**
 * Answers res with a claim's answer ({status, headers, body}); a stored
 * header the server still refuses is skipped and logged, never thrown: a
 * replay never crashes the process nor answers 500.
 */
function replay(res, { status, headers, body }, log) {
  setHeaders(headers, (name, v) => res.setHeader(name, v), (name, err) => {
    log('stored header not replayed: the server refuses it', { name, error: err.message });
  });
  res.writeHead(status);
  res.end(body);
}

/**
 * Connect/Express-style middleware `(req, res, next)` over store: a request
 * with an Idempotency-Key runs once; a retry with the same key and request
 * gets the first response (marked Idempotent-Replayed: true), the same key
 * with another request 422, a duplicate while the first runs 409 and
 * Retry-After. The request body is req.body when a parser set it, else it is
 * read and left on req.body as a Buffer.
 *
 * Once the handler has run, its response is stored (or the key released)
 * whatever happens to the request: a store call that fails is counted,
 * logged and retried in the background while the key's lease lasts (the
 * client gets the response after the first attempt); if the store is still
 * failing when the lease ends, the key may run again. A client that leaves
 * while the response is being written (a stream.pipeline into res) leaves a
 * record completed with what was captured, marked truncated.
 */
export function idempotencyMiddleware(store, options = {}) {
  const {
    header = 'Idempotency-Key', scope = () => '', methods = ['POST', 'PATCH'], storedHeaders = ['content-type', 'location'],
    failOpen = false, release = defaultRelease,
  } = options;
  const m = store.metrics;
  const log = logOf(store);
  return async function idempotency(req, res, next) {
    const key = req.headers[header.toLowerCase()];
    if (!methods.includes(req.method) || key === undefined) return next();
    try {
      checkKey(Array.isArray(key) ? key[0] : key);
    } catch (err) {
      return send(res, 400, { 'content-type': 'text/plain' }, `${header}: ${err.message}\n`);
    }
    if (req.body === undefined) {
      try {
        req.body = await readBody(req);
      } catch (err) { // the client left mid-body: an answer, never a rejection (Express would crash on it)
        return send(res, 400, { 'content-type': 'text/plain' }, `idempotency: reading the request body: ${err.message}\n`);
      }
    }
    const raw = Buffer.isBuffer(req.body) || typeof req.body === 'string' ? req.body : JSON.stringify(req.body);
    const sc = scope(req);
    const started = Date.now(); // the lease runs from about here on the server's clock
    let claim;
    try {
      claim = await store.begin(sc, key, requestHash(req.method, req.originalUrl ?? req.url, raw));
    } catch (err) {
      if (failOpen) return next();
      return send(res, 503, { 'content-type': 'text/plain', 'retry-after': '1' }, 'idempotency store unavailable\n');
    }
    const answer = claimAnswer(claim, header, m);
    if (answer !== null) return replay(res, answer, log);
    const until = started + store.leaseMs;
    const releaseKey = () => settle(() => store.fail(sc, key, claim.token), { op: 'fail', key, until, log });
    // Hold the handler's response until the store has it.
    const chunks = [];
    let began = false; // the handler has started its response
    let settled = false; // one store call per claim
    const { writeHead, write, end } = res;
    const restore = () => Object.assign(res, { writeHead, write, end });
    // Stores what the handler gave (or releases the key); first is the first attempt.
    const finish = (truncated) => {
      settled = true;
      const body = Buffer.concat(chunks);
      const status = res.statusCode;
      if (release(status)) return { body, first: releaseKey().first };
      const headers = storedHeaderValues(storedHeaders, (name) => res.getHeader(name));
      const call = () => store.complete(sc, key, claim.token, { status, headers, body, truncated });
      return { body, first: settle(call, { op: 'complete', key, until, log }).first };
    };
    res.writeHead = function (status, reason, headers) {
      began = true;
      if (typeof reason !== 'string') headers = reason;
      res.statusCode = status;
      for (const [k, v] of Object.entries(headers ?? {})) res.setHeader(k, v);
      return res;
    };
    const take = (chunk, enc) => {
      if (chunk != null && typeof chunk !== 'function') chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk, typeof enc === 'string' ? enc : 'utf8'));
    };
    res.write = (chunk, enc, cb) => {
      began = true;
      take(chunk, enc);
      if (typeof cb === 'function') cb();
      else if (typeof enc === 'function') enc();
      return true;
    };
    res.end = (chunk, enc, cb) => {
      const done = typeof cb === 'function' ? cb : typeof enc === 'function' ? enc : undefined;
      if (settled) { // the client left and what it left behind is stored
        if (done) process.nextTick(done);
        return res;
      }
      take(chunk, enc);
      restore();
      const { body, first } = finish(false);
      first.then(() => res.end(body, done));
      return res;
    };
    // The client left before the response was finished: a handler that had
    // started it (a stream.pipeline whose destination closed never calls
    // end) has run its side effect, so what was captured is stored, marked
    // truncated. One that had not waits for its own end, as usual.
    res.on('close', () => {
      if (!settled && began) finish(true);
    });
    try {
      await next();
    } catch (err) {
      if (!settled) {
        settled = true;
        restore();
        await releaseKey().first;
      }
      throw err;
    }
  };
}

/**
 * Wraps a node:http handler `(req, res)` with idempotencyMiddleware:
 * `http.createServer(idempotent(store, handler))`.
 */
export function idempotent(store, handler, options = {}) {
  const mw = idempotencyMiddleware(store, options);
  return (req, res) =>
    mw(req, res, () => handler(req, res)).catch((err) => {
      if (!res.headersSent) send(res, 500, { 'content-type': 'text/plain' }, 'internal error\n');
      else res.destroy(err);
    });
}

/**
 * Runs fn (async, returning a Buffer or string) at most once for key within
 * scope: a later call with the same key and request resolves to the first
 * call's result (a Buffer) without running fn. With the job id as the key, a
 * job redelivered after a crash returns its recorded result instead of
 * running its side effect again. fn's error releases the key and is
 * rethrown; a duplicate while fn runs rejects with InProgressError, another
 * request under the key with ConflictError. Storing fn's result is retried
 * while the key's lease lasts (a store briefly down); once resolves when it
 * is stored, or rejects with the store's last error when the lease ended.
 */
export async function once(store, scope, key, request, fn) {
  const started = Date.now(); // the lease runs from about here on the server's clock
  const claim = await store.begin(scope, key, request);
  const m = store.metrics;
  if (claim.state !== 'started') return onceAnswer(claim, key, m);
  m.requests.first_run++;
  const until = started + store.leaseMs;
  const log = logOf(store);
  let out;
  try {
    out = await fn();
  } catch (err) {
    // fn's error is the one callers handle; a release that fails is
    // counted, logged and retried in the background while the lease lasts.
    await settle(() => store.fail(scope, key, claim.token), { op: 'fail', key, until, log }).first;
    throw err;
  }
  const body = Buffer.isBuffer(out) ? out : Buffer.from(out ?? '');
  // Retried while the lease lasts: rejects with the store's last error when
  // the result could not be stored (the key may run again).
  await settle(() => store.complete(scope, key, claim.token, { status: 200, headers: {}, body }), { op: 'complete', key, until, log }).done;
  return body;
}
