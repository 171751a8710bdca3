// The error retry() throws when the policy says stop. The module's own
// refusals (PolicyError, InputError) are the host layer's: host/errors.js.

/**
 * Thrown by retry() when the policy says stop. It keeps why (`reason`, such
 * as `max_attempts_reached` or `permanent_error`), how many attempts ran,
 * the last error (`cause`) and, for a failed fetch Response, `response`.
 */
export class RetryError extends Error {
  constructor({ reason, attempts, cause, response, decision }) {
    const last = response
      ? `HTTP ${response.status}${response.statusText ? ` ${response.statusText}` : ''}`
      : cause instanceof Error
        ? cause.message
        : String(cause);
    super(`gave up after ${attempts} attempt${attempts === 1 ? '' : 's'} (${reason}): ${last}`, { cause });
    this.name = 'RetryError';
    this.reason = reason;
    this.attempts = attempts;
    this.decision = decision;
    if (response) this.response = response;
  }
}
