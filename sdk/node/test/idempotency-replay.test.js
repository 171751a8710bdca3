// Records stored by one language, replayed by another: headers node:http
// refuses (Location `/orders/€42` as Go stored it, a control byte as the
// Python middleware stored it, a header name that is not a token) never
// crash the replaying process nor answer 500, on Express 4, the Fastify 4
// plugin and idempotent(). Each runs in a child process
// (test-support/idempotency-replayer.js), so that a crash is an exit code.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { after, test } from 'node:test';
import { RECORDS } from '../test-support/idempotency-replayer.js';
import { startRedis } from '../test-support/redis-server.js';

const server = await startRedis();
after(() => server.stop());

const REPLAYER = new URL('../test-support/idempotency-replayer.js', import.meta.url).pathname;

async function replayer(framework) {
  const child = spawn(process.execPath, [REPLAYER, framework, String(server.port)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.setEncoding('utf8').on('data', (d) => { out += d; });
  child.stderr.setEncoding('utf8').on('data', (d) => { err += d; });
  const [code] = await once(child, 'exit');
  assert.equal(code, 0, `the ${framework} replayer exited ${code}:\n${err}`);
  return JSON.parse(out);
}

// What every replay must answer: the stored status and body, marked
// replayed, its headers as the header rule has them.
const WANT = {
  'go-location': { location: '/orders/%E2%82%AC42', 'content-type': 'application/json' },
  'python-control': { location: '/charges/1%01' },
  snowman: { location: '/charges/%E2%98%83' },
  'odd-name': { 'content-type': 'application/json' },
  crlf: { 'x-split': 'a%0D%0ASet-Cookie: x=1' },
  latin1: { 'x-note': 'caf%C3%A9' },
  'store-api': { location: '/charges/%E2%98%83' },
};

for (const framework of ['http', 'express', 'fastify']) {
  test(`${framework}: records with headers node:http refuses are replayed, never a crash or a 500`, async () => {
    const { results, runs, logs } = await replayer(framework);
    assert.equal(runs, 0, 'a replay ran the handler');
    assert.deepEqual(Object.keys(results).sort(), [...Object.keys(RECORDS), 'store-api'].sort());
    for (const [key, want] of Object.entries(WANT)) {
      const r = results[key];
      assert.equal(r.status, 201, `${key}: ${JSON.stringify(r)}`);
      assert.equal(r.body, `stored ${key}`, key);
      assert.equal(r.headers['idempotent-replayed'], 'true', key);
      for (const [name, value] of Object.entries(want)) assert.equal(r.headers[name], value, `${key}: ${name}`);
      assert.equal(r.headers['set-cookie'], undefined, key);
    }
    // The store API dropped the name it could not store, and said so.
    assert.ok(logs.some((l) => /header not stored/.test(l.message) && l.name === 'X Odd:Name'), JSON.stringify(logs));
  });
}
