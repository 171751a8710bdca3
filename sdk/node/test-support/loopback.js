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
