// backstop-policy: backstop's retry policy (backstop.wasm) for JavaScript.
import { loadPolicy as load } from './lib/host/policy.js';
import { readBundledWasm } from './lib/host/wasm-file.js';

export { PolicyError, InputError } from './lib/host/errors.js';
export { RetryError } from './lib/errors.js';
export { ABI_VERSION, StateLostError } from './lib/host/instance.js';
export { retry } from './lib/retry.js';
export { attemptHeaders, backstopFastify, grpcAttemptMetadata, oneLayer } from './lib/layers.js';
export { createMetrics } from './lib/metrics.js';

/**
 * Loads a policy: a preset name ("default", "critical", "batch",
 * "fast-transient"), a JSON or YAML string, a plain object or bytes.
 */
export function loadPolicy(config, options = {}) {
  return load(config, options, readBundledWasm);
}
