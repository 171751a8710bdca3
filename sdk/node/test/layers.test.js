// Retry at one layer (docs/layers.md) in Node.js: retry() gives up at once on
// a failure a layer below already retried (a nested retry()'s RetryError, a
// response with Backstop-No-Retry or X-Envoy-Overloaded), sends the attempt
// headers, and oneLayer / backstopFastify answer "do not retry" for a
// service whose own retries cannot help. Real loopback servers and fetch.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import Fastify from 'fastify';
import { RetryError, attemptHeaders, backstopFastify, grpcAttemptMetadata, loadPolicy, oneLayer, retry } from '../index.js';
import { listen, scripted } from '../test-support/loopback.js';

// 3 attempts, 1 ms apart, no jitter.
const FAST = { max_attempts: 3, backoff: { strategy: 'constant', base: '1ms', cap: '1ms' }, jitter: { mode: 'none' } };
const BREAKER = { ...FAST, circuit_breaker: { failure_threshold: 1, open_for: '1h' } };

let policy;
before(async () => {
  policy = await loadPolicy(FAST);
});
after(() => policy.close());

const httpError = (status, headers = {}) => Object.assign(new Error(`HTTP ${status}`), { response: { status, headers } });

// A policy whose breaker is open: one 503 decided on it.
async function openBreaker() {
  const p = await loadPolicy(BREAKER);
  p.decide({ attempt: 1, httpStatus: 503 });
  assert.equal(p.circuitState(), 'open');
  return p;
}

// -- retry(): a layer below gave up --------------------------------------------------

// A retry() with outerPolicy whose fn is a retry() (policy) of a call that
// always fails with a 503: its error and the calls of each loop.
async function nested(outerPolicy) {
  let inner = 0;
  let outer = 0;
  const err = await retry(() => {
    outer++;
    return retry(() => {
      inner++;
      throw httpError(503);
    }, { policy });
  }, { policy: outerPolicy }).catch((e) => e);
  return { err, outer, inner };
}

test('retry() gives up at once on a RetryError of a nested retry(), classified by its last failure', async () => {
  const { err, outer, inner } = await nested(policy);
  assert.ok(err instanceof RetryError);
  assert.deepEqual([err.reason, err.attempts, err.decision.class], ['retried_downstream', 1, 'retryable']);
  assert.equal(err.cause.reason, 'max_attempts_reached');
  assert.deepEqual([outer, inner], [1, 3]);

  // The classification comes first: a permanent failure is permanent_error, whoever gave up.
  const perm = await retry(() => retry(() => Promise.reject(httpError(404)), { policy }), { policy }).catch((e) => e);
  assert.deepEqual([perm.reason, perm.attempts], ['permanent_error', 1]);
});

test('a nested retry() refused by its breaker (circuit_open, no call made) is retried as what it says', async () => {
  const open = await openBreaker();
  let outer = 0;
  const err = await retry(() => {
    outer++;
    return retry(() => assert.fail('the breaker is open: no call'), { policy: open });
  }, { policy, classify: (e) => (e instanceof Error && /circuit breaker/.test(e.message) ? { httpStatus: 503 } : undefined) }).catch((e) => e);
  open.close();
  assert.deepEqual([err.reason, err.attempts, outer], ['max_attempts_reached', 3, 3]);
  assert.equal(err.cause.reason, 'circuit_open');
});

test('retry() gives up at once on a response with Backstop-No-Retry or X-Envoy-Overloaded', async (t) => {
  for (const [headers, reason] of [
    [{ 'backstop-no-retry': 'max_attempts_reached' }, 'retried_downstream'],
    [{ 'Backstop-No-Retry': 'budget_exhausted' }, 'retried_downstream'],
    [{ 'x-envoy-overloaded': 'true' }, 'server_declined'],
    [{ 'retry-after': '0' }, 'max_attempts_reached'],
    [{ 'backstop-no-retry': '' }, 'max_attempts_reached'], // empty: absent, as Go's Header.Get reads it
  ]) {
    const bottom = await scripted([{ status: 503, headers }]);
    t.after(bottom.close);
    const err = await retry(() => fetch(bottom.url), { policy }).catch((e) => e);
    assert.equal(err.reason, reason, JSON.stringify(headers));
    assert.equal(bottom.calls(), reason === 'max_attempts_reached' ? 3 : 1, JSON.stringify(headers));
  }
  // Thrown errors with a response (axios, got): the same signals.
  for (const [headers, reason] of [
    [{ 'backstop-no-retry': 'circuit_open' }, 'retried_downstream'],
    [new Headers({ 'X-Envoy-Overloaded': 'true' }), 'server_declined'],
  ]) {
    let calls = 0;
    const err = await retry(() => {
      calls++;
      throw httpError(503, headers);
    }, { policy }).catch((e) => e);
    assert.deepEqual([err.reason, calls], [reason, 1]);
  }
});

test('with retried_downstream: retry, the policy retries a failure a layer below gave up on', async (t) => {
  const cold = await loadPolicy({ ...FAST, retried_downstream: 'retry' });
  t.after(() => cold.close());
  const { err, outer, inner } = await nested(cold);
  assert.deepEqual([err.reason, outer, inner], ['max_attempts_reached', 3, 9]);

  const bottom = await scripted([{ status: 503, headers: { 'backstop-no-retry': 'max_attempts_reached' } }]);
  t.after(bottom.close);
  const e2 = await retry(() => fetch(bottom.url), { policy: cold }).catch((e) => e);
  assert.deepEqual([e2.reason, bottom.calls()], ['max_attempts_reached', 3]);
});

test('decide takes retriedDownstream and serverDeclined, booleans only', () => {
  const f = { attempt: 1, httpStatus: 503, random: 0.5 };
  assert.equal(policy.decide({ ...f, retriedDownstream: true }).reason, 'retried_downstream');
  assert.equal(policy.decide({ ...f, server_declined: true }).reason, 'server_declined');
  assert.equal(policy.decide({ ...f, retriedDownstream: false, serverDeclined: null }).reason, 'transient');
  assert.throws(() => policy.decide({ ...f, serverDeclined: 1, retriedDownstream: 'yes' }), {
    name: 'InputError', message: 'retried_downstream: must be a boolean (got a string)',
  });
  assert.deepEqual(policy.decideMany([{ ...f, retriedDownstream: true }, { ...f, serverDeclined: true }]).map((d) => d.reason), [
    'retried_downstream', 'server_declined',
  ]);
});

// -- the attempt headers -------------------------------------------------------------

test('retry({headers}) sets the attempt headers before each attempt, on an object or a Headers', async (t) => {
  const bottom = await scripted([{ status: 503 }, { status: 503 }, { status: 200 }]);
  t.after(bottom.close);
  const headers = { accept: 'text/plain' };
  const res = await retry(() => fetch(bottom.url, { headers }), { policy, headers });
  assert.equal(res.status, 200);
  assert.deepEqual(bottom.seen, [1, 2, 3].map(attemptHeaders));
  // Removed once the loop ends: the object can carry another call.
  assert.deepEqual(headers, { accept: 'text/plain' });

  const h = new Headers();
  const seen = [];
  await retry((n) => {
    seen.push([n, h.get('backstop-attempt'), h.get('x-envoy-attempt-count')]);
    if (n < 2) throw httpError(503);
  }, { policy, headers: h });
  assert.deepEqual(seen, [[1, '1', '1'], [2, '2', '2']]);
  assert.equal(h.has('backstop-attempt'), false);
  // The same object for a second call starts again at 1.
  await retry(() => fetch(bottom.url, { headers }), { policy, headers });
  assert.deepEqual(bottom.seen.slice(3), [attemptHeaders(1)]);
});

test('retry({headers}) leaves alone an attempt header the caller set', async (t) => {
  const bottom = await scripted([{ status: 503 }]);
  t.after(bottom.close);
  const headers = { 'Backstop-Attempt': '7' };
  await retry(() => fetch(bottom.url, { headers }), { policy, headers }).catch(() => {});
  assert.deepEqual(bottom.seen, [1, 2, 3].map((n) => ({ 'backstop-attempt': '7', 'x-envoy-attempt-count': String(n) })));
  assert.deepEqual(headers, { 'Backstop-Attempt': '7' });

  const h = new Headers({ 'x-envoy-attempt-count': '1' });
  await retry((n) => {
    if (n < 3) throw httpError(503);
  }, { policy, headers: h });
  assert.deepEqual([h.get('backstop-attempt'), h.get('x-envoy-attempt-count')], [null, '1']);
});

test('retry({headers}) refuses what is not headers', async () => {
  for (const headers of [null, 'backstop-attempt: 1', [], new Map(), 1]) {
    await assert.rejects(retry(() => 1, { headers }), { name: 'TypeError', message: 'Expected `headers` to be a Headers or a plain object' });
  }
});

test('attemptHeaders and grpcAttemptMetadata', () => {
  assert.deepEqual(attemptHeaders(1), { 'backstop-attempt': '1', 'x-envoy-attempt-count': '1' });
  assert.deepEqual(attemptHeaders(12), { 'backstop-attempt': '12', 'x-envoy-attempt-count': '12' });
  assert.deepEqual(grpcAttemptMetadata(1), { 'backstop-attempt': '1' });
  assert.deepEqual(grpcAttemptMetadata(3), { 'backstop-attempt': '3', 'grpc-previous-rpc-attempts': '2' });
  for (const n of [0, -1, 1.5, '2', undefined]) {
    assert.throws(() => attemptHeaders(n), TypeError);
    assert.throws(() => grpcAttemptMetadata(n), TypeError);
  }
});

// -- oneLayer ------------------------------------------------------------------------

// What a response says about retrying.
const signals = (r) => ({ status: r.status, noRetry: r.headers.get('backstop-no-retry'), overloaded: r.headers.get('x-envoy-overloaded') });

test('oneLayer sheds while a breaker of its policies is open, without running the handler', async (t) => {
  const open = await openBreaker();
  t.after(() => open.close());
  let runs = 0;
  const srv = await listen(oneLayer((req, res) => {
    runs++;
    res.end('ok');
  }, { policies: [policy, open] }));
  t.after(srv.close);
  const r = await fetch(srv.url);
  assert.deepEqual(signals(r), { status: 503, noRetry: 'circuit_open', overloaded: 'true' });
  assert.match(await r.text(), /circuit breaker open/);
  assert.equal(runs, 0);

  // A caller's retry() gives up at once on it (retried_downstream).
  const err = await retry(() => fetch(srv.url), { policy }).catch((e) => e);
  assert.deepEqual([err.reason, err.attempts, runs], ['retried_downstream', 1, 0]);
});

test('oneLayer with no breaker open runs the handler; a policy without a breaker never sheds', async (t) => {
  const closed = await loadPolicy(BREAKER);
  t.after(() => closed.close());
  let runs = 0;
  const srv = await listen(oneLayer((req, res) => {
    runs++;
    res.end('ok');
  }, { policies: [policy, closed] }));
  t.after(srv.close);
  const r = await fetch(srv.url);
  assert.deepEqual([signals(r), await r.text(), runs], [{ status: 200, noRetry: null, overloaded: null }, 'ok', 1]);
});

// A handler whose retry() loop calls fn: it answers status when the loop
// gave up (writing head as the test says), 200 on success.
function looping(fn, { status = 502, write = 'writeHead', loopPolicy = policy } = {}) {
  return async (req, res) => {
    const ok = await retry(fn, { policy: loopPolicy }).then(() => true, () => false);
    if (ok) return res.writeHead(200).end('ok');
    if (write === 'writeHead') return res.writeHead(status, { 'content-type': 'text/plain' }).end('no');
    if (write === 'implicit') {
      res.statusCode = status;
      return res.end('no');
    }
    res.statusCode = status;
    res.write('n');
    return res.end('o');
  };
}

test('oneLayer adds Backstop-No-Retry with the reason of a loop that gave up, on a failed response', async (t) => {
  for (const write of ['writeHead', 'implicit', 'write']) {
    const srv = await listen(oneLayer(looping(() => Promise.reject(httpError(503)), { write })));
    t.after(srv.close);
    assert.deepEqual(signals(await fetch(srv.url)), { status: 502, noRetry: 'max_attempts_reached', overloaded: null }, write);
  }
  // Any reason: a permanent error, a breaker refusing the call (a policy not in policies).
  const perm = await listen(oneLayer(looping(() => Promise.reject(httpError(404)), { status: 404 })));
  t.after(perm.close);
  assert.deepEqual(signals(await fetch(perm.url)), { status: 404, noRetry: 'permanent_error', overloaded: null });
  const open = await openBreaker();
  t.after(() => open.close());
  const refused = await listen(oneLayer(looping(() => assert.fail('no call'), { status: 503, loopPolicy: open })));
  t.after(refused.close);
  assert.deepEqual(signals(await fetch(refused.url)), { status: 503, noRetry: 'circuit_open', overloaded: null });
});

test('oneLayer adds no header on success, when no loop gave up, or when the handler set it', async (t) => {
  // The loop gave up but the handler answers 200.
  const fine = await listen(oneLayer(looping(() => Promise.reject(httpError(503)), { status: 200 })));
  t.after(fine.close);
  assert.deepEqual(signals(await fetch(fine.url)), { status: 200, noRetry: null, overloaded: null });
  // A loop that succeeded, then a 500 of the handler's own.
  const own = await listen(oneLayer(async (req, res) => {
    await retry(() => 'ok', { policy });
    res.writeHead(500).end();
  }));
  t.after(own.close);
  assert.deepEqual(signals(await fetch(own.url)), { status: 500, noRetry: null, overloaded: null });
  // The handler's own value wins, by setHeader or in writeHead.
  for (const set of ['setHeader', 'writeHead']) {
    const mine = await listen(oneLayer(async (req, res) => {
      await retry(() => Promise.reject(httpError(503)), { policy }).catch(() => {});
      if (set === 'setHeader') res.setHeader('Backstop-No-Retry', 'mine');
      res.writeHead(503, set === 'writeHead' ? { 'Backstop-No-Retry': 'mine' } : {}).end();
    }));
    t.after(mine.close);
    assert.deepEqual(signals(await fetch(mine.url)), { status: 503, noRetry: 'mine', overloaded: null }, set);
  }
});

test('oneLayer keeps each request to its own loops', async (t) => {
  // Two requests at once: the one whose loop gave up is marked, the other not.
  let release;
  const gate = new Promise((resolve) => (release = resolve));
  const srv = await listen(oneLayer(async (req, res) => {
    const fail = req.url === '/fail';
    await retry(() => (fail ? Promise.reject(httpError(503)) : 'ok'), { policy }).catch(() => {});
    if (!fail) release();
    else await gate;
    res.writeHead(500).end();
  }));
  t.after(srv.close);
  const [a, b] = await Promise.all([fetch(`${srv.url}fail`), fetch(`${srv.url}ok`)]);
  assert.deepEqual([signals(a).noRetry, signals(b).noRetry], ['max_attempts_reached', null]);
  // Outside a request, a loop that gives up records nothing anywhere.
  await retry(() => Promise.reject(httpError(503)), { policy }).catch(() => {});
});

test('oneLayer checks its arguments', () => {
  assert.throws(() => oneLayer('x'), TypeError);
  assert.throws(() => oneLayer(() => {}, null), TypeError);
  assert.throws(() => oneLayer(() => {}, { policies: policy }), TypeError);
  assert.throws(() => oneLayer(() => {}, { policies: [{}] }), TypeError);
});

// -- backstopFastify -----------------------------------------------------------------

async function fastifyApp(handler, policies) {
  const app = Fastify();
  await app.register(backstopFastify, { policies });
  let runs = 0;
  app.get('/', async (request, reply) => {
    runs++;
    return handler(request, reply);
  });
  app.post('/', async (request, reply) => {
    runs++;
    return handler(request, reply);
  });
  await app.ready();
  return { app, runs: () => runs };
}

const injected = (r) => ({ status: r.statusCode, noRetry: r.headers['backstop-no-retry'] ?? null, overloaded: r.headers['x-envoy-overloaded'] ?? null });

test('fastify: sheds while a breaker is open, without running the handler', async (t) => {
  const open = await openBreaker();
  t.after(() => open.close());
  const { app, runs } = await fastifyApp(() => 'ok', [policy, open]);
  t.after(() => app.close());
  const r = await app.inject({ method: 'GET', url: '/' });
  assert.deepEqual([injected(r), runs()], [{ status: 503, noRetry: 'circuit_open', overloaded: 'true' }, 0]);
  assert.match(r.body, /circuit breaker open/);
});

test('fastify: Backstop-No-Retry on a failed response after a loop gave up, none otherwise', async (t) => {
  const gaveUp = async (request, reply) => {
    const ok = await retry(() => Promise.reject(httpError(request.query.s === '404' ? 404 : 503)), { policy }).then(() => true, () => false);
    return reply.code(ok ? 200 : Number(request.query.code ?? 502)).send('done');
  };
  const { app, runs } = await fastifyApp(gaveUp, [policy]);
  t.after(() => app.close());
  assert.deepEqual(injected(await app.inject('/')), { status: 502, noRetry: 'max_attempts_reached', overloaded: null });
  assert.deepEqual(injected(await app.inject('/?s=404&code=404')), { status: 404, noRetry: 'permanent_error', overloaded: null });
  assert.deepEqual(injected(await app.inject('/?code=200')), { status: 200, noRetry: null, overloaded: null });
  // With a body: the handler runs after parsing, still inside the request's store.
  const post = await app.inject({ method: 'POST', url: '/', payload: { a: 1 } });
  assert.deepEqual(injected(post), { status: 502, noRetry: 'max_attempts_reached', overloaded: null });
  assert.equal(runs(), 4);

  // A thrown RetryError, answered by Fastify's error handler.
  const thrown = await fastifyApp(() => retry(() => Promise.reject(httpError(503)), { policy }), []);
  t.after(() => thrown.app.close());
  assert.deepEqual(injected(await thrown.app.inject('/')), { status: 500, noRetry: 'max_attempts_reached', overloaded: null });

  const plain = await fastifyApp((request, reply) => reply.code(500).send('mine'), [policy]);
  t.after(() => plain.app.close());
  assert.deepEqual(injected(await plain.app.inject('/')), { status: 500, noRetry: null, overloaded: null });
  const own = await fastifyApp(async (request, reply) => {
    await retry(() => Promise.reject(httpError(503)), { policy }).catch(() => {});
    return reply.code(503).header('backstop-no-retry', 'mine').send('');
  }, [policy]);
  t.after(() => own.app.close());
  assert.deepEqual(injected(await own.app.inject('/')), { status: 503, noRetry: 'mine', overloaded: null });
});

test('fastify: over a real listen, a caller gives up at once', async (t) => {
  const bottom = await scripted([{ status: 503 }]);
  t.after(bottom.close);
  const { app } = await fastifyApp(async (request, reply) => {
    const r = await retry(() => fetch(bottom.url), { policy }).catch((e) => e.response);
    return reply.code(r.status).send('');
  }, [policy]);
  t.after(() => app.close());
  await app.listen({ port: 0, host: '127.0.0.1' });
  let calls = 0;
  const err = await retry(() => {
    calls++;
    return fetch(`http://127.0.0.1:${app.server.address().port}/`);
  }, { policy }).catch((e) => e);
  assert.deepEqual([err.reason, calls, bottom.calls()], ['retried_downstream', 1, 3]);
  assert.equal(err.response.headers.get('backstop-no-retry'), 'max_attempts_reached');
  // A body, read from the socket after onRequest: the handler still runs in the request's store.
  const r = await fetch(`http://127.0.0.1:${app.server.address().port}/`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ pad: 'x'.repeat(100_000) }),
  });
  assert.deepEqual(signals(r), { status: 503, noRetry: 'max_attempts_reached', overloaded: null });
});

test('fastify: the plugin checks its options', async () => {
  await assert.rejects(Fastify().register(backstopFastify, { policies: 'x' }).ready(), TypeError);
});

// -- three layers --------------------------------------------------------------------

test('three layers over loopback: the bottom gets at most one layer\'s attempts', async (t) => {
  // top retry() → middle (oneLayer, its handler's retry() calls the bottom) → a flaky bottom.
  const bottom = await scripted([{ status: 503 }]);
  t.after(bottom.close);
  let middleCalls = 0;
  const middle = await listen(oneLayer(async (req, res) => {
    middleCalls++;
    const headers = {};
    const r = await retry(() => fetch(bottom.url, { headers }), { policy, headers }).catch((e) => e.response);
    res.writeHead(r.status).end();
  }, { policies: [policy] }));
  t.after(middle.close);
  let top = 0;
  const headers = new Headers();
  const err = await retry(() => {
    top++;
    return fetch(middle.url, { headers });
  }, { policy, headers }).catch((e) => e);
  assert.equal(err.reason, 'retried_downstream');
  assert.equal(err.response.headers.get('backstop-no-retry'), 'max_attempts_reached');
  assert.deepEqual([top, middleCalls, bottom.calls()], [1, 1, 3]);
  assert.deepEqual(bottom.seen, [1, 2, 3].map(attemptHeaders));

  // Without the rule (every layer retries), the same stack multiplies the calls.
  const cold = await loadPolicy({ ...FAST, retried_downstream: 'retry' });
  t.after(() => cold.close());
  const before = bottom.calls();
  await retry(() => fetch(middle.url), { policy: cold }).catch(() => {});
  assert.equal(bottom.calls() - before, 9);
});
