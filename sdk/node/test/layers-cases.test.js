// The shared layer cases (testdata/layers/cases.json, see its README)
// replayed in Node.js: a scripted bottom server, a middle server wrapped in
// oneLayer whose handler calls the bottom through retry(), and a top
// retry() with the attempt headers on, all real node:http servers on
// loopback called with fetch; what they did compared with what the Go loop
// and middleware did.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { loadPolicy, oneLayer, retry } from '../index.js';
import { parseJSON } from '../lib/json.js';
import { listen, scripted } from '../test-support/loopback.js';

const PATH = process.env.BACKSTOP_LAYERS_CASES ?? new URL('../../../testdata/layers/cases.json', import.meta.url);
let FILE;
let unreadable;
try {
  FILE = parseJSON(readFileSync(PATH, 'utf8'));
} catch (err) {
  unreadable = err;
}

// The middle's breaker, when the case opens it before it starts.
const OPEN_BREAKER = { failure_threshold: 1, open_for: '1h' };
// The response headers the cases look at.
const SIGNALS = ['backstop-no-retry', 'x-envoy-overloaded'];

// The middle: oneLayer with its policy as its one policy; its handler calls
// the bottom through retry() and answers 200, or the status of the bottom's
// last response when the loop gave up.
async function startMiddle(c, bottom) {
  let config = c.middle.policy ?? FILE.policy;
  if (c.middle.breaker_open) config = { ...config, circuit_breaker: OPEN_BREAKER };
  const policy = await loadPolicy(config);
  if (c.middle.breaker_open) policy.decide({ attempt: 1, httpStatus: 503 });
  let calls = 0;
  const handler = oneLayer(async (req, res) => {
    req.resume();
    const headers = {};
    let status = 200;
    try {
      const r = await retry(() => fetch(bottom.url, { headers }), { policy, headers });
      await r.body?.cancel();
    } catch (err) {
      // A loop that made no call (its breaker refused it) has no response.
      status = err.response?.status ?? 503;
    }
    res.writeHead(status).end();
  }, { policies: [policy] });
  const server = await listen((req, res) => {
    calls++;
    return handler(req, res);
  });
  return {
    ...server,
    calls: () => calls,
    close: async () => {
      await server.close();
      policy.close();
    },
  };
}

function headersOf(r) {
  const h = {};
  for (const name of SIGNALS) if (r.headers.has(name)) h[name] = r.headers.get(name);
  return h;
}

async function run(c) {
  const bottom = await scripted(c.bottom);
  const middle = c.middle ? await startMiddle(c, bottom) : null;
  const top = await loadPolicy(c.policy ?? FILE.policy);
  const inner = c.inner_loop ? await loadPolicy(FILE.policy) : null;
  try {
    let attempts = 0;
    let middleHeaders = {};
    const headers = {};
    const call = async () => {
      attempts++;
      if (inner) {
        // A second loop in the same process, with its own request.
        const h = {};
        return retry(() => fetch(bottom.url, { headers: h }), { policy: inner, headers: h });
      }
      const r = await fetch(middle ? middle.url : bottom.url, { headers });
      if (middle) middleHeaders = headersOf(r);
      return r;
    };
    let reason = 'success';
    try {
      const r = await retry(call, { policy: top, headers });
      await r.body?.cancel();
    } catch (err) {
      if (err?.name !== 'RetryError') throw err;
      reason = err.reason;
      await err.response?.body?.cancel();
    }
    const got = { reason, attempts, bottom_calls: bottom.calls(), bottom_seen: bottom.seen };
    if (middle) {
      got.middle_calls = middle.calls();
      got.middle_headers = middleHeaders;
    }
    return got;
  } finally {
    top.close();
    inner?.close();
    await middle?.close();
    await bottom.close();
  }
}

// Zero values left out, as the generator's JSON omits them.
function compact(v) {
  const out = {};
  for (const [k, x] of Object.entries(v)) {
    const empty = x === 0 || x === null || x === undefined || (Array.isArray(x) && x.length === 0) ||
      (typeof x === 'object' && x !== null && !Array.isArray(x) && Object.keys(x).length === 0);
    if (!empty) out[k] = x;
  }
  return out;
}

test('testdata/layers/cases.json is there, with cases', () => {
  if (unreadable) throw new Error(`testdata/layers/cases.json: ${unreadable.message} (make layers-cases writes it)`);
  assert.ok(Array.isArray(FILE.cases) && FILE.cases.length > 0, 'no cases');
});

for (const c of FILE?.cases ?? []) {
  test(c.name, async () => {
    assert.deepStrictEqual(compact(await run(c)), compact(c.expect));
  });
}
