// The ```js blocks of the documentation run as written (issue 13, "Docs
// that run"): each block of the files below runs in its own Node.js process
// with this package, against a real redis-server (REDIS_URL), a real
// rabbitmq-server when a block imports backstop-policy/rabbitmq (AMQP_URL), a
// private postgres when a block reads DATABASE_URL,
// and a local HTTP server standing for the `url` the snippets call. A `//=> value` line after an
// expression asserts the expression's value. A block that starts a worker
// (it listens for SIGTERM) gets SIGTERM once its job reached the server, and
// must then exit by itself. A block can only be left out with
// <!-- snippet: skip=why --> on the line before its fence.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { startRabbit } from '../test-support/rabbitmq-server.js';
import { startPostgres } from '../test-support/postgres-server.js';
import { startRedis } from '../test-support/redis-server.js';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const pkg = fileURLToPath(new URL('../', import.meta.url));

// The documents whose blocks must run (internal/integration/docs reads the same list).
const files = [
  'README.md',
  'sdk/node/README.md',
  'sdk/python/README.md',
  'queue/redisqueue/README.md',
  'queue/rabbitmq/README.md',
  ...readdirSync(join(root, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`),
];

// What a snippet leaves to the reader: the endpoint it calls, its
// idempotency key and request body.
const prelude = `const url = process.env.DOCS_URL, key = 'order-42', body = '{"sku": 7}';\n`;

/** The ```js blocks of a markdown file: {line, marker, code}. */
export function jsBlocks(text) {
  const lines = text.split('\n');
  const out = [];
  for (let i = 0; i < lines.length; i++) {
    const fence = /^```(\S*)\s*$/.exec(lines[i].trim());
    if (!fence) continue;
    const start = i;
    const marker = /^<!--\s*snippet:\s*(.*?)\s*-->$/.exec(lines[i - 1]?.trim() ?? '')?.[1] ?? '';
    const body = [];
    for (i++; i < lines.length && lines[i].trim() !== '```'; i++) body.push(lines[i]);
    if (fence[1] === 'js') out.push({ line: start + 1, marker, code: body.join('\n') });
  }
  return out;
}

/** Turns `expr;` followed by `//=> value` into an assertion on expr. */
export function withAssertions(code) {
  return code.replace(/^(.+?);[ \t]*\n\/\/=>[ \t]*(.+)$/gm, (_, expr, want) =>
    `__assert.deepStrictEqual({...(${expr})}, ${want}, ${JSON.stringify(`${expr} //=> ${want}`)});`);
}

const server = await startRedis();
// Started for the first block that needs it (a broker takes seconds).
let rabbit = null;
let postgres = null;
const requests = [];
let onRequest = () => {};
const http = createServer((req, res) => {
  requests.push({ method: req.method, key: req.headers['idempotency-key'] });
  req.resume().on('end', () => {
    res.end('ok');
    onRequest();
  });
});
await new Promise((resolve) => http.listen(0, '127.0.0.1', resolve));
// Inside the package, so `backstop-policy` resolves to it and ioredis to its
// node_modules.
const dir = mkdtempSync(join(pkg, '.docs-snippets-'));
after(async () => {
  rmSync(dir, { recursive: true, force: true });
  http.close();
  await server.stop();
  await rabbit?.stop();
  await postgres?.stop();
});

/** Waits for promise, failing with why() after ms. */
function within(promise, ms, why) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(why())), ms))),
  ]).finally(() => clearTimeout(timer));
}

for (const file of files) {
  for (const block of jsBlocks(readFileSync(join(root, file), 'utf8'))) {
    const where = `${file}:${block.line}`;
    const skip = block.marker.startsWith('skip=') && block.marker.slice(5).trim() ? block.marker.slice(5) : false;
    test(`${where} runs as written`, { skip }, async () => {
      assert.equal(block.marker, '', `${where}: unknown marker <!-- snippet: ${block.marker} -->: want skip=why`);
      const path = join(dir, `${file.replaceAll('/', '_')}-${block.line}.mjs`);
      // README.md's blocks are pasteable as is (issue 42): they define what
      // they use, no prelude; the endpoint they call, http://localhost:8080,
      // stands for the test server.
      const asIs = file === 'README.md';
      const code = asIs ? block.code.replaceAll('http://localhost:8080', `http://127.0.0.1:${http.address().port}`) : block.code;
      writeFileSync(path, `import __assert from 'node:assert/strict';\n${asIs ? '' : prelude}${withAssertions(code)}\n`);
      const worker = /SIGTERM/.test(block.code);
      if (block.code.includes("'backstop-policy/rabbitmq'")) rabbit ??= await startRabbit();
      if (block.code.includes('DATABASE_URL')) postgres ??= await startPostgres();
      const seen = requests.length;
      const served = new Promise((resolve) => (onRequest = () => requests.length > seen && resolve()));
      const child = spawn(process.execPath, [path], {
        cwd: dir,
        env: {
          ...process.env,
          DOCS_URL: `http://127.0.0.1:${http.address().port}/`,
          REDIS_URL: server.url,
          ...(rabbit && { AMQP_URL: rabbit.url }),
          ...(postgres && { DATABASE_URL: postgres.url }),
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let output = '';
      child.stdout.setEncoding('utf8').on('data', (d) => (output += d));
      child.stderr.setEncoding('utf8').on('data', (d) => (output += d));
      const exited = new Promise((resolve) => child.on('close', (code, signal) => resolve({ code, signal })));
      try {
        if (worker) {
          await within(Promise.race([served, exited]), 60_000, () => `${where}: the worker ran no job:\n${output}`);
          assert.ok(requests.slice(seen).some((r) => r.key === 'order-42'), `${where}: no job reached the server:\n${output}`);
          child.kill('SIGTERM');
        }
        const { code, signal } = await within(exited, 60_000, () => `${where}: still running${worker ? ' after SIGTERM' : ''}: ` +
          `something keeps the process alive (an open connection?)\n${output}`);
        assert.equal(code, 0, `${where} failed (exit ${code}, signal ${signal}):\n${output}`);
      } finally {
        child.kill('SIGKILL');
      }
      if (!worker) assert.ok(requests.length > seen || !/\burl\b/.test(block.code), `${where}: called no url`);
    });
  }
}

test('the checker: //=> lines become assertions', () => {
  assert.equal(withAssertions("f(1);\n//=> {a: 1}"), '__assert.deepStrictEqual({...(f(1))}, {a: 1}, "f(1) //=> {a: 1}");');
  assert.deepEqual(jsBlocks('x\n<!-- snippet: skip=no -->\n```js\na;\n```\n```sh\nb\n```\n'), [{ line: 3, marker: 'skip=no', code: 'a;' }]);
});
