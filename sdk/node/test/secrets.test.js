// Issue 40 (SPEC-40 item 11): no error or log line of backstop-policy/rabbitmq
// shows the password of the URL it was given, parseable or not, whether the
// broker is unreachable or refuses the login. The Redis queue and the
// idempotency store take a client the caller made, never a URL: they have
// none to show. A real broker (test-support/rabbitmq-server.js) refuses the
// password.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { inspect } from 'node:util';
import { connect } from '../lib/rabbitmq.js';
import { startRabbit } from '../test-support/rabbitmq-server.js';

// The password in the forms a URL may carry it: as is, escaped, and those
// that make a URL parser fail (an unescaped %, a space, a slash).
const FORMS = {
  plain: 'hunter2-Pw0rd',
  escaped: 'hunter2%25Pw0rd',
  'unescaped %': 'hunter2%Pw0rd',
  space: 'hunter2 Pw0rd',
  slash: 'hunter2/Pw0rd', // ends the host part: the port would be "hunter2"
};
const LEAKS = ['hunter2', 'Pw0rd'];

let server;
before(async () => {
  server = await startRabbit();
});
after(async () => {
  await server?.stop();
});

// Everything an error can print: message, stack, causes, util.inspect.
function allText(err) {
  const parts = [];
  for (let e = err, n = 0; e != null && n < 10; e = e.cause, n++) parts.push(String(e?.message), String(e?.stack));
  parts.push(inspect(err, { depth: 10 }));
  return parts.join('\n');
}

test('connect: no password in the error or the logs, unreachable or refused', { timeout: 120_000 }, async () => {
  const port = new URL(server.url).port;
  const logged = [];
  const origError = console.error;
  console.error = (...args) => logged.push(args.map((a) => (a instanceof Error ? allText(a) : String(a))).join(' '));
  try {
    for (const [name, pw] of Object.entries(FORMS)) {
      for (const host of ['127.0.0.1:1', `127.0.0.1:${port}`]) {
        const url = `amqp://guest:${pw}@${host}/`;
        let err;
        try {
          const broker = await connect(url); // default onError: console.error
          await broker.close();
        } catch (e) {
          err = e;
        }
        assert.ok(err, `connect with password ${name} at ${host} succeeded`);
        const text = allText(err);
        for (const leak of LEAKS) {
          assert.ok(!text.includes(leak), `password ${name} at ${host}: the error shows ${leak}:\n${text}`);
        }
        if (host !== '127.0.0.1:1' && (name === 'plain' || name === 'escaped')) {
          assert.match(text, /ACCESS.REFUSED|403/, `password ${name}: the broker did not refuse the login:\n${text}`);
        }
      }
    }
  } finally {
    console.error = origError;
  }
  for (const line of logged) {
    for (const leak of LEAKS) assert.ok(!line.includes(leak), `a log line shows ${leak}:\n${line}`);
  }
});
