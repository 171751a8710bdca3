// testdata/idempotency (the shared cases every store answers the same way)
// for the Node tests that replay them through a store: the Redis store
// (test/idempotency-cases.test.js) and the PostgreSQL one
// (test/idempotency-postgres.test.js). Each supplies a raw adapter for the
// steps that reach under the store. (Outside test/ so that `node --test`
// does not take it for a test file.)
import { readFileSync } from 'node:fs';
import { LeaseLostError } from '../lib/idempotency.js';

export const FILE = JSON.parse(readFileSync(new URL('../../../testdata/idempotency/cases.json', import.meta.url), 'utf8'));

/**
 * Runs case c's steps through store and raw and resolves to {replies,
 * final}. raw: reset() (remove the record), lapse() (the owner's lease ran
 * out a second ago), expire() (the retention ran out), write(fields) (a
 * record as the Redis hash's fields), record(tokens) (the record as the
 * cases compare it; tokens: caller → token).
 */
export async function replayCase(store, raw, c) {
  await raw.reset();
  const tokens = {};
  const replies = [];
  for (const st of c.steps) {
    if (st.op === 'begin') {
      const cl = await store.begin(FILE.scope, FILE.key, st.request);
      const r = { state: cl.state };
      if (cl.state === 'started') {
        tokens[st.caller] = cl.token;
        r.taken_over = cl.takenOver;
      } else if (cl.state === 'in_progress') r.retry_after_s = cl.retryAfterS;
      else if (cl.state === 'completed') {
        Object.assign(r, { status: cl.response.status, headers: cl.response.headers, too_large: cl.response.tooLarge,
          body_b64: cl.response.body.toString('base64') });
        if (cl.response.truncated) r.truncated = true;
      }
      replies.push(r);
    } else if (st.op === 'complete' || st.op === 'fail') {
      const tok = tokens[st.caller] ?? `never-begun-${st.caller}`;
      try {
        if (st.op === 'complete') {
          await store.complete(FILE.scope, FILE.key, tok, {
            status: st.status, headers: st.headers ?? {}, body: Buffer.from(st.body_b64 ?? '', 'base64'), truncated: st.truncated === true,
          });
        } else await store.fail(FILE.scope, FILE.key, tok);
        replies.push({ ok: true });
      } catch (err) {
        if (!(err instanceof LeaseLostError)) throw err;
        replies.push({ error: 'lease_lost' });
      }
    } else if (st.op === 'lapse') await raw.lapse();
    else if (st.op === 'expire') await raw.expire();
    else if (st.op === 'write') await raw.write(st.fields);
    else throw new Error(`unknown op ${st.op}`);
  }
  return { replies, final: await raw.record(tokens) };
}
