// Argument checks shared by the modules (the queues, retry, idempotency):
// errors that name the option and say what it got.

/** A value as an error message shows it. */
export function show(v) {
  if (typeof v === 'string') return JSON.stringify(v);
  if (v === null || typeof v !== 'object') return String(v);
  return Array.isArray(v) ? 'array' : 'object';
}

export function checkString(name, v) {
  if (typeof v !== 'string' || v === '') throw new TypeError(`Expected \`${name}\` to be a non-empty string (got ${show(v)})`);
}

export function checkWhole(name, v, lo, hi = Number.MAX_SAFE_INTEGER) {
  if (!Number.isSafeInteger(v) || v < lo || v > hi) {
    const want = hi === Number.MAX_SAFE_INTEGER ? `>= ${lo}` : `in ${lo}..${hi}`;
    throw new TypeError(`Expected \`${name}\` to be a whole number ${want} (got ${show(v)})`);
  }
}

/** Checks that v is a function, or undefined when optional. */
export function checkFunction(name, v, optional = false) {
  if (typeof v !== 'function' && !(optional && v === undefined)) throw new TypeError(`Expected \`${name}\` to be a function`);
}

export function checkSignal(signal) {
  if (signal !== undefined && !(typeof signal?.aborted === 'boolean' && typeof signal.addEventListener === 'function')) {
    throw new TypeError('Expected `signal` to be an AbortSignal');
  }
}
