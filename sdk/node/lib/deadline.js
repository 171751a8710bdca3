// Deadlines for one run of a function: a retry() attempt (the policy's
// attempt_timeout) and a queue job's handler (handlerTimeoutMs).

const MAX_TIMER = 0x7fffffff; // setTimeout's limit (about 24.8 days)

/**
 * A deadline ms from now for something running under parent (a signal, or
 * undefined). `context.signal` aborts with a TimeoutError (message what)
 * at the deadline, or with parent's reason when parent aborts; `expired`
 * rejects with that TimeoutError at the deadline, which `error` then holds.
 * Race what runs against `expired` so that a function ignoring its signal
 * still stops being waited for. clear() ends it, once the run is over.
 */
export function startDeadline(ms, what, parent) {
  return new Deadline(ms, what, parent);
}

// A class, not a closure: a retry() attempt makes one, and an object
// literal with a getter costs ten times more.
class Deadline {
  #c = null; // the controller, made when the signal is first read: many functions never look, and it is costly
  #parent;
  #cleared = false;
  #cancel;
  #onAbort = () => this.#c.abort(this.#parent.reason);
  error = null;

  constructor(ms, what, parent) {
    this.#parent = parent;
    this.context = new Context(this);
    this.expired = new Promise((_, reject) => {
      this.#cancel = after(ms, () => {
        this.error = new DOMException(what, 'TimeoutError');
        // First the race's rejection, then the abort: a race settles with
        // the deadline, not with what the function throws on the abort.
        reject(this.error);
        this.#c?.abort(this.error);
      });
    });
    this.expired.catch(() => {}); // a race that ended first leaves it unobserved
  }

  abortSignal() {
    if (this.#c !== null) return this.#c.signal;
    this.#c = new AbortController();
    const parent = this.#parent;
    if (this.error !== null) this.#c.abort(this.error);
    else if (parent?.aborted) this.#onAbort();
    else if (!this.#cleared) parent?.addEventListener('abort', this.#onAbort);
    return this.#c.signal;
  }

  clear() {
    this.#cleared = true;
    this.#cancel();
    if (this.#c !== null) this.#parent?.removeEventListener('abort', this.#onAbort);
  }
}

// What the function gets: {signal}.
class Context {
  #d;

  constructor(d) {
    this.#d = d;
  }

  get signal() {
    return this.#d.abortSignal();
  }
}

/** Calls fn after ms, however long (setTimeout's own limit is 24.8 days); returns what cancels it. */
export function after(ms, fn) {
  let timer;
  const arm = (left) => {
    timer = setTimeout(() => (left > MAX_TIMER ? arm(left - MAX_TIMER) : fn()), Math.min(left, MAX_TIMER));
  };
  arm(ms);
  return () => clearTimeout(timer);
}
