// backstop-policy against the libraries Node.js services use today:
// exponential-backoff (the per-delay computation) and p-retry (the
// per-attempt overhead of a retry loop), plus loadPolicy start-up time.
// Prints a markdown table. Run: npm install && node bench.js
import { execFileSync } from 'node:child_process';
import { statSync } from 'node:fs';
import { createRequire } from 'node:module';
import pRetry from 'p-retry';
import { loadPolicy, retry } from '../../sdk/node/index.js';
import { mixed, plain } from './workloads.js';

const require = createRequire(import.meta.url);
// exponential-backoff computes a delay with DelayFactory(options, attempt)
// and its jitteredDelay getter (dist/backoff.js, BackOff.applyDelay); the
// timer it then sets is left out here.
const { DelayFactory } = require('exponential-backoff/dist/delay/delay.factory.js');
const { getSanitizedOptions } = require('exponential-backoff/dist/options.js');

const ROUNDS = Number(process.env.ROUNDS ?? 7);

// Runs fn(i) n times per round and returns the median ns per call.
function measure(fn, n) {
  for (let i = 0; i < n; i++) fn(i); // warm up: let the JIT settle
  const samples = [];
  for (let r = 0; r < ROUNDS; r++) {
    const start = process.hrtime.bigint();
    for (let i = 0; i < n; i++) fn(i);
    samples.push(Number(process.hrtime.bigint() - start) / n);
  }
  return median(samples);
}

async function measureAsync(fn, n) {
  for (let i = 0; i < n / 10; i++) await fn(i);
  const samples = [];
  for (let r = 0; r < ROUNDS; r++) {
    const start = process.hrtime.bigint();
    for (let i = 0; i < n; i++) await fn(i);
    samples.push(Number(process.hrtime.bigint() - start) / n);
  }
  return median(samples);
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s[s.length >> 1];
}


const rows = [];
let sink;

// --- one delay / one decision -------------------------------------------
const ebOptions = getSanitizedOptions({ startingDelay: 1000, timeMultiple: 2, maxDelay: 300_000, jitter: 'full', numOfAttempts: 5 });
const eb = measure((i) => {
  sink = DelayFactory(ebOptions, 1 + (i % 5)).jitteredDelay;
}, 2e6);
rows.push(['exponential-backoff 3: one jittered delay (DelayFactory + jitteredDelay)', eb]);

const policy = await loadPolicy('default'); // exponential 1s ×2, cap 300s, full jitter, 5 attempts
rows.push(['backstop-policy: decide(), 503 + attempt + random', measure((i) => { sink = policy.decide(plain[i & 1023]); }, 2e6)]);
rows.push(['backstop-policy: decide(), mixed failures (bench/decide_test.go)', measure((i) => { sink = policy.decide(mixed[i & 1023]); }, 2e6)]);
rows.push(['backstop-policy: decideMany(1024 mixed), per failure', measure(() => { sink = policy.decideMany(mixed); }, 500) / 1024]);

// The floor: backstop.wasm alone deciding a record already in memory (the
// package's internals, for this measurement only).
{
  policy.decideMany(plain.slice(0, 1));
  const { e } = policy.inst;
  const h = policy.h;
  rows.push(['backstop.wasm alone: decide_batch(1 prepared record)', measure(() => { sink = e.decide_batch(h, 0, 1, 64); }, 2e6)]);
}

// --- the retry loop: overhead per failed attempt ---------------------------
// fn fails N times, then succeeds; no delays (p-retry skips the timer for a
// 0 ms delay, and so does retry()). The same error object is thrown each
// time so that stack capture does not dominate.
const N = 9;
const busy = Object.assign(new Error('busy'), { status: 503 });
const flaky = () => {
  let left = N;
  return () => {
    if (left-- > 0) throw busy;
    return 'ok';
  };
};
const pRetryPerAttempt = (await measureAsync(() => pRetry(flaky(), { retries: N, minTimeout: 0, randomize: false }), 20_000)) / (N + 1);
rows.push([`p-retry 7: per attempt (${N} failures, then success; 0 ms delays)`, pRetryPerAttempt]);
const noDelay = await loadPolicy({ max_attempts: N + 1, backoff: { strategy: 'none' } });
const retryPerAttempt = (await measureAsync(() => retry(flaky(), { policy: noDelay }), 20_000)) / (N + 1);
rows.push([`backstop-policy retry(): per attempt (same; a decide() per failure)`, retryPerAttempt]);

// --- start-up: a fresh process until the first policy is loaded ------------
const hostDir = new URL('../../sdk/node/', import.meta.url);
const probe = `const t0 = performance.now();
const { loadPolicy } = await import(${JSON.stringify(new URL('index.js', hostDir).href)});
const p = await loadPolicy('default');
const t1 = performance.now();
await loadPolicy('critical');
process.stdout.write(JSON.stringify([t1 - t0, performance.now() - t1]));`;
// The same steps one by one, to show where the time goes.
const steps = `const { readFile } = await import('node:fs/promises');
const { wasiImports } = await import(${JSON.stringify(new URL('lib/host/wasi.js', hostDir).href)});
const t = [performance.now()];
const bytes = await readFile(new URL('backstop.wasm', ${JSON.stringify(hostDir.href)})); t.push(performance.now());
const module = await WebAssembly.compile(bytes); t.push(performance.now());
const wasi = wasiImports();
const { exports: e } = await WebAssembly.instantiate(module, { wasi_snapshot_preview1: wasi.imports }); t.push(performance.now());
wasi.bind(e.memory); e._initialize(); t.push(performance.now());
const name = new TextEncoder().encode('default');
new Uint8Array(e.memory.buffer).set(name, e.buffer(4096));
e.policy_preset(name.length); t.push(performance.now());
process.stdout.write(JSON.stringify(t.slice(1).map((x, i) => x - t[i])));`;
const run = (src) => JSON.parse(execFileSync(process.execPath, ['--input-type=module', '-e', src], { encoding: 'utf8' }));
const starts = Array.from({ length: 11 }, () => run(probe));
const parts = Array.from({ length: 11 }, () => run(steps));
const startup = median(starts.map((s) => s[0]));
const second = median(starts.map((s) => s[1]));
const part = (i) => median(parts.map((p) => p[i]));

// --- report ------------------------------------------------------------------
const fmt = (ns) => (ns >= 1000 ? `${(ns / 1000).toFixed(2)} µs` : `${ns.toFixed(1)} ns`);
console.log(`Node.js ${process.version}, ${ROUNDS} rounds, median\n`);
console.log('| benchmark | time/op | vs exponential-backoff |');
console.log('|---|---:|---:|');
for (const [name, ns] of rows.slice(0, 5)) console.log(`| ${name} | ${fmt(ns)} | ${(ns / eb).toFixed(2)}× |`);
console.log('\n| retry loop | time/attempt | vs p-retry |');
console.log('|---|---:|---:|');
for (const [name, ns] of rows.slice(5)) console.log(`| ${name} | ${fmt(ns)} | ${(ns / pRetryPerAttempt).toFixed(2)}× |`);
console.log('\n| start-up (fresh process, median of 11) | ms |');
console.log('|---|---:|');
console.log(`| import + loadPolicy('default') | ${startup.toFixed(1)} |`);
console.log(`| … read backstop.wasm (${(statSync(new URL('backstop.wasm', hostDir)).size / 2 ** 20).toFixed(1)} MiB) | ${part(0).toFixed(1)} |`);
console.log(`| … WebAssembly.compile | ${part(1).toFixed(1)} |`);
console.log(`| … WebAssembly.instantiate | ${part(2).toFixed(1)} |`);
console.log(`| … _initialize (Go runtime and package init) | ${part(3).toFixed(1)} |`);
console.log(`| … first policy_preset (parses the preset's YAML) | ${part(4).toFixed(1)} |`);
console.log(`| a second loadPolicy('critical') in the same process | ${second.toFixed(2)} |`);
