// A node:http server on a loopback port for the layer tests (layers.test.js,
// layers-cases.test.js). (Outside test/ so that `node --test` does not take
// it for a test file.)
import http from 'node:http';

/**
 * Serves listener on 127.0.0.1, port 0: {url, server, close}. close ends
 * open keep-alive connections too (fetch keeps them).
 */
export async function listen(listener) {
  const server = http.createServer(listener);
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${server.address().port}/`;
  const close = () =>
    new Promise((resolve) => {
      if (!server.listening) return resolve();
      server.close(() => resolve());
      server.closeAllConnections();
    });
  return { url, server, close };
}

/**
 * A scripted server: it answers responses ([{status, headers}], the last
 * one again for every later call) with an empty body, and records the
 * request headers named in record (absent ones left out) of each call.
 */
export async function scripted(responses, record = ['backstop-attempt', 'x-envoy-attempt-count']) {
  const seen = [];
  const s = await listen((req, res) => {
    const h = {};
    for (const name of record) if (req.headers[name] !== undefined) h[name] = req.headers[name];
    seen.push(h);
    const r = responses[Math.min(seen.length, responses.length) - 1];
    req.resume();
    res.writeHead(r.status, r.headers ?? {}).end();
  });
  return { ...s, seen, calls: () => seen.length };
}

/**
 * A peer on 127.0.0.1 whose connects hang: {host, port, url, close}. A
 * child process listens with a backlog of 1 and blocks its event loop at
 * once, so it never accepts; two connections fill its queue and the kernel
 * drops further SYNs, as a black-holing firewall does (offline, unlike a
 * non-routable address, which may fail at once). Node.js cannot hold such
 * a socket itself: its own event loop would accept every connection.
 */
export async function blackhole() {
  const { spawn } = await import('node:child_process');
  const net = await import('node:net');
  const child = spawn(process.execPath, ['-e', `
    const s = require('node:net').createServer();
    s.listen({ port: 0, host: '127.0.0.1', backlog: 1 }, () => { // 0 would be Node's default, 511
      process.stdout.write(s.address().port + '\\n');
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0); // never accept
    });`], { stdio: ['ignore', 'pipe', 'inherit'] });
  const close = () => child.kill('SIGKILL');
  const port = await new Promise((resolve, reject) => {
    child.stdout.once('data', (d) => resolve(Number(String(d).trim())));
    child.once('exit', (code) => reject(new Error(`blackhole: the listener exited (${code})`)));
  });
  const held = [];
  const connect = () =>
    new Promise((resolve) => {
      const c = net.connect({ port, host: '127.0.0.1' });
      c.on('error', () => {});
      c.setTimeout(200, () => (c.destroy(), resolve(false))); // hangs: the queue is full
      c.once('connect', () => (c.setTimeout(0), held.push(c), resolve(true)));
    });
  for (let i = 0; i < 16; i++) {
    if (!(await connect())) {
      return { host: '127.0.0.1', port, url: `http://127.0.0.1:${port}/`, close: () => (held.forEach((c) => c.destroy()), close()) };
    }
  }
  close();
  throw new Error(`blackhole: port ${port} still accepts connections after 16`);
}
