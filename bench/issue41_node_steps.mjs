// Where a fresh process's loadPolicy('default') spends its time, for two
// copies of sdk/node in alternating processes (bench/node/bench.js's step
// script): node bench/issue41_node_steps.mjs BEFORE/sdk/node AFTER/sdk/node [pairs]
import { execFileSync } from 'node:child_process';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const dirs = { before: process.argv[2], after: process.argv[3] };
const PAIRS = Number(process.argv[4] ?? 11);
const steps = (dir) => {
  const hostDir = pathToFileURL(resolve(dir) + '/').href;
  return `const { readFile } = await import('node:fs/promises');
const { wasiImports } = await import(${JSON.stringify(new URL('lib/host/wasi.js', hostDir).href)});
const t = [performance.now()];
const bytes = await readFile(new URL('backstop.wasm', ${JSON.stringify(hostDir)})); t.push(performance.now());
const module = await WebAssembly.compile(bytes); t.push(performance.now());
const wasi = wasiImports();
const { exports: e } = await WebAssembly.instantiate(module, { wasi_snapshot_preview1: wasi.imports }); t.push(performance.now());
wasi.bind(e.memory); e._initialize(); t.push(performance.now());
const name = new TextEncoder().encode('default');
new Uint8Array(e.memory.buffer).set(name, e.buffer(4096));
e.policy_preset(name.length); t.push(performance.now());
process.stdout.write(JSON.stringify(t.slice(1).map((x, i) => x - t[i])));`;
};
const run = (src) => JSON.parse(execFileSync(process.execPath, ['--input-type=module', '-e', src], { encoding: 'utf8' }));
const res = { before: [], after: [] };
for (let i = 0; i < PAIRS; i++) {
  for (const k of i % 2 ? ['after', 'before'] : ['before', 'after']) res[k].push(run(steps(dirs[k])));
}
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[s.length >> 1]; };
const names = ['read', 'compile', 'instantiate', '_initialize', 'first policy_preset'];
names.forEach((n, j) => {
  const b = res.before.map((r) => r[j]), a = res.after.map((r) => r[j]);
  console.log(`${n}: before ${median(b).toFixed(1)} ms, after ${median(a).toFixed(1)} ms, paired ratio ${median(a.map((x, i) => x / b[i])).toFixed(2)}`);
});
