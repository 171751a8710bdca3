// Paired: decide() and decideMany() of two copies of sdk/node (say a
// commit before a change and after it) in one process, A and B in turn each
// round (the order swapped every round), on bench.js's workloads; prints
// the medians and the median of the per-round ratios B/A. The copy loaded
// second ran faster in some runs: run it again with the copies swapped.
// Usage: [N=per round] [ONLY=plain,mixed,wasm,many] node paired.js <sdkA> <sdkB> [rounds]
import { pathToFileURL } from 'node:url';
import { mixed, plain } from './workloads.js';
const [a, b] = [process.argv[2], process.argv[3]];
const ROUNDS = Number(process.argv[4] ?? 15);
const A = await (await import(pathToFileURL(a + '/index.js'))).loadPolicy('default');
const B = await (await import(pathToFileURL(b + '/index.js'))).loadPolicy('default');
let sink;
const benches = {
  plain: [(p) => (i) => { sink = p.decide(plain[i & 1023]); }, Number(process.env.N ?? 1e6), 1],
  mixed: [(p) => (i) => { sink = p.decide(mixed[i & 1023]); }, Number(process.env.N ?? 1e6), 1],
  wasm: [(p) => { p.decideMany(plain.slice(0, 1)); const { e } = p.inst; const h = p.h; return () => { sink = e.decide_batch(h, 0, 1, 64); }; }, Number(process.env.N ?? 1e6), 1],
  many: [(p) => () => { sink = p.decideMany(mixed); }, Math.max(1, Number(process.env.N ?? 1e6) / 3000 | 0), 1024],
};
const median = (xs) => { const s = [...xs].sort((x, y) => x - y); return s.length % 2 ? s[s.length >> 1] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; };
for (const [name, [mk, n, per]] of Object.entries(benches)) {
  if (process.env.ONLY && !process.env.ONLY.split(',').includes(name)) continue;
  const fa = mk(A), fb = mk(B);
  for (let i = 0; i < n; i++) { fa(i); fb(i); } // warm up
  const sa = [], sb = [], ratio = [];
  for (let r = 0; r < ROUNDS; r++) {
    const order = r & 1 ? [[fb, sb], [fa, sa]] : [[fa, sa], [fb, sb]];
    for (const [fn, s] of order) {
      const t = process.hrtime.bigint();
      for (let i = 0; i < n; i++) fn(i);
      s.push(Number(process.hrtime.bigint() - t) / n / per);
    }
    ratio.push(sb[r] / sa[r]);
  }
  console.log(`${name}: A median ${median(sa).toFixed(1)} (min ${Math.min(...sa).toFixed(1)}) ns, B median ${median(sb).toFixed(1)} (min ${Math.min(...sb).toFixed(1)}) ns, B/A median of per-round ratios ${median(ratio).toFixed(3)} (${ROUNDS} rounds)`);
}
