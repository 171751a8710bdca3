// Paired, in one process: the Policy methods of one call each (acquire,
// recordSuccess, circuitState, budgetTokens, attemptTimeout) of two copies of
// sdk/node, CPU time per round of 100k calls, the order swapped each round.
// node bench/issue41_node_calls.mjs BEFORE/sdk/node AFTER/sdk/node
// (each copy with its backstop.wasm, errorkinds.json, scripts/ and node_modules).
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const [before, after] = await Promise.all(process.argv.slice(2, 4).map((d) => import(pathToFileURL(resolve(d, 'index.js')).href)));
const T = 1_700_000_000_000;
const mk = async (m) => ({ st: await m.loadPolicy({ retry_budget: { max_tokens: 100, token_ratio: 0.5 }, circuit_breaker: {} }), sl: await m.loadPolicy('default') });
const P = { before: await mk(before), after: await mk(after) };
const calls = (p) => {
  for (let i = 0; i < 20000; i++) {
    p.acquire(T + i);
    p.recordSuccess(T + i);
    p.circuitState(T + i);
    p.budgetTokens(T + i);
    p.attemptTimeout(i);
  }
};
const cpu = () => {
  const u = process.cpuUsage();
  return u.user + u.system;
};
for (const kind of ['st', 'sl']) {
  for (const k of ['before', 'after', 'before', 'after']) calls(P[k][kind]); // warm-up
  const ratios = [];
  for (let r = 0; r < 15; r++) {
    const t = {};
    for (const k of r % 2 ? ['after', 'before'] : ['before', 'after']) {
      const c0 = cpu();
      calls(P[k][kind]);
      t[k] = cpu() - c0;
    }
    ratios.push(t.after / t.before);
  }
  ratios.sort((a, b) => a - b);
  console.log(`${kind === 'st' ? 'stateful' : 'stateless'}: after/before CPU, median ${ratios[7].toFixed(3)} (IQR ${ratios[3].toFixed(3)}–${ratios[11].toFixed(3)}), 15 rounds`);
}
