// The shared queue cases (testdata/queue/cases.json, see its README) replayed
// through the Node.js worker's path against a real redis-server: the job as
// read() gives it, the failure classified, decided by backstop.wasm and
// applied through the scripts (Queue.apply), then every key compared with
// what the Go worker left.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, test } from 'node:test';
import { loadPolicy } from '../index.js';
import { errorText } from '../lib/outcome.js';
import { createQueue } from '../lib/redis.js';
import { canonical, caseError, classify, deadlineError as workerDeadline, FIELDS, timesAsOffsets } from '../test-support/cases.js';
import { inspector, standalone } from '../test-support/clients.js';
import { serverNow } from '../test-support/queue-suite.js';
import { startRedis } from '../test-support/redis-server.js';

const FILE = JSON.parse(
  readFileSync(process.env.BACKSTOP_QUEUE_CASES ?? new URL('../../../testdata/queue/cases.json', import.meta.url), 'utf8'),
);
const NOW = /\{now([+-][0-9]+)?\}/g;
const NEW_ID = /\b[0-9]{13}-[0-9]+\b/g;

const server = await startRedis();
const raw = inspector(server);
const kind = standalone['ioredis 6'];
let client;
let policy;
before(async () => {
  client = await kind.connect(server);
  policy = await loadPolicy(FILE.policy);
});
after(async () => {
  policy.close();
  await kind.close(client);
  await raw.close();
  await server.stop();
});

// The policy, reporting the failure it was asked about.
function spy() {
  const s = {
    asked: null,
    outcome: (e) => {
      if (e.event === 'failure') {
        s.asked = {};
        for (const [k, f2] of FIELDS) if (e[f2]) s.asked[k] = e[f2];
      }
      return policy.outcome(e);
    },
  };
  return s;
}

const pairs = (flat) => Array.from({ length: flat.length / 2 }, (_, i) => [flat[2 * i], flat[2 * i + 1]]);

async function setup(keys, state) {
  await raw('FLUSHALL');
  const base = await serverNow(raw);
  const known = new Set([0]);
  const res = (s) =>
    s.replace(NOW, (_, off) => {
      known.add(Number(off ?? 0));
      return String(base + Number(off ?? 0));
    });
  const add = async (key, entries = []) => {
    for (const e of entries) await raw('XADD', key, res(e.id), ...e.fields.map(res));
  };
  await add(keys.jobs, state.jobs);
  await raw('XGROUP', 'CREATE', keys.jobs, FILE.group, '0', 'MKSTREAM');
  for (const e of state.jobs ?? []) {
    const p = e.pending;
    if (p) await raw('XCLAIM', keys.jobs, FILE.group, p.consumer, 0, res(e.id), 'IDLE', p.idle_ms, 'RETRYCOUNT', p.deliveries, 'FORCE', 'JUSTID');
  }
  await add(keys.dlq, state.dlq);
  for (const m of state.delayed ?? []) await raw('ZADD', keys.delayed, res(m.score), res(m.member));
  for (const [f, v] of Object.entries(state.stats ?? {})) await raw('HSET', keys.stats, f, res(v));
  for (const cmd of state.raw ?? []) await raw(...cmd.map(res));
  return { base, known, resolve: res };
}

async function dump(keys) {
  const names = Object.fromEntries(Object.entries(keys).map(([k, v]) => [v, k]));
  const out = {};
  for (const key of (await raw('KEYS', '*')).sort()) {
    const name = names[key] ?? key;
    const type = await raw('TYPE', key);
    if (type === 'stream') {
      const entries = (await raw('XRANGE', key, '-', '+')).map(([id, f]) => [id, f]);
      const groups = [];
      for (const g of await raw('XINFO', 'GROUPS', key)) {
        const info = Object.fromEntries(pairs(g));
        const pend = (await raw('XPENDING', key, info.name, '-', '+', 10000)).map(([id, c, , n]) => [id, c, n]);
        groups.push({ name: info.name, last_delivered_id: info['last-delivered-id'], pending: pend });
      }
      out[name] = { type, entries, groups };
    } else if (type === 'zset') {
      out[name] = { type, members: pairs(await raw('ZRANGE', key, 0, -1, 'WITHSCORES')) };
    } else if (type === 'hash') {
      out[name] = { type, fields: Object.fromEntries(pairs(await raw('HGETALL', key))) };
    } else if (type === 'string') {
      out[name] = { type, value: await raw('GET', key) };
    } else {
      out[name] = { type };
    }
  }
  return out;
}

// The error the worker makes at a handler's deadline, for the cases whose
// handler overran it (`deadline`): 50 ms, as Go's replay.
const deadlineError = await workerDeadline(50);

// As the Go applier does (testdata/queue/README.md): new stream ids in order
// of first appearance in the canonical JSON, then times as offsets; the
// deadline error's text as {deadline_error}.
function normalise(reply, state, base, end, known) {
  const ids = new Map();
  const s = timesAsOffsets(
    canonical([reply, state]).replaceAll(errorText(deadlineError), '{deadline_error}').replace(NEW_ID, (id) => {
      if (!ids.has(id)) ids.set(id, `new:${ids.size + 1}`);
      return ids.get(id);
    }),
    base,
    end,
    known,
  );
  return JSON.parse(s);
}

// The job as read() gives it: the entry copied to a scratch stream and read
// there, so the case's own state is untouched (read takes new entries only).
async function readAs(entryId, fields) {
  const scratch = createQueue(client, 'scratch', { group: FILE.group });
  await raw('XADD', scratch.keys.jobs, entryId, ...fields);
  await raw('XGROUP', 'CREATE', scratch.keys.jobs, FILE.group, '0');
  const [job] = await scratch.read('scratch', { count: 1 });
  await raw('DEL', scratch.keys.jobs);
  return job;
}

async function run(q, c) {
  const { base, known, resolve } = await setup(q.keys, c.state);
  // Entry ids may be times too ("{now-1000}-0").
  const ev = { ...c.event };
  if (ev.entry !== undefined) ev.entry = resolve(ev.entry);
  if (Array.isArray(ev.entries)) ev.entries = ev.entries.map(resolve);
  const apply = async (job) => {
    // The worker's path (work()): a malformed job is not run.
    let out;
    const p = spy();
    try {
      const error = ev.deadline ? deadlineError : ev.error ? caseError(ev.error) : null;
      out = await q.apply(job, job.malformed ? null : error, p, { classify });
    } catch (err) {
      if (err instanceof TypeError) throw err;
      return { refused: true };
    }
    const r = { action: out.action, reason: out.reason, applied: out.applied };
    if (p.asked) r.failure = p.asked;
    if (out.action === 'retry') {
      r.delay_ms = out.decision.delayMs;
      known.add(out.decision.delayMs);
    }
    return r;
  };
  let reply;
  try {
    if (ev.type === 'handle') {
      const [[id, fields]] = await raw('XRANGE', q.keys.jobs, ev.entry, ev.entry);
      reply = await apply(await readAs(id, fields));
    } else if (ev.type === 'read') {
      // The reader alone: the job read() gives for the entry.
      const [[id, fields]] = await raw('XRANGE', q.keys.jobs, ev.entry, ev.entry);
      const job = await readAs(id, fields);
      // Numbers as decimal text, as the cases have them: normalising rewrites
      // a time in the JSON text, which a bare number would leave invalid.
      reply = {
        job: job.malformed
          ? { malformed: true }
          : {
              id: job.id, attempt: String(job.attempt), first_enqueued_ms: String(job.firstEnqueuedMs), payload: job.payload,
              type: job.type, last_error: job.lastError, last_reason: job.lastReason, prev_delay_ms: String(job.prevDelayMs),
              malformed: false,
            },
      };
    } else if (ev.type === 'defer') {
      // The policy refused the job (an open breaker, an empty budget).
      const due = await q.defer(ev.entry, ev.delay_ms ?? 0, ev.reason ?? '', ev.last_error ?? '');
      known.add(ev.delay_ms ?? 0);
      reply = { action: 'defer', reason: ev.reason, applied: due !== null, delay_ms: ev.delay_ms ?? 0 };
    } else if (ev.type === 'promote') {
      const p = await q.promote(ev.limit ?? 0);
      reply = { moved: p.moved, next_due: p.nextDueMs !== null };
    } else if (ev.type === 'reclaim') {
      const rec = await q.reclaim(FILE.consumer, { minIdleMs: ev.min_idle_ms ?? 0, count: ev.count ?? 0, maxDeliveries: ev.max_deliveries ?? 0 });
      const outcomes = [];
      for (const j of rec.jobs) outcomes.push(await apply(j));
      reply = {
        dead_lettered: rec.deadLettered, claimed: rec.jobs.map((j) => j.entryId),
        skipped: rec.skipped.map((s) => [s.entryId, s.reason]), outcomes,
      };
    } else if (ev.type === 'run') {
      const ran = ev.before
        ? await q.run({ dueBefore: Number(resolve(ev.before)), limit: ev.limit ?? 0 })
        : await q.run({ id: ev.job_id ?? '' });
      reply = { moved: ran.moved, left: ran.left };
    } else if (ev.type === 'replay') {
      const opts = { limit: ev.limit ?? 0, reason: ev.reason ?? '' };
      if (ev.job_type) opts.type = ev.job_type;
      reply = { replayed: await q.replay(opts) };
    } else if (ev.type === 'hold') {
      reply = { held: await q.hold(ev.consumer, ev.entries) };
    } else if (ev.type === 'enqueue') {
      reply = { entry: await q.enqueue(ev.job_id ?? '', ev.payload ?? '', { type: ev.job_type ?? '' }) };
    } else {
      throw new Error(`unknown event ${ev.type}`);
    }
  } catch (err) {
    if (err.message?.startsWith('unknown event')) throw err;
    reply = { refused: true };
  }
  const end = await serverNow(raw);
  return normalise(reply, await dump(q.keys), base, end, known);
}

test('at least 200 cases', () => assert.ok(FILE.cases.length >= 200, `${FILE.cases.length} cases`));

for (const c of FILE.cases) {
  test(c.name, async () => {
    const q = createQueue(client, FILE.queue, { group: FILE.group });
    assert.deepEqual(await run(q, c), [c.expect.reply, c.expect.state]);
  });
}
