// The one place where the Node tests wait: for a condition they can observe,
// polled until a deadline. The deadline catches a hang; it is never what a
// test asserts, so it is generous. (Outside test/ so that `node --test` does
// not take it for a test file.)
import { setTimeout as pause } from 'node:timers/promises';

/** The pause between two checks of a condition, in ms. */
export const POLL_MS = 10;

/**
 * Polls fn (sync or async) until it returns a truthy value and resolves to
 * that value; rejects, naming what it waited for, once ms have passed.
 *
 * @example
 * await until('the retry to be due', async () => (await q.promote()).moved === 1);
 */
export async function until(what, fn, ms = 30_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() >= deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await pause(POLL_MS);
  }
}
