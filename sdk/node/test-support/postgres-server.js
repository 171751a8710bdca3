// A private PostgreSQL server for the idempotency tests: initdb into a fresh
// temporary directory, then postgres (the Debian package postgresql, from
// /usr/lib/postgresql/<newest>/bin) on a free 127.0.0.1 port with its socket
// in that directory; never the system service. PostgreSQL refuses to run as
// root: as root the server runs as the package's system user postgres. A
// missing postgres fails the tests; they never skip. (Outside test/ so that
// `node --test` does not take it for a test file.)
import { spawn, spawnSync } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import { until } from './eventually.js';
import { freePort } from './redis-server.js';

export const SUPERUSER = 'backstop';
export const PASSWORD = 'pgtest-s3cret-password';

function bin() {
  const root = '/usr/lib/postgresql';
  const majors = existsSync(root) ? readdirSync(root).filter((d) => existsSync(join(root, d, 'bin', 'postgres'))) : [];
  if (majors.length === 0) {
    throw new Error('postgres not found in /usr/lib/postgresql/*/bin: run `make deps`, which installs the Debian package postgresql');
  }
  majors.sort((a, b) => Number(a) - Number(b));
  return join(root, majors.at(-1), 'bin');
}

function owner() {
  if (process.getuid() !== 0) return {};
  const r = spawnSync('id', ['-u', 'postgres'], { encoding: 'utf8' });
  const g = spawnSync('id', ['-g', 'postgres'], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error('running as root and there is no system user postgres (the Debian package postgresql creates it)');
  return { uid: Number(r.stdout), gid: Number(g.stdout) };
}

const live = new Set();
process.on('exit', () => {
  for (const child of live) child.stdin.destroy();
});

/**
 * Starts a server; resolves to {url, port, stop}. url carries the
 * superuser's password (scram-sha-256 over TCP), as a production DSN does.
 */
export async function startPostgres() {
  const b = bin();
  const id = owner();
  const dir = mkdtempSync(join(tmpdir(), 'backstop-pg-'));
  if (id.uid !== undefined) chownSync(dir, id.uid, id.gid);
  const pw = join(dir, 'pwfile');
  writeFileSync(pw, `${PASSWORD}\n`, { mode: 0o600 });
  if (id.uid !== undefined) chownSync(pw, id.uid, id.gid);
  const env = { LC_ALL: 'C', PATH: '/usr/bin:/bin' };
  const init = spawnSync(join(b, 'initdb'), ['-D', join(dir, 'data'), '-U', SUPERUSER, '--pwfile', pw, '--auth-host=scram-sha-256',
    '--auth-local=trust', '-E', 'UTF8', '--no-sync'], { cwd: dir, env, encoding: 'utf8', ...id });
  if (init.status !== 0) throw new Error(`initdb (as ${id.uid ?? userInfo().uid}): ${init.error ?? ''}${init.stdout}${init.stderr}`);
  rmSync(pw);
  const port = await freePort();
  // Through sh, which stops the server (a fast shutdown) when its stdin
  // closes: when stop() closes it, and when this process dies.
  const sh = 'exec 3<&0; "$0" "$@" </dev/null & pid=$!; (read _ <&3; kill -INT $pid 2>/dev/null) & wait $pid';
  const child = spawn('sh', ['-c', sh, join(b, 'postgres'), '-D', join(dir, 'data'), '-k', dir, '-h', '127.0.0.1', '-p', String(port),
    '-c', 'fsync=off', '-c', 'synchronous_commit=off', '-c', 'full_page_writes=off'], { cwd: dir, env, stdio: ['pipe', 'pipe', 'pipe'], ...id });
  live.add(child);
  let log = '';
  child.stdout.setEncoding('utf8').on('data', (d) => { log += d; });
  child.stderr.setEncoding('utf8').on('data', (d) => { log += d; });
  let exited = false;
  const gone = new Promise((resolve) => child.once('exit', () => { exited = true; resolve(); }));
  try {
    await until(`postgres on port ${port} to accept connections`, () => exited || /ready to accept connections/.test(log));
  } catch (err) {
    throw new Error(`${err.message}: ${log}`);
  }
  if (exited) throw new Error(`postgres exited: ${log}`);
  const stop = async () => {
    if (!exited) {
      child.stdin.end();
      await gone;
    }
    live.delete(child);
    rmSync(dir, { recursive: true, force: true });
  };
  const url = `postgres://${SUPERUSER}:${encodeURIComponent(PASSWORD)}@127.0.0.1:${port}/postgres`;
  return { url, port, stop };
}
