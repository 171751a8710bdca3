// createMetrics(): the process metrics (backstop_client_*), the same
// families, labels and buckets as Go's retry.WithMetrics and Python's
// backstop.metrics. prom-client is not a dependency: the caller passes its
// module in, so the package works without it.

// The retry_delay_seconds buckets, as in Go (retry/metrics.go) and Python.
const DELAY_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300];
const OUTCOMES = ['success', 'retry', 'dead_letter', 'refused'];
const STATES = ['closed', 'open', 'half_open'];

const FAMILIES = [
  ['attempts', 'Counter', 'backstop_client_attempts_total',
    'Calls made (or refused) under a backstop policy, by outcome: success, retry, dead_letter, refused.', ['outcome']],
  ['retries', 'Counter', 'backstop_client_retries_total', "Retries scheduled, by the policy's reason.", ['reason']],
  ['refused', 'Counter', 'backstop_client_calls_refused_total',
    'Calls refused before they were made, by reason: circuit_open, budget_exhausted.', ['reason']],
  ['delay', 'Histogram', 'backstop_client_retry_delay_seconds', 'Delay scheduled before each retry.', []],
  ['latency', 'Histogram', 'backstop_client_retry_latency_seconds',
    'Measured time from a failed attempt to the start of the next one (the decided delay is backstop_client_retry_delay_seconds).', []],
  ['state', 'Gauge', 'backstop_client_circuit_state',
    'Circuit breaker state last seen by this process: 1 for the current state, 0 for the others.', ['state']],
  ['transitions', 'Counter', 'backstop_client_circuit_transitions_total',
    'Circuit breaker state changes seen by this process.', ['from', 'to']],
  ['budget', 'Gauge', 'backstop_client_budget_tokens',
    "Retry budget left as last seen by this process: a token bucket's tokens (retries pass while more than half remain), or the retries a window budget still allows. Absent without a budget.", []],
];

// One registry's collectors, shared by every createMetrics on it.
const registries = new WeakMap();

/**
 * The metrics of one policy and target, for retry({metrics}) and queue
 * workers: `createMetrics(promClient, {policy: 'payments', target: 'charge-api'})`.
 * `registry` defaults to promClient.register. A second call on the same
 * registry reuses the collectors the first registered; a registry holding
 * other metrics under the same names is an error.
 */
export function createMetrics(promClient, options = {}) {
  if (!promClient || typeof promClient.Counter !== 'function' || typeof promClient.Histogram !== 'function' ||
      typeof promClient.Gauge !== 'function') {
    throw new TypeError('Expected `promClient` to be the prom-client module');
  }
  if (options === null || typeof options !== 'object') throw new TypeError('Expected `options` to be an object');
  const { policy, target } = options;
  for (const [name, v] of [['policy', policy], ['target', target]]) {
    if (typeof v !== 'string' || v === '') throw new TypeError(`Expected \`${name}\` to be a non-empty string`);
    if (!v.isWellFormed()) throw new TypeError(`Expected \`${name}\` to be valid UTF-8 (it has a lone surrogate)`);
  }
  const registry = options.registry ?? promClient.register;
  if (!registry || typeof registry.getSingleMetric !== 'function') {
    throw new TypeError('Expected `registry` to be a prom-client Registry');
  }
  let fam = registries.get(registry);
  if (!fam) {
    // fam.last: policy, target → the last state seen.
    fam = { last: new Map(), ...registerFamilies(promClient, registry, FAMILIES, ['policy', 'target'], DELAY_BUCKETS, 'createMetrics') };
    registries.set(registry, fam);
  }
  const labels = { policy, target };
  const key = `${policy}\u0000${target}`;
  const metrics = Object.freeze({
    policy,
    target,
    attempt(outcome) {
      if (!OUTCOMES.includes(outcome)) throw new TypeError(`Expected \`outcome\` to be one of ${OUTCOMES.join(', ')}`);
      fam.attempts.inc({ ...labels, outcome });
    },
    retry(reason, delayMs) {
      fam.retries.inc({ ...labels, reason });
      fam.delay.observe(labels, delayMs / 1000);
    },
    /** The measured time from a failed attempt to the start of the next one, in ms (negative counts as 0). */
    latency(ms) {
      fam.latency.observe(labels, Math.max(0, ms) / 1000);
    },
    refused(reason) {
      fam.attempts.inc({ ...labels, outcome: 'refused' });
      fam.refused.inc({ ...labels, reason });
    },
    /** The retry budget left (policy.budgetTokens()); null (no budget) sets nothing. */
    budget(tokens) {
      if (typeof tokens === 'number' && Number.isFinite(tokens)) fam.budget.set(labels, tokens);
    },
    state(state) {
      const s = STATES.indexOf(state);
      const last = fam.last.get(key) ?? -1;
      if (s < 0 || s === last) return;
      STATES.forEach((name, i) => fam.state.set({ ...labels, state: name }, i === s ? 1 : 0));
      if (last >= 0) fam.transitions.inc({ ...labels, from: STATES[last], to: state });
      fam.last.set(key, s);
    },
  });
  origins.set(metrics, { promClient, registry });
  return metrics;
}

// createMetrics result → {promClient, registry}: a queue worker registers its
// own families (backstop_attempts_total, …) beside the process ones.
const origins = new WeakMap();

/** The prom-client module and registry a createMetrics() result was made with, or undefined. */
export function metricsOrigin(metrics) {
  return origins.get(metrics);
}

/**
 * Registers families ([key, kind, name, help, extra labels]) on registry,
 * labelled labels then the family's own, histograms with buckets; returns
 * {key: collector}. A family registered by another copy of this package is
 * reused; another metric of that name is an error (who: register name: …).
 */
export function registerFamilies(promClient, registry, families, labels, buckets, who) {
  const fam = {};
  for (const [key, kind, name, help, extra] of families) {
    const labelNames = [...labels, ...extra];
    const existing = registry.getSingleMetric(name);
    if (existing) {
      // Registered by another copy of this package: reuse it if it is ours.
      const same = existing instanceof promClient[kind] && JSON.stringify(existing.labelNames) === JSON.stringify(labelNames);
      if (!same) throw new Error(`${who}: register ${name}: the registry holds another metric of that name`);
      fam[key] = existing;
      continue;
    }
    const opts = { name, help, labelNames, registers: [registry] };
    if (kind === 'Histogram') opts.buckets = buckets;
    fam[key] = new promClient[kind](opts);
  }
  return fam;
}
