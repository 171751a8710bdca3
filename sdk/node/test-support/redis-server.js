// Real Redis servers for the queue tests: redis-server (the Debian package) on
// free 127.0.0.1 ports, in temporary directories, without persistence. A
// missing or too old redis-server fails the tests with a clear message; they
// never skip. (This file lives outside test/ so that `node --test` does not
// take it for a test file.)
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { until } from './eventually.js';

const live = new Set(); // servers to stop if the test process exits early
process.on('exit', () => {
  for (const child of live) child.stdin.destroy();
});

function checkBinary() {
  const r = spawnSync('redis-server', ['--version'], { encoding: 'utf8' });
  if (r.error?.code === 'ENOENT') {
    throw new Error(
      'redis-server is not on PATH: the queue tests need a real Redis >= 7 (Debian: apt-get install redis-server)',
    );
  }
  if (r.error) throw r.error;
  const m = /v=(\d+)\.(\d+)/.exec(r.stdout);
  if (!m || Number(m[1]) < 7) throw new Error(`the queue tests need Redis >= 7, redis-server --version says: ${r.stdout.trim()}`);
}

/** A free TCP port on 127.0.0.1 (the rabbitmq tests' launcher uses it too). */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

// Starts one redis-server and resolves once it accepts connections.
async function spawnServer(extra = []) {
  const dir = mkdtempSync(join(tmpdir(), 'backstop-redis-'));
  for (let tries = 0; ; tries++) {
    const port = await freePort();
    const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir, ...extra];
    if (extra.includes('--cluster-enabled')) args.push('--cluster-port', String(await freePort()));
    // Through sh, which stops the server when its stdin closes: when stop()
    // closes it, and when this process dies, however it dies. sh exits with
    // the server.
    const sh = 'exec 3<&0; redis-server "$@" </dev/null & pid=$!; (read _ <&3; kill $pid 2>/dev/null) & wait $pid';
    const child = spawn('sh', ['-c', sh, 'sh', ...args], {
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    live.add(child);
    let log = '';
    const ready = await new Promise((resolve) => {
      const timer = setTimeout(() => resolve(false), 10_000);
      const onData = (d) => {
        log += d;
        if (/Ready to accept connections/.test(log)) {
          clearTimeout(timer);
          resolve(true);
        }
      };
      child.stdout.setEncoding('utf8').on('data', onData);
      child.stderr.setEncoding('utf8').on('data', onData);
      child.on('exit', () => {
        clearTimeout(timer);
        resolve(false);
      });
    });
    if (ready) {
      child.stdout.resume();
      child.stderr.resume();
      const stop = async () => {
        if (child.exitCode === null && child.signalCode === null) {
          const exited = new Promise((resolve) => child.once('exit', resolve));
          child.stdin.end();
          await exited;
        }
        live.delete(child);
        rmSync(dir, { recursive: true, force: true });
      };
      return { port, host: '127.0.0.1', url: `redis://127.0.0.1:${port}`, stop };
    }
    child.stdin.end();
    live.delete(child);
    if (tries >= 2) {
      rmSync(dir, { recursive: true, force: true });
      throw new Error(`redis-server did not start on 127.0.0.1:${port}:\n${log}`);
    }
  }
}

/** Starts a standalone redis-server: {host, port, url, stop()}. */
export async function startRedis() {
  checkBinary();
  return spawnServer();
}

/** Starts a Redis Cluster of n masters: {nodes: [{host, port}], stop()}. */
export async function startCluster(n = 3) {
  checkBinary();
  const servers = await Promise.all(
    Array.from({ length: n }, () => spawnServer(['--cluster-enabled', 'yes', '--cluster-node-timeout', '5000'])),
  );
  const stop = () => Promise.all(servers.map((s) => s.stop()));
  const addrs = servers.map((s) => `127.0.0.1:${s.port}`);
  const r = spawnSync('redis-cli', ['--cluster', 'create', ...addrs, '--cluster-replicas', '0', '--cluster-yes'], {
    encoding: 'utf8',
  });
  if (r.status !== 0) {
    await stop();
    throw new Error(`redis-cli --cluster create failed: ${r.error?.message ?? ''}${r.stdout}${r.stderr}`);
  }
  // Every node must see every slot served before clients connect.
  for (const s of servers) {
    let info = '';
    try {
      await until(`cluster node ${s.port} to serve every slot`, () => {
        info = spawnSync('redis-cli', ['-p', String(s.port), 'CLUSTER', 'INFO'], { encoding: 'utf8' }).stdout;
        return /cluster_state:ok/.test(info) && /cluster_slots_ok:16384/.test(info);
      }, 20_000);
    } catch (err) {
      await stop();
      throw new Error(`the cluster did not settle:\n${info}`, { cause: err });
    }
  }
  return { nodes: servers.map((s) => ({ host: s.host, port: s.port })), stop };
}
