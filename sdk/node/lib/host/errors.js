// The errors of backstop.wasm's refusals: a policy it cannot load, a
// failure it cannot decide.

/**
 * A policy (bytes, object or preset name) that backstop.wasm refused. The
 * message is the module's and names every invalid field:
 * `invalid policy: backoff.cap: must be >= backoff.base (got 100ms < 1s)`.
 */
export class PolicyError extends Error {
  constructor(message) {
    super(message);
    this.name = 'PolicyError';
    // "invalid policy: a.b: reason; c: reason" → [{field, reason}, ...]
    const rest = message.startsWith('invalid policy: ') ? message.slice(16) : message;
    this.problems = rest.split('; ').map((p) => {
      const i = p.indexOf(': ');
      return i < 0 ? { field: '', reason: p } : { field: p.slice(0, i), reason: p.slice(i + 2) };
    });
    this.field = this.problems[0].field;
  }
}

/**
 * An invalid failure passed to decide(): a field out of range, of the
 * wrong type or unknown. The message is the one every backstop host
 * reports, `attempt: must be >= 1 (got 0)` (testdata/vectors/inputs.json).
 * No policy state changed for it. From decideMany, `index` is the position
 * of the first invalid failure and `decisions` the decisions of the whole
 * batch, null where invalid.
 */
export class InputError extends Error {
  constructor(field, reason, index) {
    super((index === undefined ? '' : `failures[${index}]: `) + `${field}: ${reason}`);
    this.name = 'InputError';
    this.field = field;
    this.reason = reason;
    if (index !== undefined) this.index = index;
  }
}
