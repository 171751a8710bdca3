// Paired per-decision cost of two copies of sdk/node in one process:
//   [LOAD=after] node bench/issue41_node.mjs BEFORE/sdk/node AFTER/sdk/node [rounds]
// Each round times every workload on both copies (the order swapped each
// round); prints the median ns per call of each and the median of the
// per-round ratios after/before, by the process's CPU time (what a shared,
// loaded machine disturbs least) and by wall time. The workloads are
// bench/node/bench.js's, and two rarer inputs: invalid failures (the failure
// value's path, decide_value) and a BigInt attempt.
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { mixed, plain } from './node/workloads.js';

const [beforeDir, afterDir] = process.argv.slice(2, 4);
const ROUNDS = Number(process.argv[4] ?? 25);
const load = async (dir) => (await import(pathToFileURL(resolve(dir, 'index.js')).href)).loadPolicy('default');
// The copy loaded second can run faster (V8's code placement): LOAD=after
// loads the after copy first; run it both ways.
// ONLY=before or ONLY=after loads that copy alone (for pairs of processes,
// bench/paired.sh): its lines then give that copy's figures.
const trees = {};
const only = process.env.ONLY;
if (only) trees[only] = await load(only === 'before' ? beforeDir : afterDir);
else {
  if (process.env.LOAD === 'after') trees.after = await load(afterDir);
  trees.before = await load(beforeDir);
  trees.after ??= await load(afterDir);
}


let sink;
// Invalid failures (wrong types, an unknown name: each an InputError, from
// decide_value), and valid ones with a BigInt attempt.
const invalid = [{ attempt: 'x' }, { attempt: 1, http_stauts: 503 }, { attempt: 1.5 }, { attempt: 1, httpStatus: 503, retriedDownstream: 1 }];
const big = plain.map((f) => ({ ...f, attempt: BigInt(f.attempt) }));
const workloads = {
  'decide(), a 503': [(p, i) => { sink = p.decide(plain[i & 1023]); }, 200_000, 1],
  'decide(), mixed': [(p, i) => { sink = p.decide(mixed[i & 1023]); }, 200_000, 1],
  'decideMany(1024 mixed), per failure': [(p) => { sink = p.decideMany(mixed); }, 200, 1024],
  'decide(), an invalid failure': [(p, i) => { try { p.decide(invalid[i & 3]); } catch (err) { sink = err; } }, 20_000, 1],
  'decide(), a BigInt attempt': [(p, i) => { sink = p.decide(big[i & 1023]); }, 20_000, 1],
};
const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) * 1000; };
const time = (fn, p, n, per) => {
  const t = process.hrtime.bigint();
  const c = cpu();
  for (let i = 0; i < n; i++) fn(p, i);
  return [(cpu() - c) / n / per, Number(process.hrtime.bigint() - t) / n / per];
};
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s.length % 2 ? s[s.length >> 1] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2; };

const res = {};
for (const [name, [fn, n, per]] of Object.entries(workloads)) {
  for (const p of Object.values(trees)) time(fn, p, n, per); // warm up both
  res[name] = { before: [], after: [] };
  res[name + ', wall'] = { before: [], after: [] };
}
for (let r = 0; r < ROUNDS; r++) {
  const order = r % 2 ? ['after', 'before'] : ['before', 'after'];
  for (const [name, [fn, n, per]] of Object.entries(workloads)) {
    for (const k of order.filter((k) => k in trees)) {
      const [c, w] = time(fn, trees[k], n, per);
      res[name][k].push(c);
      res[name + ', wall'][k].push(w);
    }
  }
}
console.log(`Node.js ${process.version}, ${ROUNDS} rounds, ${process.env.LOAD === 'after' ? 'after' : 'before'} loaded first, medians (min–max); CPU time unless marked wall`);
for (const [name, { before, after }] of Object.entries(res)) {
  const f = (xs) => `${median(xs).toFixed(1)} (${Math.min(...xs).toFixed(1)}–${Math.max(...xs).toFixed(1)})`;
  if (only) {
    console.log(`${name}: ${only} ${median(res[name][only]).toFixed(1)} ns`);
    continue;
  }
  const ratios = before.map((b, i) => after[i] / b);
  console.log(`${name}: before ${f(before)} ns, after ${f(after)} ns, paired ratio ${median(ratios).toFixed(2)} (${Math.min(...ratios).toFixed(2)}–${Math.max(...ratios).toFixed(2)})`);
}
