// The process metrics: the shared sequence (testdata/metrics/sequence.json)
// replayed through retry() on mocked timers gives the exposition Go gives
// (testdata/metrics/expected.prom), series for series.
import { test, mock } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import promClient from 'prom-client';
import { loadPolicy, retry, createMetrics, RetryError } from '../index.js';

const root = new URL('../../../testdata/metrics/', import.meta.url);
const seq = JSON.parse(readFileSync(new URL('sequence.json', root), 'utf8'));

// The samples of an exposition, each with its labels sorted, sorted: prom-client
// and client_golang order labels and series differently.
function samples(text) {
  return text.split('\n').filter((l) => l && !l.startsWith('# HELP')).map((line) => {
    const m = /^([^{ ]+)(?:\{(.*)\})? (.*)$/.exec(line);
    if (!m || line.startsWith('#')) return line;
    const labels = (m[2] ?? '').match(/[a-z_]+="[^"]*"/g) ?? [];
    return `${m[1]}{${labels.sort().join(',')}} ${Number(m[3])}`;
  }).sort();
}

function outcome(o) {
  if (o === 'ok') return { ok: true, status: 200 };
  if (o === 'timeout') return Object.assign(new Error('timed out'), { name: 'TimeoutError' });
  const [, status, retryAfter] = o.split(':');
  const headers = new Headers(retryAfter ? { 'retry-after': retryAfter } : {});
  return { ok: false, status: Number(status), headers, body: null };
}

// Runs p to completion, firing the mocked timers it waits on.
async function settle(p) {
  let result;
  p.then((value) => { result = { value }; }, (error) => { result = { error }; });
  while (!result) {
    await new Promise((r) => setImmediate(r));
    mock.timers.runAll();
  }
  if (result.error) throw result.error;
  return result.value;
}

test('the shared sequence gives the same series and values as Go', async () => {
  mock.timers.enable({ apis: ['setTimeout', 'Date'], now: seq.start_ms });
  try {
    const registry = new promClient.Registry();
    const metrics = createMetrics(promClient, { policy: seq.policy_name, target: seq.target, registry });
    const policy = await loadPolicy(seq.policy);
    for (const [i, call] of seq.calls.entries()) {
      if (call.advance_ms) mock.timers.tick(call.advance_ms);
      let n = 0;
      const fn = async () => {
        assert.ok(n < call.outcomes.length, `call ${i}: attempt ${n + 1} made, ${call.outcomes.length} scripted`);
        const o = outcome(call.outcomes[n++]);
        if (o instanceof Error) throw o;
        return o;
      };
      let got = 'ok';
      try {
        await settle(retry(fn, { policy, metrics }));
      } catch (err) {
        if (!(err instanceof RetryError)) throw err;
        got = err.reason;
      }
      assert.equal(got, call.want, `call ${i}`);
      assert.equal(n, call.outcomes.length, `call ${i}: attempts`);
    }
    const want = readFileSync(new URL('expected.prom', root), 'utf8');
    assert.deepEqual(samples(await registry.metrics()), samples(want));
  } finally {
    mock.timers.reset();
  }
});

test('a second createMetrics on a registry reuses its collectors', async () => {
  const registry = new promClient.Registry();
  const a = createMetrics(promClient, { policy: 'a', target: 'api', registry });
  const b = createMetrics(promClient, { policy: 'a', target: 'api', registry });
  a.attempt('success');
  b.attempt('success');
  const text = await registry.metrics();
  assert.match(text, /backstop_client_attempts_total\{policy="a",target="api",outcome="success"\} 2/);
});

test('bad input gets a clear error', () => {
  const other = new promClient.Registry();
  new promClient.Counter({ name: 'backstop_client_attempts_total', help: 'not ours', registers: [other] });
  const cases = [
    [{ policy: 'pay\ud800', target: 'api' }, /`policy` to be valid UTF-8/],
    [{ policy: 'payments', target: '' }, /`target` to be a non-empty string/],
    [{ policy: 'payments', target: 'api', registry: other }, /register backstop_client_attempts_total: the registry holds another metric/],
    [{ policy: 'payments', target: 'api', registry: {} }, /`registry` to be a prom-client Registry/],
  ];
  for (const [opts, re] of cases) assert.throws(() => createMetrics(promClient, opts), re);
  assert.throws(() => createMetrics({}, { policy: 'p', target: 't' }), /`promClient` to be the prom-client module/);
});
