// Every row of the one table from language errors to error kinds
// (contract/errorkinds.json) that Node.js follows gives its kind through the
// built-in classification (what retry() and the queue's apply() use), on
// errors made as Node.js, undici and fetch make them where that is quick.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { test } from 'node:test';
import { failureOf } from '../lib/retry.js';

const TABLE = JSON.parse(readFileSync(new URL('../../../contract/errorkinds.json', import.meta.url), 'utf8'));
const kind = (e) => failureOf(e).errorKind ?? '';

async function closedPort() {
  const srv = net.createServer();
  await new Promise((resolve) => srv.listen(0, '127.0.0.1', resolve));
  const { port } = srv.address();
  await new Promise((resolve) => srv.close(resolve));
  return port;
}

const fetchError = (url, init) => fetch(url, init).then(() => assert.fail('fetch succeeded'), (e) => e);

const makers = {
  'TimeoutError (fetch, AbortSignal.timeout)': async () => {
    const signal = AbortSignal.timeout(1);
    await new Promise((resolve) => signal.addEventListener('abort', resolve));
    return [signal.reason, await fetchError(`http://127.0.0.1:${await closedPort()}/`, { signal })];
  },
  'AbortError (the caller cancelled: no kind)': async () => {
    const c = new AbortController();
    c.abort();
    return [await fetchError(`http://127.0.0.1:${await closedPort()}/`, { signal: c.signal })];
  },
};

for (const [name, want] of TABLE.node) {
  test(name, async () => {
    if (want === 'codes') {
      for (const [code, k] of Object.entries(TABLE.codes)) {
        assert.equal(kind(Object.assign(new Error('x'), { code })), k, code);
        // fetch (undici) wraps the cause: TypeError('fetch failed', {cause}).
        assert.equal(kind(new TypeError('fetch failed', { cause: Object.assign(new Error('x'), { code }) })), k, `cause ${code}`);
      }
      const refused = await fetchError(`http://127.0.0.1:${await closedPort()}/`);
      assert.equal(kind(refused), TABLE.codes.ECONNREFUSED, `a real refused fetch: ${refused.cause?.code}`);
      return;
    }
    assert.ok(makers[name], `row ${name}: no error made for it here`);
    for (const e of await makers[name]()) assert.equal(kind(e), want, `${e.name}: ${e.message}`);
  });
}

test('every maker is a row', () => {
  for (const name of Object.keys(makers)) assert.ok(TABLE.node.some(([n]) => n === name), name);
});
