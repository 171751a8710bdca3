// Real RabbitMQ brokers for the rabbitmq tests: Debian's rabbitmq-server run
// directly (not the wrapper, which switches user) as an ordinary process, on
// free 127.0.0.1 ports, with a private data directory and HOME (the Erlang
// cookie), as /work/shared/notes/rabbitmq-local.md describes. A missing
// rabbitmq-server fails the tests with a clear message; they never skip.
// (Outside test/ so that `node --test` does not take it for a test file.)
import { execFile, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { until } from './eventually.js';
import { freePort } from './redis-server.js';

const BIN = '/usr/lib/rabbitmq/bin';
const run = promisify(execFile);
const live = new Set(); // brokers to stop if the test process exits early
process.on('exit', () => {
  for (const child of live) child.stdin.destroy(); // sh kills the broker on EOF
});

function accepts(port) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

/**
 * Starts a private broker: {url, port, nodename, ctl(...args), restart(), stop()}.
 * restart(whileDown) stops it and starts it again on the same ports and
 * data (its durable queues and their messages survive); stop() stops it and
 * removes its directory.
 */
export async function startRabbit() {
  if (!existsSync(`${BIN}/rabbitmq-server`)) {
    throw new Error(
      `${BIN}/rabbitmq-server is missing: the rabbitmq tests need a real broker (Debian: apt-get install rabbitmq-server)`,
    );
  }
  const dir = mkdtempSync(join(tmpdir(), 'backstop-rabbit-'));
  const [port, dist] = [await freePort(), await freePort()];
  const nodename = `bsnode${process.pid}x${port}@localhost`;
  for (const d of ['home', 'log', 'mnesia']) mkdirSync(join(dir, d));
  writeFileSync(join(dir, 'enabled_plugins'), '[].\n'); // no management: starts faster, the tests do not need it
  writeFileSync(join(dir, 'rabbit.conf'), `listeners.tcp.default = 127.0.0.1:${port}\nloopback_users = none\n`);
  const env = {
    ...process.env,
    HOME: join(dir, 'home'),
    RABBITMQ_NODENAME: nodename,
    RABBITMQ_MNESIA_BASE: join(dir, 'mnesia'),
    RABBITMQ_LOG_BASE: join(dir, 'log'),
    RABBITMQ_ENABLED_PLUGINS_FILE: join(dir, 'enabled_plugins'),
    RABBITMQ_CONFIG_FILE: join(dir, 'rabbit'),
    RABBITMQ_DIST_PORT: String(dist),
  };
  let child = null;
  const boot = async () => {
    // Through sh, which stops the broker when its stdin closes: when stop()
    // closes it, and when this process dies, however it dies.
    const sh = `exec 3<&0; ${BIN}/rabbitmq-server </dev/null >"$1/out.log" 2>&1 & pid=$!; (read _ <&3; kill $pid 2>/dev/null) & wait $pid`;
    child = spawn('sh', ['-c', sh, 'sh', dir], { env, stdio: ['pipe', 'ignore', 'ignore'] });
    live.add(child);
    const c = child;
    try {
      await until(`rabbitmq-server to accept connections on 127.0.0.1:${port}`, async () => {
        if (c.exitCode !== null) throw new Error(`rabbitmq-server exited (${c.exitCode}); see ${dir}/out.log`);
        return accepts(port);
      }, 60_000);
    } catch (err) {
      await halt();
      throw err;
    }
  };
  const halt = async () => {
    const c = child;
    if (c === null) return;
    child = null;
    if (c.exitCode === null && c.signalCode === null) {
      const exited = new Promise((resolve) => c.once('exit', resolve));
      spawnSync(`${BIN}/rabbitmqctl`, ['-n', nodename, 'stop'], { env, stdio: 'ignore', timeout: 60_000 });
      c.stdin.end(); // kills it if rabbitmqctl could not
      await exited;
    }
    live.delete(c);
  };
  await boot();
  return {
    url: `amqp://guest:guest@127.0.0.1:${port}`,
    port,
    nodename,
    /** Runs rabbitmqctl on this broker with args: resolves to its output, rejects when it fails. */
    async ctl(...args) {
      // Not spawnSync: the test's workers go on meanwhile.
      const { stdout } = await run(`${BIN}/rabbitmqctl`, ['-n', nodename, ...args], { env, timeout: 60_000 });
      return stdout;
    },
    /** Stops and starts the broker; whileDown() is called (not awaited) in between: restart resolves to its result. */
    async restart(whileDown) {
      await halt();
      const during = whileDown?.();
      await boot();
      return during;
    },
    async stop() {
      await halt();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
