// Queue.apply and Queue.work with real policies (backstop.wasm) against a
// real redis-server, through ioredis and node-redis: the decision is taken
// locally and applied through the contract's scripts.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { loadPolicy, retry } from '../index.js';
import { createQueue } from '../lib/redis.js';
import { inspector, standalone } from '../test-support/clients.js';
import { until } from '../test-support/eventually.js';
import { counters, entries, serverNow } from '../test-support/queue-suite.js';
import { startRedis } from '../test-support/redis-server.js';

const server = await startRedis();
const raw = inspector(server);

// 5 s apart, no jitter, 3 attempts: every delay is exact.
const policies = {};
before(async () => {
  policies.steady = await loadPolicy({ max_attempts: 3, backoff: { strategy: 'constant', base: '5s', cap: '5s' }, jitter: { mode: 'none' } });
  policies.quick = await loadPolicy({ max_attempts: 2, backoff: { strategy: 'constant', base: '1ms', cap: '1ms' }, jitter: { mode: 'none' } });
  policies.worker = await loadPolicy({ max_attempts: 5, backoff: { strategy: 'constant', base: '10ms', cap: '10ms' }, jitter: { mode: 'none' } });
  policies.elapsed = await loadPolicy({ max_attempts: 10, max_elapsed: '1m', backoff: { strategy: 'constant', base: '1s', cap: '1s' }, jitter: { mode: 'none' } });
});
after(async () => {
  for (const p of Object.values(policies)) p.close();
  await raw.close();
  await server.stop();
});

// The fields of a delayed member, as queue/redisqueue/README.md lists them and the Go
// queue writes them (Queue.Retry passes the group, the entry id, the decided
// delay in ms, the decision's reason and the error's text to the same script).
const MEMBER_FIELDS = ['attempt', 'first_enqueued_ms', 'id', 'last_error', 'last_reason', 'payload', 'prev_delay_ms', 'source'];

const httpError = (status, message = `HTTP ${status}`, headers) => Object.assign(new Error(message), { status, headers });

// A policy that records what it was asked: the failure of a failure
// event (decide), the time of a success (record_success).
function spy(policy) {
  const calls = { decide: [], recordSuccess: [] };
  return {
    calls,
    outcome: (e) => {
      const { event, ...f } = e;
      if (event === 'failure') calls.decide.push(f);
      if (event === 'success') calls.recordSuccess.push(f.nowMs);
      return policy.outcome(e);
    },
  };
}

for (const name of ['ioredis 6', 'node-redis 6']) {
  const kind = standalone[name];
  describe(name, () => {
    let client;
    let n = 0;
    before(async () => {
      client = await kind.connect(server);
    });
    after(() => kind.close(client));

    async function fresh() {
      const q = createQueue(client, `apply-${name.replace(/\W+/g, '-')}-${++n}`);
      await q.ensureGroup();
      return q;
    }

    async function enqueueRead(q, id, consumer = 'c1') {
      await q.enqueue(id, `payload-${id}`);
      const [job] = await q.read(consumer, { count: 1 });
      return job;
    }

    describe('apply', () => {
      test('a 503 goes to the delayed set, due after the decided delay; the member is the one Go writes', async () => {
        const q = await fresh();
        const job = await enqueueRead(q, 'job-1');
        const t0 = await serverNow(raw);
        const outcome = await q.apply(job, httpError(503, 'upstream unavailable'), policies.steady);
        assert.deepEqual(outcome, {
          action: 'retry', reason: 'transient', applied: true, dueMs: outcome.dueMs,
          decision: { action: 'retry', delayMs: 5000, reason: 'transient', class: 'retryable' },
        });
        assert.ok(outcome.dueMs >= t0 + 5000 && outcome.dueMs <= (await serverNow(raw)) + 5000, `due ${outcome.dueMs - t0} ms later`);
        const [member, score] = await raw('ZRANGE', q.keys.delayed, 0, -1, 'WITHSCORES');
        assert.equal(Number(score), outcome.dueMs);
        const m = JSON.parse(member);
        assert.deepEqual(Object.keys(m).sort(), MEMBER_FIELDS);
        assert.deepEqual(m, {
          id: 'job-1', attempt: 2, first_enqueued_ms: String(job.firstEnqueuedMs), payload: 'payload-job-1',
          last_error: 'upstream unavailable', last_reason: 'transient', source: job.entryId, prev_delay_ms: 5000,
        });
        const c = await counters(raw, q);
        assert.deepEqual([c['attempts:retry'], c['retries:transient']], [1, 1]);
        const s = await q.stats();
        assert.deepEqual([s.jobs, s.pending, s.delayed], [0, 0, 1]);
      });

      test('Retry-After sets the delay (retry_after)', async () => {
        const q = await fresh();
        const job = await enqueueRead(q, 'job-1');
        const outcome = await q.apply(job, httpError(503, 'busy', { 'retry-after': '7' }), policies.steady);
        assert.deepEqual([outcome.action, outcome.reason, outcome.decision.delayMs], ['retry', 'retry_after', 7000]);
        const [member] = await raw('ZRANGE', q.keys.delayed, 0, -1);
        assert.deepEqual([JSON.parse(member).last_reason, JSON.parse(member).prev_delay_ms], ['retry_after', 7000]);
        assert.equal((await counters(raw, q))['retries:retry_after'], 1);
      });

      test('a 400 goes to the DLQ as permanent_error', async () => {
        const q = await fresh();
        const job = await enqueueRead(q, 'job-1');
        const outcome = await q.apply(job, httpError(400, 'bad request'), policies.steady);
        assert.deepEqual(outcome, {
          action: 'dead_letter', reason: 'permanent_error', applied: true, dlqId: outcome.dlqId,
          decision: { action: 'dead_letter', delayMs: 0, reason: 'permanent_error', class: 'permanent' },
        });
        const [dl] = await entries(raw, q.keys.dlq);
        assert.equal(dl.id, outcome.dlqId);
        assert.deepEqual([dl.fields.reason, dl.fields.error, dl.fields.attempt, dl.fields.id], ['permanent_error', 'bad request', '1', 'job-1']);
        const c = await counters(raw, q);
        assert.deepEqual([c['dead_letters:permanent_error'], c['attempts:dead_letter'], c.max_attempts_reached], [1, 1, undefined]);
      });

      test('the last attempt goes to the DLQ as max_attempts_reached, and is counted', async () => {
        const q = await fresh();
        const first = await enqueueRead(q, 'job-1');
        assert.equal((await q.apply(first, httpError(503), policies.quick)).action, 'retry');
        await until('the retry to be due', async () => (await q.promote()).moved === 1);
        const [second] = await q.read('c1');
        assert.deepEqual([second.id, second.attempt, second.lastError, second.prevDelayMs], ['job-1', 2, 'HTTP 503', 1]);
        const outcome = await q.apply(second, httpError(503), policies.quick);
        assert.deepEqual([outcome.action, outcome.reason, outcome.applied], ['dead_letter', 'max_attempts_reached', true]);
        const c = await counters(raw, q);
        assert.deepEqual(
          [c.max_attempts_reached, c['dead_letters:max_attempts_reached'], c['finished:dead_letter:2'], c['finished_sum:dead_letter'], c['attempts:retry']],
          [1, 1, 1, 2, 1],
        );
        const [dl] = await entries(raw, q.keys.dlq);
        assert.equal(dl.fields.attempt, '2');
      });

      test('the failure the policy sees: the job’s attempt, id, elapsed time and previous delay', async () => {
        const q = await fresh();
        const job = await enqueueRead(q, 'job-1');
        const p = spy(policies.steady);
        const now = job.firstEnqueuedMs + 1234;
        const reset = Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' });
        await q.apply({ ...job, prevDelayMs: 800 }, reset, p, { nowMs: now, random: 0.25 });
        assert.deepEqual(p.calls.decide, [
          { errorKind: 'connection_reset', attempt: 1, idempotencyKey: 'job-1', nowMs: now, elapsedMs: 1234, prevDelayMs: 800, random: 0.25 },
        ]);
        const [member] = await raw('ZRANGE', q.keys.delayed, 0, -1);
        assert.equal(JSON.parse(member).last_error, 'read ECONNRESET');
      });

      test('elapsed time counts from the first enqueue: max_elapsed_exceeded', async () => {
        const q = await fresh();
        const job = await enqueueRead(q, 'job-1');
        const outcome = await q.apply(job, httpError(503), policies.elapsed, { nowMs: job.firstEnqueuedMs + 120_000 });
        assert.deepEqual([outcome.action, outcome.reason], ['dead_letter', 'max_elapsed_exceeded']);
      });

      test('a success is acked and reported to the policy', async () => {
        const q = await fresh();
        const job = await enqueueRead(q, 'job-1');
        const p = spy(policies.steady);
        assert.deepEqual(await q.apply(job, null, p, { nowMs: 42 }), { action: 'ack', reason: 'success', decision: null, applied: true });
        assert.deepEqual(p.calls.recordSuccess, [42]);
        assert.deepEqual(await q.apply(job, undefined, p), { action: 'ack', reason: 'success', decision: null, applied: false });
        assert.equal((await counters(raw, q))['attempts:success'], 1);
      });

      test('a malformed job is dead-lettered as malformed, with the text every language writes, its fields kept', async () => {
        const q = await fresh();
        await raw('ZADD', q.keys.delayed, 1, 'not json');
        await q.promote();
        const [job] = await q.read('c1');
        const p = spy(policies.steady);
        const outcome = await q.apply(job, null, p);
        assert.deepEqual(outcome, { action: 'dead_letter', reason: 'malformed', decision: null, applied: true, dlqId: outcome.dlqId });
        assert.deepEqual(p.calls, { decide: [], recordSuccess: [] }, 'the policy is not asked');
        const [dl] = await entries(raw, q.keys.dlq);
        assert.equal(dl.fields.reason, 'malformed');
        assert.equal(dl.fields.error, 'malformed entry: needs id, attempt >= 1 and first_enqueued_ms');
        assert.equal(dl.fields['entry.malformed_delayed_member'], 'not json');
        assert.equal((await counters(raw, q))['dead_letters:malformed'], 1);

        await raw('XADD', q.keys.jobs, '*', 'id', 'x', 'attempt', '0', 'first_enqueued_ms', '1', 'payload', 'p');
        const [bad] = await q.read('c1');
        await q.apply(bad, new TypeError('boom'), p);
        const [, dl2] = await entries(raw, q.keys.dlq);
        assert.equal(dl2.fields.error, 'malformed entry: needs id, attempt >= 1 and first_enqueued_ms (TypeError: boom)');
        assert.equal(dl2.fields.payload, 'p');
      });

      test('a failure the policy refuses is dead-lettered as malformed', async () => {
        const q = await fresh();
        const job = await enqueueRead(q, 'job-1');
        const outcome = await q.apply(job, new Error('odd'), policies.steady, { classify: () => ({ httpStatus: 'teapot' }) });
        assert.deepEqual([outcome.action, outcome.reason, outcome.applied], ['dead_letter', 'malformed', true]);
        const [dl] = await entries(raw, q.keys.dlq);
        assert.match(dl.fields.error, /^odd \(policy refused the failure: http_status: must be a 32-bit integer/);
      });

      test('a RetryError is a layer below giving up: dead-lettered as retried_downstream, or retried with retried_downstream: retry', async () => {
        const q = await fresh();
        const once = await loadPolicy({ max_attempts: 1 });
        const inner = await retry(() => Promise.reject(httpError(503, 'inner 503')), { policy: once }).catch((e) => e);
        once.close();
        assert.equal(inner.name, 'RetryError');
        const s = spy(policies.steady);
        const outcome = await q.apply(await enqueueRead(q, 'job-1'), inner, s);
        assert.deepEqual([outcome.action, outcome.reason, outcome.decision.class], ['dead_letter', 'retried_downstream', 'retryable']);
        // classified by its last failure, and marked
        assert.equal(s.calls.decide[0].httpStatus, 503);
        assert.equal(s.calls.decide[0].retriedDownstream, true);
        const [dl1] = await entries(raw, q.keys.dlq);
        assert.equal(dl1.fields.error, 'RetryError: gave up after 1 attempt (max_attempts_reached): inner 503');

        const cold = await loadPolicy({ max_attempts: 3, retried_downstream: 'retry', backoff: { strategy: 'constant', base: '5s', cap: '5s' }, jitter: { mode: 'none' } });
        const retried = await q.apply(await enqueueRead(q, 'job-2'), inner, cold);
        cold.close();
        assert.deepEqual([retried.action, retried.reason, retried.decision.class], ['retry', 'transient', 'retryable']);
        const [member] = await raw('ZRANGE', q.keys.delayed, 0, -1);
        assert.equal(JSON.parse(member).last_error, 'RetryError: gave up after 1 attempt (max_attempts_reached): inner 503');
      });

      test('a circuit_open RetryError (no call made) is decided by what it says, unmarked; a failed Response by its status', async () => {
        const q = await fresh();
        const breaker = await loadPolicy({ max_attempts: 1, circuit_breaker: { failure_threshold: 1, open_for: '1h' } });
        breaker.decide({ attempt: 1, httpStatus: 503 });
        const refused = await retry(() => assert.fail('the breaker is open'), { policy: breaker }).catch((e) => e);
        breaker.close();
        assert.equal(refused.reason, 'circuit_open');
        const s = spy(policies.steady);
        const outcome = await q.apply(await enqueueRead(q, 'job-1'), refused, s);
        assert.equal(s.calls.decide[0].retriedDownstream, undefined);
        assert.deepEqual([outcome.action, outcome.reason], ['retry', 'uncertain']);

        const res = new Response('no', { status: 404, statusText: 'Not Found' });
        const dead = await q.apply(await enqueueRead(q, 'job-2'), res, policies.steady);
        assert.deepEqual([dead.action, dead.reason], ['dead_letter', 'permanent_error']);
        const [dl] = await entries(raw, q.keys.dlq);
        assert.equal(dl.fields.error, 'HTTP 404 Not Found');
      });

      test('a late outcome, after another worker moved the entry, is not applied', async () => {
        const q = await fresh();
        const job = await enqueueRead(q, 'job-1');
        const { jobs } = await q.reclaim('c2', { minIdleMs: 0 });
        await q.apply(jobs[0], null, policies.steady);
        const late = await q.apply(job, httpError(503), policies.steady);
        assert.deepEqual([late.action, late.applied, late.dueMs], ['retry', false, null]);
        const dead = await q.apply(job, httpError(400), policies.steady);
        assert.deepEqual([dead.action, dead.applied, dead.dlqId], ['dead_letter', false, null]);
        const s = await q.stats();
        assert.deepEqual([s.delayed, s.dlq, s.counters['attempts:success']], [0, 0, 1]);
      });

      test('arguments are checked', async () => {
        const q = await fresh();
        const job = await enqueueRead(q, 'job-1');
        await assert.rejects(q.apply({}, null, policies.steady), { name: 'TypeError', message: /`job`/ });
        await assert.rejects(q.apply(job, null, {}), { name: 'TypeError', message: /`policy`/ });
        await assert.rejects(q.apply(job, null, policies.steady, { classify: 1 }), { name: 'TypeError', message: /`classify`/ });
        await assert.rejects(q.apply(job, null, policies.steady, { nowMs: 'now' }), { name: 'TypeError', message: /`nowMs`/ });
        assert.equal((await q.stats()).pending, 1, 'nothing was applied');
      });
    });

    describe('work', () => {
      test('retries a 503 through the delayed set until it succeeds; a 400 is dead-lettered', async () => {
        const q = await fresh();
        await q.enqueue('job-1', 'x');
        await q.enqueue('job-bad', 'x');
        await q.enqueue('job-response', 'x');
        // Malformed: a bad attempt and no id (an entry with none of the job's fields is a plain job).
        await raw('XADD', q.keys.jobs, '*', 'garbage', 'x', 'attempt', 'x');
        const seen = [];
        const outcomes = [];
        const ac = new AbortController();
        const done = q.work(
          policies.worker,
          async (job, { signal }) => {
            assert.ok(signal instanceof AbortSignal && !signal.aborted); // ac.signal's, and the deadline's
            seen.push([job.id, job.attempt, job.prevDelayMs]);
            if (job.id === 'job-bad') throw httpError(400, '400 Bad Request');
            if (job.id === 'job-response') return job.attempt === 1 ? new Response('', { status: 503 }) : 'ok';
            if (job.attempt <= 2) throw httpError(503, '503');
          },
          { signal: ac.signal, consumer: 'w1', blockMs: 50, promoteEveryMs: 5, onOutcome: (o, job) => outcomes.push([job.id, job.attempt, o.action, o.reason]) },
        );
        await until('every job to finish', () => outcomes.filter(([, , action]) => action !== 'retry').length === 4);
        ac.abort();
        await done;
        assert.deepEqual(seen.filter(([id]) => id === 'job-1'), [['job-1', 1, 0], ['job-1', 2, 10], ['job-1', 3, 10]]);
        assert.deepEqual(outcomes.filter(([id]) => id === 'job-1').map((o) => o.slice(1)), [[1, 'retry', 'transient'], [2, 'retry', 'transient'], [3, 'ack', 'success']]);
        assert.deepEqual(outcomes.filter(([id]) => id !== 'job-1').sort(), [
          ['', 0, 'dead_letter', 'malformed'],
          ['job-bad', 1, 'dead_letter', 'permanent_error'],
          ['job-response', 1, 'retry', 'transient'],
          ['job-response', 2, 'ack', 'success'],
        ]);
        assert.ok(!seen.some(([id]) => id === ''), 'a malformed job never reaches the handler');
        const s = await q.stats();
        assert.deepEqual([s.jobs, s.pending, s.delayed, s.dlq], [0, 0, 0, 2]);
        assert.deepEqual(
          [s.counters['attempts:success'], s.counters['attempts:retry'], s.counters['finished:success:3'], s.counters['dead_letters:permanent_error']],
          [2, 3, 1, 1],
        );
      });

      test('takes over a crashed consumer’s entry, and recreates a deleted stream', async () => {
        const q = await fresh();
        await enqueueRead(q, 'orphan', 'crashed'); // delivered, never finished
        const outcomes = [];
        const ac = new AbortController();
        const done = q.work(policies.worker, () => {}, {
          signal: ac.signal, consumer: 'w1', blockMs: 20, reclaimEveryMs: 10, minIdleMs: 1,
          onOutcome: (o, job) => outcomes.push([job.id, o.action]),
        });
        await until('the orphan to be reclaimed', () => outcomes.length === 1);
        assert.deepEqual(outcomes, [['orphan', 'ack']]);
        await raw('DEL', q.keys.jobs);
        await q.enqueue('after-delete', 'x'); // a stream without the group: NOGROUP
        await until('the job after the delete', () => outcomes.length === 2);
        assert.deepEqual(outcomes[1], ['after-delete', 'ack']);
        ac.abort();
        await done;
      });

      // Issue 15: reclaim skips a crash loop the DLQ refuses (it stays
      // pending) and Go logs it; the Node worker reported nothing.
      test('reports through onError each crash loop reclaim could not dead-letter', async () => {
        const q = await fresh();
        const loop = await enqueueRead(q, 'loop', 'crashed');
        await raw('XCLAIM', q.keys.jobs, q.group, 'crashed', 0, loop.entryId, 'RETRYCOUNT', 2); // delivered twice
        await raw('SET', q.keys.dlq, 'legacy'); // a DLQ that refuses it
        const errors = [];
        const outcomes = [];
        const ac = new AbortController();
        const done = q.work(policies.worker, () => assert.fail('a crash loop is not run again'), {
          signal: ac.signal, consumer: 'w1', blockMs: 20, reclaimEveryMs: 10, minIdleMs: 1, maxDeliveries: 2,
          onOutcome: (o, job) => outcomes.push([job.id, o.action]),
          onError: (err, job) => errors.push([err, job]),
        });
        await until('the skip to be reported', () => errors.some(([err]) => err?.entryId === loop.entryId));
        ac.abort();
        await done;
        const [err, job] = errors.find(([e]) => e?.entryId === loop.entryId);
        assert.ok(err instanceof Error);
        assert.equal(job, undefined);
        assert.match(err.reason, /^not dead-lettered: .*is a string, not a stream$/);
        assert.equal(err.message, `queue ${q.name}: crash loop ${loop.entryId} stays pending: ${err.reason}`);
        assert.deepEqual(errors.filter(([e]) => e?.entryId !== loop.entryId), [], 'nothing else went wrong');
        assert.deepEqual(outcomes, []);
        const s = await counters(raw, q);
        assert.ok(s.reclaim_skipped >= 1 && !('attempts:dead_letter' in s), JSON.stringify(s));
        const [pending] = await raw('XPENDING', q.keys.jobs, q.group, '-', '+', 10);
        assert.deepEqual([pending[0], pending[3]], [loop.entryId, 2], 'still pending, its delivery count unchanged');
      });

      test('stops on abort while waiting, and when aborted before it starts', async () => {
        const q = await fresh();
        const ac = new AbortController();
        const errors = [];
        let stopped = false;
        const done = q
          .work(policies.worker, () => {}, { signal: ac.signal, blockMs: 100, onError: (e) => errors.push(e) })
          .then(() => (stopped = true));
        // Abort while the worker waits in its blocking read, as Redis sees it.
        await until('the worker to block on its read', async () =>
          (await raw('CLIENT', 'LIST')).split('\n').some((c) => /\bcmd=xreadgroup\b/.test(c) && /\bflags=\S*b/.test(c)),
        );
        ac.abort();
        await until('the worker to stop after the abort', () => stopped);
        await done;
        await q.work(policies.worker, () => assert.fail('no job to run'), { signal: AbortSignal.abort() });
        assert.deepEqual(errors, []);
        await assert.rejects(q.work(policies.worker, () => {}, { batch: 0 }), { name: 'TypeError', message: /`batch`/ });
        await assert.rejects(q.work(policies.worker, 'nope'), { name: 'TypeError', message: /`handler`/ });
      });
    });
  });
}
