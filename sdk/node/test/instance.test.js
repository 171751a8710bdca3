// The module instance: its memory stays bounded, its clock is virtual, and a
// trap retires only that instance (wasm/ABI.md, "Clocks" and "When an
// instance traps").
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { loadPolicy, StateLostError } from '../index.js';

const bytes = readFileSync(new URL('../backstop.wasm', import.meta.url));
const PAGE = 64 << 10;
const MAX_BUFFER = 64 << 20;

const STATEFUL = {
  max_attempts: 8,
  retry_budget: { type: 'token_bucket', max_tokens: 6, token_ratio: 0.5 },
  circuit_breaker: { failure_threshold: 4, open_for: '2s', half_open_successes: 1 },
};
const FAILURE = { attempt: 1, httpStatus: 503, nowMs: 1_700_000_000_000, random: 0.5 };

const pages = (inst) => inst.memory.buffer.byteLength / PAGE;

// A policy of about 3.9 KB: a long classification table.
function policy3900() {
  const http = {};
  for (let code = 100; JSON.stringify(http).length < 3700; code++) http[code] = 'permanent';
  return JSON.stringify({ max_attempts: 8, backoff: { strategy: 'exponential', base: '1s', multiplier: 2, cap: '300s' }, classify: { http } });
}

// A private instance of the module, so that the tests do not share one.
async function instance() {
  const wasm = await WebAssembly.compile(bytes);
  const p = await loadPolicy('default', { wasm });
  return { wasm, inst: p.inst, p };
}

test('loading and closing policies keeps memory bounded', async () => {
  const { wasm, inst } = await instance();
  const data = policy3900();
  for (let i = 0; i < 1500; i++) (await loadPolicy(data, { wasm })).close();
  assert.ok(pages(inst) <= 400, `${pages(inst)} pages after 1,500 load/close cycles`); // about 150 are used
});

test('growing the buffer to its maximum keeps memory bounded', async () => {
  // Growing it a little at a time used to leave about 6,000 pages (375 MiB)
  // of memory behind, and to trap at 28 MiB when the GC had stopped.
  const { inst } = await instance();
  for (let n = PAGE; n <= MAX_BUFFER; n += PAGE) assert.ok(inst.call(() => inst.e.buffer(n)) > 0, `buffer(${n})`);
  assert.ok(pages(inst) <= (3 * MAX_BUFFER) / PAGE, `${pages(inst)} pages for a 64 MiB buffer`);
  assert.equal(inst.call(() => inst.e.buffer(MAX_BUFFER + 1)), -4);
  assert.match(inst.lastError(), /size must be in 0\.\.67108864 \(got 67108865\)/);
});

test('the module reads virtual time, never the host clock', async () => {
  const { wasm, inst } = await instance();
  const start = inst.wasi.now;
  for (let i = 0; i < 50; i++) {
    const p = await loadPolicy({ max_attempts: 3, classify: { http: { 418: 'retryable' } } }, { wasm });
    p.decide({ attempt: 1, httpStatus: 418 });
    p.close();
  }
  // 1 ms per call (load, stateful, on_open, connect_timeout, free; decide does not step),
  // 1 ns per reading: the Go runtime reads the clock about 20 times per GC cycle.
  const ns = inst.wasi.now - start;
  assert.equal(ns / 1_000_000n, 250n);
  assert.ok(ns % 1_000_000n < 100_000n, `${ns} ns`);
});

// Makes the instance trap cheaply and for real: with its memory grown to the
// wasm32 maximum, a 40 MiB buffer runs the Go runtime inside out of memory.
function exhaustMemory(inst) {
  inst.memory.grow(65536 - pages(inst));
  assert.throws(() => inst.reserve(40 << 20), /backstop\.wasm crashed/);
}

test('a trap retires only its instance: stateless policies carry on, stateful ones report their state lost', async () => {
  const { wasm, inst, p: stateless } = await instance();
  const stateful = await loadPolicy(STATEFUL, { wasm });
  assert.ok(stateful.stateful && !stateless.stateful);
  const before = stateless.decide(FAILURE);
  stateful.decide(FAILURE);

  exhaustMemory(inst);

  for (let i = 0; i < 2; i++) {
    // the same error every time
    for (const call of [
      () => stateful.decide(FAILURE),
      () => stateful.decideMany([FAILURE]),
      () => stateful.recordSuccess(FAILURE.nowMs),
      () => stateful.circuitState(FAILURE.nowMs),
      () => stateful.acquire(FAILURE.nowMs),
      () => stateful.budgetTokens(FAILURE.nowMs),
    ]) {
      assert.throws(call, { name: 'StateLostError', message: /retry budget and circuit breaker were lost .*; load the policy again$/ });
    }
  }
  stateful.close();

  assert.deepEqual(stateless.decide(FAILURE), before);
  assert.deepEqual(stateless.decideMany([FAILURE, FAILURE]), [before, before]);
  assert.deepEqual((await loadPolicy('default', { wasm })).decide(FAILURE), before);
  const again = await loadPolicy(STATEFUL, { wasm });
  assert.ok(again.stateful && again.decide(FAILURE).action === 'retry');
});

test('a trap in the bundled module instance spares the other policies', async () => {
  const stateless = await loadPolicy('default');
  const stateful = await loadPolicy(STATEFUL);
  stateful.decide(FAILURE);

  exhaustMemory(stateless.inst);

  assert.throws(() => stateful.decide(FAILURE), StateLostError); // the class the package exports
  assert.equal(stateless.decide(FAILURE).action, 'retry');
  assert.equal((await loadPolicy('default')).decide(FAILURE).action, 'retry');
  assert.equal((await loadPolicy(STATEFUL)).decide(FAILURE).action, 'retry');
});

test('if no fresh instance can start, the instance is retired and the next load starts another', async () => {
  const { wasm, inst, p } = await instance();
  inst.restart = () => {
    throw new Error('no memory');
  };
  exhaustMemory(inst);
  assert.throws(() => p.decide(FAILURE), /backstop\.wasm crashed; load the policy again/);
  const fresh = await loadPolicy('default', { wasm });
  assert.notEqual(fresh.inst, inst);
  assert.equal(fresh.decide(FAILURE).action, 'retry');
});

test('the WASI clocks are virtual: 1 ns per reading, 1 ms per call, sleeps return at once', async () => {
  const { wasiImports } = await import('../lib/host/wasi.js');
  const wasi = wasiImports();
  const memory = new WebAssembly.Memory({ initial: 1 });
  wasi.bind(memory);
  const dv = new DataView(memory.buffer);
  const read = (id) => {
    assert.equal(wasi.imports.clock_time_get(id, 0n, 8), 0);
    return dv.getBigUint64(8, true);
  };
  assert.equal(read(1), 1n);
  assert.equal(read(1), 2n);
  assert.equal(read(0), 1_640_995_200_000_000_003n); // 2022-01-01T00:00:00Z + 3 ns
  assert.equal(wasi.imports.clock_time_get(2, 0n, 8), 28); // EINVAL: no CPU-time clocks
  wasi.tick();
  assert.equal(read(1), 1_000_004n);
  // A sleep: one relative clock subscription of 5 ms (userdata 7).
  const sub = 64;
  dv.setBigUint64(sub, 7n, true);
  dv.setUint8(sub + 8, 0); // clock
  dv.setUint32(sub + 16, 1, true); // monotonic
  dv.setBigUint64(sub + 24, 5_000_000n, true);
  dv.setUint16(sub + 40, 0, true); // relative
  assert.equal(wasi.imports.poll_oneoff(sub, 128, 1, 200), 0);
  assert.equal(dv.getUint32(200, true), 1);
  assert.equal(dv.getBigUint64(128, true), 7n);
  assert.equal(dv.getUint16(136, true), 0);
  assert.equal(wasi.now, 6_000_004n);
  // Until an absolute time on the monotonic clock.
  dv.setUint16(sub + 40, 1, true);
  dv.setBigUint64(sub + 24, 10_000_000n, true);
  wasi.imports.poll_oneoff(sub, 128, 1, 200);
  assert.equal(wasi.now, 10_000_000n);
});
