// Reads the bundled backstop.wasm. This is the only part that depends on the
// runtime: a file: URL is read with node:fs (Node.js, Deno, Bun), anything
// else (a bundler's asset URL in a browser) is fetched.
export async function readBundledWasm() {
  const url = new URL('../../backstop.wasm', import.meta.url);
  if (url.protocol === 'file:') {
    const { readFile } = await import('node:fs/promises');
    return readFile(url);
  }
  const res = await fetch(url);
  if (!res.ok) throw new Error(`backstop.wasm: fetching ${url}: HTTP ${res.status}`);
  return new Uint8Array(await res.arrayBuffer());
}
