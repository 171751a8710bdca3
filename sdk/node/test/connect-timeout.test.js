// connect_timeout (issue 43): read from the module once, handed to undici's
// connect.timeout, against a real peer on loopback that never completes a
// connect. A connect that runs out is the error kind connect_timeout, not
// timeout, and a POST that never connected is retried (never sent).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Agent, fetch } from 'undici';
import { RetryError, loadPolicy, retry } from '../index.js';
import { failureOf } from '../lib/retry.js';
import { blackhole } from '../test-support/loopback.js';

const POLICY = {
  max_attempts: 2, attempt_timeout: '30s', connect_timeout: '100ms',
  backoff: { strategy: 'constant', base: '1ms' }, jitter: { mode: 'none' },
};

test('connectTimeout is read from the policy', async () => {
  const p = await loadPolicy(POLICY);
  const none = await loadPolicy({ max_attempts: 2 });
  try {
    assert.equal(p.connectTimeout, 100);
    assert.equal(none.connectTimeout, 0); // the client's own
  } finally {
    p.close();
    none.close();
  }
});

test('a connect to a blackholed peer fails as connect_timeout, and is retried', async (t) => {
  const peer = await blackhole();
  const policy = await loadPolicy(POLICY);
  const dispatcher = new Agent({ connect: { timeout: policy.connectTimeout } });
  t.after(async () => {
    peer.close();
    policy.close();
    await dispatcher.close();
  });
  let calls = 0;
  const err = await retry((attempt, { signal }) => {
    calls++;
    return fetch(`${peer.url}charge`, { method: 'POST', dispatcher, signal });
  }, { policy, method: 'POST' }).then(() => assert.fail('resolved'), (e) => e);
  assert.ok(err instanceof RetryError, String(err));
  assert.equal(err.reason, 'max_attempts_reached');
  assert.equal(calls, 2);
  assert.equal(err.cause?.cause?.code, 'UND_ERR_CONNECT_TIMEOUT', String(err.cause?.cause));
  assert.equal(failureOf(err.cause).errorKind, 'connect_timeout');
});
