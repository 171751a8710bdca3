// retry() against a real HTTP server on 127.0.0.1, through fetch.
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, test } from 'node:test';
import { RetryError, loadPolicy, retry } from '../index.js';

let policy; // 4 attempts, 10ms apart, no jitter: fast and exact
before(async () => {
  policy = await loadPolicy({
    max_attempts: 4,
    backoff: { strategy: 'constant', base: '10ms', cap: '50ms' },
    jitter: { mode: 'none' },
  });
});
after(() => policy.close());

// A server that answers from a script of [status, headers] (the last entry
// repeats) and records when each request arrived. It closes when test t ends,
// passed or failed.
async function serve(t, script) {
  const arrivals = [];
  const server = http.createServer((req, res) => {
    arrivals.push({ at: performance.now(), method: req.method });
    const [status, headers = {}] = script[Math.min(arrivals.length, script.length) - 1];
    res.writeHead(status, { 'content-type': 'text/plain', ...headers });
    res.end(status < 400 ? 'ok' : 'no');
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${server.address().port}/`;
  const close = () => new Promise((resolve) => (server.listening ? server.close(resolve) : resolve()));
  t.after(close);
  return { url, arrivals, close };
}

test('retries a 503, then succeeds', async (t) => {
  const srv = await serve(t, [[503], [503], [200]]);
  const retries = [];
  const res = await retry(() => fetch(srv.url), { policy, onRetry: (c) => retries.push(c) });
  assert.equal(await res.text(), 'ok');
  assert.equal(srv.arrivals.length, 3);
  assert.deepEqual(retries.map((c) => [c.attempt, c.response.status, c.delayMs, c.decision.reason]), [
    [1, 503, 10, 'transient'],
    [2, 503, 10, 'transient'],
  ]);
});

test('never retries a 400', async (t) => {
  const srv = await serve(t, [[400]]);
  await assert.rejects(retry(() => fetch(srv.url), { policy }), (err) => {
    assert.ok(err instanceof RetryError);
    assert.equal(err.reason, 'permanent_error');
    assert.equal(err.attempts, 1);
    assert.equal(err.response.status, 400);
    return true;
  });
  assert.equal(srv.arrivals.length, 1);
});

test('honours Retry-After as a floor on the wait', async (t) => {
  const srv = await serve(t, [[503, { 'retry-after': '1' }], [200]]);
  const delays = [];
  await retry(() => fetch(srv.url), { policy, onRetry: ({ decision }) => delays.push(decision) });
  assert.deepEqual(delays, [{ action: 'retry', delayMs: 1000, reason: 'retry_after', class: 'retryable' }]);
  // Timers fire no earlier than asked; allow for the event loop's clock,
  // which is read once per loop turn in whole milliseconds.
  assert.ok(srv.arrivals[1].at - srv.arrivals[0].at >= 995, `${srv.arrivals[1].at - srv.arrivals[0].at} ms`);
});

test('gives up at max attempts with the reason and the last response', async (t) => {
  const srv = await serve(t, [[503]]);
  await assert.rejects(retry(() => fetch(srv.url), { policy }), (err) => {
    assert.ok(err instanceof RetryError);
    assert.equal(err.reason, 'max_attempts_reached');
    assert.equal(err.attempts, 4);
    assert.equal(err.response.status, 503);
    assert.match(err.message, /gave up after 4 attempts \(max_attempts_reached\): HTTP 503/);
    return true;
  });
  assert.equal(srv.arrivals.length, 4);
});

test('a POST is retried only with an idempotency key', async (t) => {
  const srv = await serve(t, [[503], [503], [201]]);
  const post = () => fetch(srv.url, { method: 'POST', body: '{}' });
  await assert.rejects(retry(post, { policy, method: 'POST' }), { name: 'RetryError', reason: 'not_idempotent', attempts: 1 });
  assert.equal(srv.arrivals.length, 1);

  const res = await retry(post, { policy, method: 'POST', idempotencyKey: 'order-1' });
  assert.equal(res.status, 201);
  assert.deepEqual(srv.arrivals.map((a) => a.method), ['POST', 'POST', 'POST']);
});

test('a POST that never left (connection refused) is retried without a key', async (t) => {
  const srv = await serve(t, [[200]]);
  await srv.close(); // nothing listens on the port now
  const retries = [];
  await assert.rejects(
    retry(() => fetch(srv.url, { method: 'POST' }), { policy, method: 'POST', onRetry: (c) => retries.push(c) }),
    (err) => {
      assert.equal(err.reason, 'max_attempts_reached');
      assert.equal(err.cause.cause.code, 'ECONNREFUSED');
      return true;
    },
  );
  assert.equal(retries.length, 3);
});

test('abort stops the wait at once', async (t) => {
  const srv = await serve(t, [[503, { 'retry-after': '30' }]]);
  const ac = new AbortController();
  const onRetry = ({ delayMs }) => {
    assert.equal(delayMs, 30_000);
    setImmediate(() => ac.abort()); // once retry() has started its wait
  };
  await assert.rejects(retry(() => fetch(srv.url), { policy, signal: ac.signal, onRetry }), { name: 'AbortError' });
  assert.equal(srv.arrivals.length, 1);
  // An aborted signal runs nothing.
  let ran = false;
  await assert.rejects(retry(() => (ran = true), { policy, signal: ac.signal }), { name: 'AbortError' });
  assert.equal(ran, false);
});

test('thrown errors are classified', async () => {
  const failing = (err) => async () => {
    throw err;
  };
  // An HTTP client's error with a status and its headers (got, axios).
  const http429 = Object.assign(new Error('Too Many Requests'), { response: { statusCode: 429, headers: { 'retry-after': '0' } } });
  const seen = [];
  await assert.rejects(retry(failing(http429), { policy, onRetry: ({ decision }) => seen.push(decision.reason) }), {
    reason: 'max_attempts_reached',
  });
  assert.deepEqual(seen, ['transient', 'transient', 'transient']); // a hint of 0 does not set the delay
  await assert.rejects(retry(failing(Object.assign(new Error('x'), { status: 404 })), { policy }), {
    reason: 'permanent_error', attempts: 1,
  });
  await assert.rejects(retry(failing(Object.assign(new Error('x'), { code: 'ENOTFOUND' })), { policy }), {
    reason: 'permanent_error', attempts: 1,
  });
  const reset = new TypeError('fetch failed', { cause: Object.assign(new Error('socket'), { code: 'ECONNRESET' }) });
  await assert.rejects(retry(failing(reset), { policy }), (err) => err.reason === 'max_attempts_reached' && err.cause === reset);
  const timeout = new DOMException('timed out', 'TimeoutError');
  await assert.rejects(retry(failing(timeout), { policy }), { reason: 'max_attempts_reached', attempts: 4 });
  // An error nobody knows gets the policy's default class (uncertain).
  await assert.rejects(retry(failing(new Error('?')), { policy }), { reason: 'uncertain_limit_reached' });
  // classify maps an error the built-in rules do not know.
  const grpc = Object.assign(new Error('unavailable'), { code: 14 });
  await assert.rejects(retry(failing(grpc), { policy, classify: (e) => ({ grpcCode: e.code }) }), {
    reason: 'max_attempts_reached',
  });
  // An AbortError from fn itself is rethrown as it is.
  const abort = new DOMException('stop', 'AbortError');
  await assert.rejects(retry(failing(abort), { policy }), (err) => err === abort);
});

test('tracks attempt, elapsed time and the previous delay, and records success', async (t) => {
  const decide = t.mock.method(policy, 'decide');
  const success = t.mock.method(policy, 'recordSuccess');
  const result = await retry(
    (attempt) => {
      if (attempt < 3) throw Object.assign(new Error('busy'), { status: 503 });
      return 'done';
    },
    { policy, method: 'GET' },
  );
  assert.equal(result, 'done');
  const inputs = decide.mock.calls.map((c) => c.arguments[0]);
  assert.deepEqual(inputs.map((f) => [f.attempt, f.httpStatus, f.method, f.prevDelayMs]), [
    [1, 503, 'GET', 0],
    [2, 503, 'GET', 10],
  ]);
  // After a 10 ms timer; the event loop's clock has whole milliseconds.
  assert.ok(inputs[1].elapsedMs >= 9 && inputs[1].elapsedMs > inputs[0].elapsedMs, `${inputs[1].elapsedMs}`);
  assert.equal(success.mock.callCount(), 1);
});

test('options are validated at once', async () => {
  const fn = () => 1;
  await assert.rejects(retry(1), { name: 'TypeError', message: 'Expected `fn` to be a function' });
  await assert.rejects(retry(fn, { onRetry: 1 }), { message: 'Expected `onRetry` to be a function' });
  await assert.rejects(retry(fn, { signal: {} }), { message: 'Expected `signal` to be an AbortSignal' });
  await assert.rejects(retry(fn, { method: 1 }), { message: 'Expected `method` to be a string' });
  await assert.rejects(retry(fn, { policy: {} }), { message: /Expected `policy` to be a Policy/ });
  await assert.rejects(retry(fn, { policy: 'defualt' }), { name: 'PolicyError' });
  await assert.rejects(retry(fn, { reraise: 'yes' }), { message: 'Expected `reraise` to be a boolean' });
  assert.equal(await retry(fn), 1); // the default preset
});

// reraise (p-retry's behaviour, tenacity's reraise=True): the give-up
// throws the last attempt's own error, after the same attempts.
test('reraise: the give-up throws the last error itself', async (t) => {
  const errors = [];
  const reset = () => {
    errors.push(new TypeError('fetch failed', { cause: Object.assign(new Error('socket'), { code: 'ECONNRESET' }) }));
    throw errors.at(-1);
  };
  await assert.rejects(retry(reset, { policy, reraise: true }), (err) => err === errors.at(-1) && !(err instanceof RetryError));
  assert.equal(errors.length, 4);
  const notFound = Object.assign(new Error('x'), { status: 404 });
  await assert.rejects(retry(() => { throw notFound; }, { policy, reraise: true }), (err) => err === notFound);
  // A failed Response threw nothing: the RetryError keeps it.
  const { url, close } = await serve(t, [[503]]);
  t.after(close);
  await assert.rejects(retry(() => fetch(url), { policy, reraise: true }), (err) => err instanceof RetryError && err.response?.status === 503);
});

// The policy's attempt_timeout (spec: issue 26) bounds each attempt.
const timed = (extra) =>
  loadPolicy({ backoff: { strategy: 'constant', base: '10ms', cap: '10ms' }, jitter: { mode: 'none' }, ...extra });
const never = () => new Promise(() => {});

test('attempt_timeout: an attempt that never ends times out, is retried as a timeout, and is the last error', async (t) => {
  const p = await timed({ max_attempts: 3, attempt_timeout: '50ms' });
  t.after(() => p.close());
  const decide = t.mock.method(p, 'decide');
  let calls = 0;
  await assert.rejects(retry(() => (calls++, never()), { policy: p }), (err) => {
    assert.ok(err instanceof RetryError);
    assert.equal(err.reason, 'max_attempts_reached');
    assert.equal(err.attempts, 3);
    assert.equal(err.cause.name, 'TimeoutError');
    assert.match(err.message, /gave up after 3 attempts \(max_attempts_reached\): attempt 3 timed out after 50 ms/);
    return true;
  });
  assert.equal(calls, 3);
  assert.deepEqual(decide.mock.calls.map((c) => c.arguments[0].errorKind), ['timeout', 'timeout', 'timeout']);
});

test('attempt_timeout: fn gets a signal that aborts at the deadline, and the caller\'s abort through it', async (t) => {
  const p = await timed({ max_attempts: 2, attempt_timeout: '50ms' });
  t.after(() => p.close());
  const signals = [];
  const honours = (attempt, { signal }) => {
    signals.push(signal);
    return new Promise((_, reject) => signal.addEventListener('abort', () => reject(signal.reason)));
  };
  await assert.rejects(retry(honours, { policy: p }), { reason: 'max_attempts_reached', attempts: 2 });
  assert.equal(signals.length, 2);
  for (const s of signals) {
    assert.equal(s.aborted, true);
    assert.equal(s.reason.name, 'TimeoutError');
  }
  // The caller's abort reaches fn through the attempt's signal, and is not retried.
  const ac = new AbortController();
  const stopped = retry((attempt, { signal }) => {
    setImmediate(() => ac.abort());
    return honours(attempt, { signal });
  }, { policy: p, signal: ac.signal });
  await assert.rejects(stopped, { name: 'AbortError' });
  assert.equal(signals.length, 3);
  // No timeout in the policy: fn gets the caller's signal.
  const seen = [];
  const caller = new AbortController().signal;
  await retry((attempt, { signal }) => seen.push(signal), { policy, signal: caller });
  assert.deepEqual(seen, [caller]);
});

test('attempt_timeout: what is left of max_elapsed bounds the last attempt', async (t) => {
  // No attempt_timeout worth speaking of: max_elapsed's remainder is the bound.
  const p = await timed({ max_attempts: 10, max_elapsed: '200ms', attempt_timeout: '1h' });
  t.after(() => p.close());
  const asked = [];
  const spy = {
    decide: (f) => p.decide(f),
    recordSuccess: (now) => p.recordSuccess(now),
    attemptTimeout: (elapsed) => {
      asked.push(p.attemptTimeout(elapsed));
      return asked.at(-1);
    },
  };
  const fn = (attempt) => (attempt === 1 ? Promise.reject(Object.assign(new Error('busy'), { status: 503 })) : never());
  await assert.rejects(retry(fn, { policy: spy }), (err) => {
    assert.equal(err.reason, 'max_elapsed_exceeded');
    assert.equal(err.attempts, 2);
    assert.equal(err.cause.name, 'TimeoutError');
    return true;
  });
  assert.equal(asked.length, 2);
  assert.ok(asked.every((ms) => ms >= 1 && ms <= 200), `${asked}`);
});
