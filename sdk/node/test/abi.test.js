// The module contract: imports the shim provides, the ABI version check, no
// warnings, and loading from bytes or a compiled module.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { ABI_VERSION, loadPolicy } from '../index.js';
import { wasiImports } from '../lib/host/wasi.js';

const wasmPath = new URL('../backstop.wasm', import.meta.url);
const bytes = readFileSync(wasmPath);

// A hand-assembled module exporting memory, _initialize and (unless
// version is null) abi_version() returning version: a foreign module as the
// loader sees it.
function tinyModule(version) {
  const str = (s) => [s.length, ...Buffer.from(s)];
  const section = (id, body) => [id, body.length, ...body];
  const exports = [[...str('memory'), 2, 0], [...str('_initialize'), 0, 0]];
  if (version !== null) exports.push([...str('abi_version'), 0, 1]);
  return new Uint8Array([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
    ...section(1, [2, 0x60, 0, 0, 0x60, 0, 1, 0x7f]), // types: () -> (), () -> i32
    ...section(3, [2, 0, 1]), // functions: _initialize, abi_version
    ...section(5, [1, 0, 1]), // memory: 1 page
    ...section(7, [exports.length, ...exports.flat()]),
    ...section(10, [2, 2, 0, 0x0b, 4, 0, 0x41, version ?? 0, 0x0b]), // nop; i32.const version
  ]);
}

test('the shim provides every import of backstop.wasm', () => {
  const { imports } = wasiImports();
  for (const imp of WebAssembly.Module.imports(new WebAssembly.Module(bytes))) {
    assert.equal(imp.module, 'wasi_snapshot_preview1', `${imp.module}.${imp.name}`);
    assert.equal(typeof imports[imp.name], 'function', imp.name);
  }
});

test('an unknown ABI version is refused', async () => {
  await assert.rejects(loadPolicy('default', { wasm: tinyModule(2) }), {
    message: /ABI version 2 is not supported: this backstop-policy implements ABI version 1/,
  });
  await assert.rejects(loadPolicy('default', { wasm: tinyModule(null) }), { message: /no abi_version export/ });
  // The version check itself passes a module that reports 1.
  assert.equal(ABI_VERSION, 1);
  await assert.rejects(loadPolicy('default', { wasm: tinyModule(1) }), { message: /has no buffer export/ });
});

test('a module can be passed as bytes or compiled', async () => {
  for (const wasm of [new Uint8Array(bytes), await WebAssembly.compile(bytes)]) {
    const p = await loadPolicy('critical', { wasm });
    assert.equal(p.decide({ attempt: 1, httpStatus: 503, random: 0.5, nowMs: 0 }).delayMs, 50);
    p.close();
  }
  await assert.rejects(loadPolicy('default', { wasm: 'backstop.wasm' }), { name: 'TypeError', message: /`wasm`/ });
});

test('loading prints nothing: no ExperimentalWarning, no module output', async () => {
  const index = fileURLToPath(new URL('../index.js', import.meta.url));
  const script = `import(${JSON.stringify(index)}).then(async ({ loadPolicy }) => {
    const p = await loadPolicy('default');
    console.log(p.decide({ attempt: 1, httpStatus: 503, random: 0 }).action);
  })`;
  const { stdout, stderr } = await promisify(execFile)(process.execPath, ['-e', script]);
  assert.equal(stdout, 'retry\n');
  assert.equal(stderr, '');
});

test('a crash report goes into the proc_exit error, not to stderr', () => {
  const wasi = wasiImports();
  const memory = new WebAssembly.Memory({ initial: 1 });
  wasi.bind(memory);
  const dv = new DataView(memory.buffer);
  const text = new TextEncoder().encode('fatal error: out of memory\n');
  new Uint8Array(memory.buffer).set(text, 64);
  dv.setUint32(0, 64, true); // one iovec: address, length
  dv.setUint32(4, text.length, true);
  assert.equal(wasi.imports.fd_write(2, 0, 1, 16), 0);
  assert.equal(dv.getUint32(16, true), text.length);
  assert.equal(wasi.imports.fd_write(5, 0, 1, 16), 8); // EBADF: no files
  assert.throws(() => wasi.imports.proc_exit(2), { name: 'WasiExit', message: 'backstop.wasm exited with code 2: fatal error: out of memory' });
});

test('a trapped module instance is replaced by a fresh one', async () => {
  const wasm = await WebAssembly.compile(bytes);
  const p = await loadPolicy('default', { wasm });
  // Simulate a trap inside the module (test/instance.test.js makes real ones).
  p.inst.e = { ...p.inst.e, decide_batch: () => { throw new WebAssembly.RuntimeError('unreachable'); } };
  assert.throws(() => p.decide({ attempt: 1 }), { message: /backstop\.wasm crashed \(the instance was replaced by a fresh one\): unreachable/ });
  assert.equal(p.decide({ attempt: 1, httpStatus: 503, random: 0 }).action, 'retry'); // stateless: loaded again
  const fresh = await loadPolicy('default', { wasm });
  assert.equal(fresh.decide({ attempt: 1, httpStatus: 503, random: 0 }).action, 'retry');
});
