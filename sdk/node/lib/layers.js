// Retry at one layer (docs/layers.md): the attempt headers a retry() loop
// sends, and the server side that answers "do not retry" when retrying
// cannot help: oneLayer for node:http, backstopFastify for Fastify. The
// loops find their request through an AsyncLocalStorage, so a handler
// changes nothing. It never imports fastify, an optional peer.
import { AsyncLocalStorage } from 'node:async_hooks';

// The headers, in lower case (docs/layers.md).
export const ATTEMPT_HEADER = 'backstop-attempt';
export const ENVOY_ATTEMPT_HEADER = 'x-envoy-attempt-count';
export const NO_RETRY_HEADER = 'backstop-no-retry';
export const OVERLOADED_HEADER = 'x-envoy-overloaded';

const SHED_BODY = 'circuit breaker open: not retried here; do not retry\n';

// The request being served: {reason} of the last retry() loop that gave up.
const requests = new AsyncLocalStorage();

/** Tells the request being served, if any, that a retry() loop stopped with reason. */
export function recordGaveUp(reason) {
  const s = requests.getStore();
  if (s !== undefined) s.reason = reason;
}

function attemptNumber(n) {
  if (!Number.isSafeInteger(n) || n < 1) throw new TypeError('Expected `n` to be an attempt number (an integer >= 1)');
  return String(n);
}

/** The HTTP headers of attempt n (1 for the first call). */
export function attemptHeaders(n) {
  const v = attemptNumber(n);
  return { [ATTEMPT_HEADER]: v, [ENVOY_ATTEMPT_HEADER]: v };
}

/** The gRPC metadata of attempt n: grpc-previous-rpc-attempts only on a retry, as gRPC's own retries send it. */
export function grpcAttemptMetadata(n) {
  const v = attemptNumber(n);
  const md = { [ATTEMPT_HEADER]: v };
  if (n > 1) md['grpc-previous-rpc-attempts'] = String(n - 1);
  return md;
}

// A fetch Headers, or one of another implementation (node-fetch's): not a Map.
const isHeaders = (h) =>
  typeof h.get === 'function' && typeof h.set === 'function' && typeof h.has === 'function' && typeof h.append === 'function';

/** True for what retry({headers}) takes: a Headers (or alike) or a plain object. */
export function isHeaderTarget(h) {
  if (h === null || typeof h !== 'object') return false;
  if (isHeaders(h)) return true;
  const proto = Object.getPrototypeOf(h);
  return proto === Object.prototype || proto === null;
}

// The own key of a plain object naming header (any letter case), or undefined.
function keyOf(obj, name) {
  for (const k of Object.keys(obj)) if (k.toLowerCase() === name) return k;
  return undefined;
}

function hasHeader(h, name) {
  return isHeaders(h) ? h.has(name) : keyOf(h, name) !== undefined;
}

/**
 * A setter of the attempt headers on h before each attempt, leaving alone
 * those the caller set before the first; its clear() removes those it set
 * once the loop ends, so that a headers object used for another call is
 * not taken for one the caller set (as in Go and Python).
 */
export function attemptHeaderSetter(h) {
  const names = [ATTEMPT_HEADER, ENVOY_ATTEMPT_HEADER].filter((name) => !hasHeader(h, name));
  const set = (n) => {
    const v = String(n);
    for (const name of names) {
      if (isHeaders(h)) h.set(name, v);
      else h[keyOf(h, name) ?? name] = v;
    }
  };
  set.clear = () => {
    for (const name of names) {
      if (isHeaders(h)) h.delete(name);
      else {
        const k = keyOf(h, name);
        if (k !== undefined) delete h[k];
      }
    }
  };
  return set;
}

// -- the server side ----------------------------------------------------------

function checkPolicies(policies) {
  if (policies === undefined) return [];
  if (!Array.isArray(policies) || policies.some((p) => p === null || typeof p !== 'object' || typeof p.decide !== 'function')) {
    throw new TypeError('Expected `policies` to be an array of Policy from loadPolicy()');
  }
  return [...policies];
}

// Whether the breaker of any of policies is open. A policy without a
// breaker is never open; one that cannot answer (closed) does not shed.
function anyOpen(policies) {
  for (const p of policies) {
    if (p.stateful === false || typeof p.circuitState !== 'function') continue;
    try {
      if (p.circuitState() === 'open') return true;
    } catch {
      // as Go's Middleware: an error is not an open breaker
    }
  }
  return false;
}

const SHED_HEADERS = { 'content-type': 'text/plain; charset=utf-8', [NO_RETRY_HEADER]: 'circuit_open', [OVERLOADED_HEADER]: 'true' };

// Whether the headers argument of writeHead (an object or a flat array) names name.
function namesHeader(headers, name) {
  if (Array.isArray(headers)) {
    const flat = headers.length > 0 && Array.isArray(headers[0]) ? headers.flat() : headers;
    for (let i = 0; i < flat.length; i += 2) if (String(flat[i]).toLowerCase() === name) return true;
    return false;
  }
  return headers !== null && typeof headers === 'object' && keyOf(headers, name) !== undefined;
}

/**
 * oneLayer wraps a node:http request listener: while the breaker of any of
 * policies (those the service calls its dependencies with) is open, a
 * request is answered at once with 503, Backstop-No-Retry: circuit_open
 * and X-Envoy-Overloaded: true, and handler is not run; otherwise, when a
 * retry() loop inside the request gave up, a failed response (status 400 or
 * more) gets Backstop-No-Retry with the loop's reason, unless the handler
 * set it.
 */
export function oneLayer(handler, options = {}) {
  if (typeof handler !== 'function') throw new TypeError('Expected `handler` to be a function (req, res)');
  if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
  const policies = checkPolicies(options.policies);
  return function oneLayerListener(req, res) {
    if (anyOpen(policies)) {
      res.writeHead(503, SHED_HEADERS).end(SHED_BODY);
      return undefined;
    }
    const store = { reason: undefined };
    // write, end and flushHeaders without writeHead call it too (_implicitHeader).
    const writeHead = res.writeHead;
    res.writeHead = function markedWriteHead(status, ...rest) {
      res.writeHead = writeHead;
      const headers = typeof rest[0] === 'string' ? rest[1] : rest[0];
      if (status >= 400 && store.reason !== undefined && !this.headersSent && !this.hasHeader(NO_RETRY_HEADER) && !namesHeader(headers, NO_RETRY_HEADER)) {
        this.setHeader(NO_RETRY_HEADER, store.reason);
      }
      return writeHead.call(this, status, ...rest);
    };
    return requests.run(store, () => handler.call(this, req, res));
  };
}

const STORE = Symbol('backstop.layers');

/**
 * backstopFastify is a Fastify plugin (Fastify 4 or 5):
 * `fastify.register(backstopFastify, {policies})`, oneLayer for the routes
 * of the instance it is registered on.
 */
export function backstopFastify(fastify, options, done) {
  let policies;
  try {
    if (options !== undefined && (options === null || typeof options !== 'object')) {
      throw new TypeError('Expected `options` to be an object');
    }
    policies = checkPolicies(options?.policies);
  } catch (err) {
    done(err);
    return;
  }
  // Callback hooks: the rest of the request runs inside requests.run.
  fastify.addHook('onRequest', (request, reply, next) => {
    if (anyOpen(policies)) {
      reply.code(503).headers(SHED_HEADERS).send(SHED_BODY);
      return;
    }
    const store = { reason: undefined };
    request[STORE] = store;
    requests.run(store, next);
  });
  // The handler runs from the request's 'end' event, in the context of the
  // socket, not of onRequest: enter the store again (as
  // @fastify/request-context does).
  fastify.addHook('preValidation', (request, reply, next) => {
    const store = request[STORE];
    if (store === undefined) next();
    else requests.run(store, next);
  });
  fastify.addHook('onSend', (request, reply, payload, next) => {
    const reason = request[STORE]?.reason;
    if (reply.statusCode >= 400 && reason !== undefined && !reply.hasHeader(NO_RETRY_HEADER)) reply.header(NO_RETRY_HEADER, reason);
    next(null, payload);
  });
  done();
}

// What fastify-plugin sets: the hooks reach the routes of the instance the
// plugin is registered on, not only an encapsulated child.
backstopFastify[Symbol.for('skip-override')] = true;
backstopFastify[Symbol.for('fastify.display-name')] = 'backstop-one-layer';
