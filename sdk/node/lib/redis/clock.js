// The Redis server's clock as a worker can tell it (Go's serverClock,
// queue/redisqueue/clock.go): the worker's own clock plus the offset TIME
// showed at the last sync. The scripts stamp first_enqueued_ms with TIME, so
// a job's elapsed time (the policy's max_elapsed) is measured on this clock:
// workers whose clocks differ by minutes decide alike.

// How often a worker reads the server's clock again, in ms.
export const CLOCK_SYNC_MS = 10_000;

export class ServerClock {
  #q;
  #offsetMs = 0; // TIME minus the local clock at the last sync
  #syncedAt = null; // performance.now() of the last sync

  /** The clock of queue's server (Queue.serverTimeMs()). */
  constructor(queue) {
    this.#q = queue;
  }

  /** The server's time in unix ms, as of the last sync (this machine's before the first). */
  now() {
    return Date.now() + this.#offsetMs;
  }

  /**
   * Reads TIME when the last sync is older than CLOCK_SYNC_MS, taking the
   * middle of the round trip as the moment Redis read its clock. A failed
   * read keeps the last offset (the next job tries again).
   */
  async sync() {
    if (this.#syncedAt !== null && performance.now() - this.#syncedAt < CLOCK_SYNC_MS) return;
    const before = Date.now();
    let server;
    try {
      server = await this.#q.serverTimeMs();
    } catch {
      return;
    }
    const after = Date.now();
    this.#offsetMs = Math.round(server - (before + after) / 2);
    this.#syncedAt = performance.now();
  }
}
