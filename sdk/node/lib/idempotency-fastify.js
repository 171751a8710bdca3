// The Fastify plugin of backstop-policy/idempotency: the HTTP semantics of
// idempotencyMiddleware (docs/idempotency.md) as Fastify hooks. It takes the
// instance it is registered on and never imports fastify, an optional peer.
import { Readable } from 'node:stream';
import {
  checkKey, claimAnswer, defaultRelease, requestHash, setHeaders, settle, storedHeaderValues,
} from './idempotency-common.js';

const state = Symbol('backstop.idempotency');

async function collect(stream, limit) {
  const chunks = [];
  let size = 0;
  for await (const c of stream) {
    const b = Buffer.isBuffer(c) ? c : Buffer.from(c);
    size += b.length;
    if (size > limit) {
      // What Fastify's own parser answers for a body over bodyLimit.
      throw Object.assign(new Error('Request body is too large'), { statusCode: 413, code: 'FST_ERR_CTP_BODY_TOO_LARGE' });
    }
    chunks.push(b);
  }
  return Buffer.concat(chunks);
}

function text(reply, status, body, headers = {}) {
  return reply.code(status).headers({ 'content-type': 'text/plain', ...headers }).send(body);
}

/**
 * fastifyIdempotency is a Fastify plugin (Fastify 4 or 5):
 * `fastify.register(fastifyIdempotency, { store })`. Its hooks apply to the
 * routes of the instance it is registered on, as idempotencyMiddleware does:
 * a request with an Idempotency-Key runs once, a retry gets the first
 * response marked Idempotent-Replayed: true, another request under the key
 * 422, a duplicate while the first runs 409 and Retry-After.
 *
 * # Notes
 *
 * The request hash covers the raw body bytes (read in preParsing, then
 * handed to Fastify's parser unchanged), so it is the hash the node:http
 * and Go adapters compute, whatever content-type parsers are installed. The
 * key is claimed in preHandler, after parsing and validation: a request
 * Fastify rejects never holds its key. An error the handler throws or sends
 * releases the key. A store call after the handler that fails is counted,
 * logged and retried in the background while the key's lease lasts; a
 * stored header Fastify would refuse is skipped at replay and logged.
 */
export async function fastifyIdempotency(fastify, options = {}) {
  const {
    store, header = 'Idempotency-Key', scope = () => '', methods = ['POST', 'PATCH'],
    storedHeaders = ['content-type', 'location'], failOpen = false, release = defaultRelease,
  } = options;
  if (typeof store?.begin !== 'function') {
    throw new TypeError('Expected `store` to be an idempotency store (createIdempotencyStore)');
  }
  const m = store.metrics;
  const log = (message, fields) => store.log?.(message, fields);
  const name = header.toLowerCase();
  // Fastify's own default; a route's bodyLimit, when it has one, wins.
  const bodyLimit = fastify.initialConfig?.bodyLimit ?? 1 << 20;

  fastify.addHook('onRequest', async (request, reply) => {
    const key = request.headers[name];
    if (!methods.includes(request.method) || key === undefined) return;
    try {
      checkKey(key);
    } catch (err) {
      return text(reply, 400, `${header}: ${err.message}\n`);
    }
    request[state] = { key, raw: Buffer.alloc(0) };
  });

  fastify.addHook('preParsing', async (request, reply, payload) => {
    const s = request[state];
    if (!s) return payload;
    s.raw = await collect(payload, request.routeOptions?.bodyLimit ?? bodyLimit);
    const again = Readable.from([s.raw]);
    again.receivedEncodedLength = s.raw.length;
    return again;
  });

  fastify.addHook('preHandler', async (request, reply) => {
    const s = request[state];
    if (!s) return;
    s.scope = scope(request);
    const started = Date.now(); // the lease runs from about here on the server's clock
    let claim;
    try {
      claim = await store.begin(s.scope, s.key, requestHash(request.method, request.url, s.raw));
    } catch {
      if (failOpen) return;
      return text(reply, 503, 'idempotency store unavailable\n', { 'retry-after': '1' });
    }
    const answer = claimAnswer(claim, header, m);
    if (answer !== null) {
      reply.code(answer.status);
      setHeaders(answer.headers, (k, v) => reply.header(k, v), (k, err) => {
        log('stored header not replayed: the server refuses it', { name: k, error: err.message });
      });
      return reply.send(answer.body);
    }
    s.token = claim.token;
    s.until = started + store.leaseMs;
  });

  // Runs before the error handler's response goes through onSend.
  fastify.addHook('onError', async (request) => {
    if (request[state]) request[state].failed = true;
  });

  fastify.addHook('onSend', async (request, reply, payload) => {
    const s = request[state];
    if (!s?.token) return payload;
    const token = s.token;
    s.token = undefined; // one store call per claim, whatever sends next
    let body = payload;
    if (body != null && typeof body.pipe === 'function') body = await collect(body, Infinity);
    body = Buffer.isBuffer(body) ? body : Buffer.from(body ?? '');
    const status = reply.statusCode;
    const headers = storedHeaderValues(storedHeaders, (h) => reply.getHeader(h));
    // As the middleware: the client gets the response after the first
    // attempt; a failed call is retried in the background while the lease
    // lasts.
    const releasing = s.failed || release(status);
    await settle(releasing ? () => store.fail(s.scope, s.key, token) : () => store.complete(s.scope, s.key, token, { status, headers, body }),
      { op: releasing ? 'fail' : 'complete', key: s.key, until: s.until, log }).first;
    return body;
  });
}

// What fastify-plugin sets: the hooks reach the routes of the instance the
// plugin is registered on, not only an encapsulated child.
fastifyIdempotency[Symbol.for('skip-override')] = true;
fastifyIdempotency[Symbol.for('fastify.display-name')] = 'backstop-idempotency';
