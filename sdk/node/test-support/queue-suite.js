// The script semantics of the queue contract (queue/redisqueue/README.md), run through
// one client against a real Redis: standalone (test/queue.test.js) or a
// cluster (test/queue-cluster.test.js). Redis state is checked behind the
// queue's back with a separate raw ioredis client.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createQueue } from '../lib/redis.js';

/** The whole time of the server, in unix ms. */
export async function serverNow(raw) {
  const [s, us] = await raw('TIME');
  return Number(s) * 1000 + Math.floor(Number(us) / 1000);
}

/** The stats hash as numbers. */
export async function counters(raw, q) {
  const flat = await raw('HGETALL', q.keys.stats);
  const out = {};
  for (let i = 0; i < flat.length; i += 2) out[flat[i]] = Number(flat[i + 1]);
  return out;
}

/** A stream's entries as [{id, fields}]. */
export async function entries(raw, key) {
  return (await raw('XRANGE', key, '-', '+')).map(([id, f]) => {
    const fields = {};
    for (let i = 0; i < f.length; i += 2) fields[f[i]] = f[i + 1];
    return { id, fields };
  });
}

/**
 * Defines the suite for one client. kind: {connect, close}; target: what
 * connect takes; env(): {raw, each}, the raw inspector and a function that
 * sends a command to every master and resolves to their replies.
 */
export function scriptSuite(name, kind, target, env) {
  describe(name, () => {
    let client;
    let raw;
    let each;
    let n = 0;
    before(async () => {
      client = await kind.connect(target);
      ({ raw, each } = env());
    });
    after(() => kind.close(client));

    // A fresh queue per test, its group created.
    async function fresh(options) {
      const q = createQueue(client, `${name.replace(/\W+/g, '-')}-${++n}`, options);
      assert.equal(await q.ensureGroup(), true);
      return q;
    }

    async function enqueueRead(q, id, consumer = 'c1') {
      await q.enqueue(id, `payload-${id}`);
      const jobs = await q.read(consumer, { count: 1 });
      assert.equal(jobs.length, 1);
      return jobs[0];
    }

    test('enqueue: a job with attempt 1, stamped by the server', async () => {
      const q = await fresh();
      assert.equal(await q.ensureGroup(), false, 'a second ensureGroup finds the group');
      const t0 = await serverNow(raw);
      const entryId = await q.enqueue('job-1', 'payload-job-1');
      assert.match(entryId, /^\d+-\d+$/);
      const [job] = await q.read('c1', { count: 5 });
      assert.equal(job.entryId, entryId);
      assert.equal(job.id, 'job-1');
      assert.equal(job.attempt, 1);
      assert.equal(job.payload, 'payload-job-1');
      assert.equal(job.malformed, false);
      assert.ok(job.firstEnqueuedMs >= t0 && job.firstEnqueuedMs <= (await serverNow(raw)));
      assert.deepEqual(job.fields, { id: 'job-1', attempt: '1', first_enqueued_ms: String(job.firstEnqueuedMs), payload: 'payload-job-1' });
      assert.deepEqual(await q.read('c1', { count: 5 }), [], 'nothing new to read');
      assert.deepEqual(await q.read('c1', { count: 5, blockMs: 20 }), [], 'a blocking read times out empty');
      assert.equal((await counters(raw, q)).enqueued, 1);
    });

    test('enqueue: bytes and text payloads', async () => {
      const q = await fresh();
      await q.enqueue('b', Buffer.from('héllo ✓'));
      await q.enqueue('u', new TextEncoder().encode('{"sku":7}'));
      await q.enqueue('e');
      const jobs = await q.read('c1', { count: 5 });
      assert.deepEqual(jobs.map((j) => j.payload), ['héllo ✓', '{"sku":7}', '']);
      await assert.rejects(q.enqueue('', 'x'), { name: 'TypeError', message: /`id` to be a non-empty string/ });
      await assert.rejects(q.enqueue('x', { a: 1 }), { name: 'TypeError', message: /`payload`/ });
    });

    test('ack: once, then the entry is gone', async () => {
      const q = await fresh();
      const job = await enqueueRead(q, 'job-1');
      assert.equal(await q.ack(job), true);
      assert.equal(await q.ack(job.entryId), false, 'a second ack changes nothing');
      assert.deepEqual(await q.stats(), {
        jobs: 0, pending: 0, delayed: 0, dlq: 0,
        counters: { enqueued: 1, 'attempts:success': 1, 'finished:success:1': 1, 'finished_sum:success': 1 },
      });
    });

    test('retry → promote: the job comes back with attempt 2', async () => {
      const q = await fresh();
      const job = await enqueueRead(q, 'job-1');
      const t0 = await serverNow(raw);
      const due = await q.retry(job, 0, 'transient', '503 Service Unavailable');
      assert.ok(due >= t0 && due <= (await serverNow(raw)), `due ${due} is now`);
      assert.equal(await q.retry(job, 0, 'transient', 'again'), null, 'a second retry of the entry moves nothing');
      const [member, score] = await raw('ZRANGE', q.keys.delayed, 0, -1, 'WITHSCORES');
      assert.equal(Number(score), due);
      assert.deepEqual(JSON.parse(member), {
        id: 'job-1', attempt: 2, first_enqueued_ms: String(job.firstEnqueuedMs), payload: 'payload-job-1',
        last_error: '503 Service Unavailable', last_reason: 'transient', source: job.entryId, prev_delay_ms: 0,
      });
      let s = await q.stats();
      assert.deepEqual([s.jobs, s.pending, s.delayed], [0, 0, 1]);

      // A later retry stays behind; promote reports when it is due.
      const later = await enqueueRead(q, 'job-2');
      await q.retry(later, 3_600_000, 'retry_after', '429');
      const p = await q.promote(10);
      assert.equal(p.moved, 1);
      assert.ok(p.nextDueMs > 3_590_000 && p.nextDueMs <= 3_600_000, `nextDueMs ${p.nextDueMs}`);

      // Made due, the later one comes back with its delay as prev_delay_ms.
      const [laterMember] = await raw('ZRANGE', q.keys.delayed, 0, 0);
      await raw('ZADD', q.keys.delayed, 'XX', 1, laterMember);
      assert.deepEqual(await q.promote(10), { moved: 1, nextDueMs: null });

      const [back, back2] = await q.read('c2', { count: 5 });
      assert.deepEqual([back2.id, back2.attempt, back2.lastReason, back2.lastError, back2.prevDelayMs], ['job-2', 2, 'retry_after', '429', 3_600_000]);
      assert.equal(back.id, 'job-1');
      assert.equal(back.attempt, 2);
      assert.equal(back.firstEnqueuedMs, job.firstEnqueuedMs, 'the first enqueue time survives the retry');
      assert.equal(back.payload, 'payload-job-1');
      assert.equal(back.lastError, '503 Service Unavailable');
      assert.equal(back.lastReason, 'transient');
      assert.equal(back.prevDelayMs, 0);
      assert.equal(back.malformed, false);
      s = await q.stats();
      assert.equal(s.delayed, 0);
      assert.deepEqual(
        [s.counters['attempts:retry'], s.counters['retries:transient'], s.counters['retries:retry_after'], s.counters.promoted],
        [2, 1, 1, 2],
      );
    });

    test('defer → promote: the job comes back with its attempt unchanged, counted apart from retries', async () => {
      const q = await fresh();
      const job = await enqueueRead(q, 'job-1');
      const t0 = await serverNow(raw);
      const due = await q.defer(job, 0, 'circuit_open');
      assert.ok(due >= t0 && due <= (await serverNow(raw)), `due ${due} is now`);
      assert.equal(await q.defer(job, 0, 'circuit_open'), null, 'a second deferral of the entry moves nothing');
      await assert.rejects(q.defer(job, -1, 'circuit_open'), { name: 'TypeError', message: /`delayMs`/ });
      assert.deepEqual(await q.promote(10), { moved: 1, nextDueMs: null });
      const [back] = await q.read('c2');
      assert.deepEqual([back.id, back.attempt, back.lastReason, back.lastError], ['job-1', 1, 'circuit_open', '']);
      const s = await q.stats();
      assert.deepEqual(
        [s.counters['attempts:deferred'], s.counters['deferred:circuit_open'], s.counters['attempts:retry']],
        [1, 1, undefined],
      );
      await assert.rejects(q.defer(back, 10, 'transient'), /ERR backstop defer: reason must be circuit_open or budget_exhausted/);
    });

    test('promote: bounded batches, and an empty set', async () => {
      const q = await fresh();
      for (const id of ['a', 'b', 'c']) await q.retry(await enqueueRead(q, id), 0, 'transient', 'e');
      assert.deepEqual(await q.promote(2), { moved: 2, nextDueMs: 0 });
      assert.deepEqual(await q.promote(), { moved: 1, nextDueMs: null });
      assert.deepEqual(await q.promote(), { moved: 0, nextDueMs: null });
      assert.equal((await q.read('c1', { count: 10 })).length, 3);
      await assert.rejects(q.promote(0), { name: 'TypeError', message: /`limit` to be a whole number in 1\.\.10000 \(got 0\)/ });
      await assert.rejects(q.promote(10001), { name: 'TypeError' });
    });

    test('promote: a member that is not JSON reaches the stream raw, as a malformed job', async () => {
      const q = await fresh();
      await raw('ZADD', q.keys.delayed, 1, 'not json');
      assert.equal((await q.promote(10)).moved, 1);
      const [job] = await q.read('c1');
      assert.equal(job.malformed, true);
      assert.deepEqual(job.fields, { malformed_delayed_member: 'not json' });
    });

    test('retry: arguments are checked before anything is written', async () => {
      const q = await fresh();
      const job = await enqueueRead(q, 'job-1');
      await assert.rejects(q.retry(job, -1, 'transient', 'e'), { name: 'TypeError', message: /`delayMs` to be a whole number >= 0/ });
      await assert.rejects(q.retry(job, 1.5, 'transient', 'e'), { name: 'TypeError' });
      await assert.rejects(q.retry(job, 10, '', 'e'), { name: 'TypeError', message: /`reason`/ });
      await assert.rejects(q.retry('', 10, 'transient'), { name: 'TypeError', message: /`entry`/ });
      const s = await q.stats();
      assert.deepEqual([s.pending, s.delayed, s.counters['attempts:retry']], [1, 0, undefined]);
    });

    test('dead letter: the fields of the contract, and the counters', async () => {
      const q = await fresh();
      const job = await enqueueRead(q, 'job-1');
      const t0 = await serverNow(raw);
      const dlqId = await q.deadLetter(job, 'max_attempts_reached', '503 five times');
      assert.match(dlqId, /^\d+-\d+$/);
      assert.equal(await q.deadLetter(job, 'max_attempts_reached', 'again'), null, 'a second dead letter writes nothing');
      const [dl] = await entries(raw, q.keys.dlq);
      assert.equal(dl.id, dlqId);
      const { dead_lettered_ms: at, ...fields } = dl.fields;
      assert.deepEqual(fields, {
        reason: 'max_attempts_reached', error: '503 five times', attempt: '1', id: 'job-1', source_id: job.entryId,
        first_enqueued_ms: String(job.firstEnqueuedMs), payload: 'payload-job-1',
      });
      assert.ok(Number(at) >= t0 && Number(at) <= (await serverNow(raw)));
      const s = await q.stats();
      assert.deepEqual([s.jobs, s.pending, s.dlq], [0, 0, 1]);
      assert.deepEqual(s.counters, {
        enqueued: 1, 'attempts:dead_letter': 1, 'dead_letters:max_attempts_reached': 1, max_attempts_reached: 1,
        'finished:dead_letter:1': 1, 'finished_sum:dead_letter': 1,
      });
      await assert.rejects(q.deadLetter(job, ''), { name: 'TypeError', message: /`reason`/ });
    });

    test('malformed: retry refuses it and leaves it pending; dead letter takes it', async () => {
      const q = await fresh();
      // An attempt but no id (an entry with none of the job's fields is a plain job).
      await raw('XADD', q.keys.jobs, '*', 'garbage', 'x', 'attempt', '1');
      const [job] = await q.read('c1');
      assert.equal(job.malformed, true);
      assert.equal(job.id, '');
      await assert.rejects(q.retry(job, 1000, 'transient', 'e'), (err) => {
        assert.match(err.message, new RegExp(`^queue ${q.name}: retry ${job.entryId}: ERR backstop retry: entry .* is malformed`));
        assert.ok(err.cause instanceof Error, 'the client error is the cause');
        return true;
      });
      assert.equal((await q.stats()).pending, 1);
      assert.ok(await q.deadLetter(job, 'malformed', 'no id'));
      const s = await q.stats();
      assert.deepEqual([s.pending, s.dlq, s.counters['dead_letters:malformed']], [0, 1, 1]);
    });

    test('malformed attempts: read as malformed, dead-lettered whole', async () => {
      const q = await fresh();
      const bad = ['0', '01', '-1', '1.5', '1e3', 'inf', 'nan', ' 2', '100000000000000', ''];
      for (const attempt of bad) await raw('XADD', q.keys.jobs, '*', 'id', `a=${attempt}`, 'attempt', attempt, 'first_enqueued_ms', '1');
      await raw('XADD', q.keys.jobs, '*', 'id', 'no-first', 'attempt', '1');
      await raw('XADD', q.keys.jobs, '*', 'attempt', '1', 'first_enqueued_ms', '1');
      const jobs = await q.read('c1', { count: 100 });
      assert.equal(jobs.length, bad.length + 2);
      for (const job of jobs) {
        assert.equal(job.malformed, true, job.id);
        // retry.lua checks the id and the attempt, not first_enqueued_ms.
        if (job.id !== 'no-first') await assert.rejects(q.retry(job, 0, 'transient', 'e'), /is malformed/, job.id);
        assert.ok(await q.deadLetter(job, 'malformed', 'e'), job.id);
      }
      const s = await q.stats();
      assert.deepEqual([s.pending, s.dlq, s.counters['dead_letters:malformed']], [0, jobs.length, jobs.length]);
      const dl = await entries(raw, q.keys.dlq);
      assert.deepEqual(dl.slice(0, bad.length).map((e) => e.fields.attempt), bad);
    });

    test('replay: by reason, in bounded batches, attempt reset', async () => {
      const q = await fresh();
      const reasons = ['a', 'b', 'a', 'b', 'a'];
      for (const [i, reason] of reasons.entries()) await q.deadLetter(await enqueueRead(q, `job-${i}`), reason, 'e');
      assert.equal(await q.replay({ reason: 'a' }), 3);
      const jobs = await q.read('c1', { count: 10 });
      assert.deepEqual(jobs.map((j) => j.id), ['job-0', 'job-2', 'job-4']);
      for (const j of jobs) {
        assert.equal(j.attempt, 1);
        assert.equal(j.lastReason, 'a');
        assert.match(j.fields.replayed_from, /^\d+-\d+$/);
        assert.equal(j.payload, `payload-${j.id}`);
      }
      assert.equal(await q.replay({ reason: 'nothing-has-this' }), 0);
      assert.equal(await q.replay({ limit: 1 }), 1);
      const s = await q.stats();
      assert.deepEqual([s.dlq, s.counters.replayed], [1, 4]);
      assert.equal(await q.replay({ limit: Infinity }), 1);
      await assert.rejects(q.replay({ limit: 0 }), { name: 'TypeError', message: /`limit`/ });
    });

    test('replay: a filtered replay pages through a long DLQ', async () => {
      const q = await fresh();
      // 25 dead letters, every fifth with reason "x": batches of limit 2 scan 20 entries each.
      for (let i = 0; i < 25; i++) {
        await q.deadLetter(await enqueueRead(q, `job-${i}`), i % 5 === 4 ? 'x' : 'other', 'e');
      }
      assert.equal(await q.replay({ limit: 2, reason: 'x' }), 2);
      assert.equal(await q.replay({ limit: 100, reason: 'x' }), 3);
      assert.equal((await q.stats()).dlq, 20);
    });

    test('reclaim: a crashed consumer’s entry is taken over; a crash loop is dead-lettered', async () => {
      const q = await fresh();
      await enqueueRead(q, 'crashy'); // delivered once to c1, never acked
      await q.enqueue('loopy', 'p');
      await q.read('c1'); // delivery 1
      let r = await q.reclaim('c2', { minIdleMs: 0, count: 10, maxDeliveries: 3 }); // delivery 2 for both
      assert.equal(r.deadLettered, 0);
      assert.deepEqual(r.jobs.map((j) => [j.id, j.attempt, j.malformed]), [['crashy', 1, false], ['loopy', 1, false]]);
      r = await q.reclaim('c3', { minIdleMs: 0, count: 10, maxDeliveries: 3 }); // delivery 3 for both
      assert.equal(r.jobs.length, 2);
      assert.equal(await q.ack(r.jobs[0]), true);
      r = await q.reclaim('c4', { minIdleMs: 0, count: 10, maxDeliveries: 3 });
      assert.deepEqual([r.deadLettered, r.jobs.length], [1, 0]);
      const [dl] = await entries(raw, q.keys.dlq);
      assert.equal(dl.fields.reason, 'crash_loop');
      assert.equal(dl.fields.id, 'loopy');
      assert.equal(dl.fields.error, 'delivered 3 times without an outcome');
      const s = await q.stats();
      assert.deepEqual([s.pending, s.dlq], [0, 1]);
      assert.deepEqual(
        [s.counters['dead_letters:crash_loop'], s.counters['attempts:dead_letter'], s.counters.reclaimed, s.counters['finished:dead_letter:1']],
        [1, 1, 4, 1],
      );
      // An entry idle for less than minIdleMs stays with its consumer.
      await enqueueRead(q, 'fresh');
      assert.deepEqual((await q.reclaim('c5', { minIdleMs: 3_600_000 })).jobs, []);
      await assert.rejects(q.reclaim('c5', { count: 0 }), { name: 'TypeError', message: /`count`/ });
      await assert.rejects(q.reclaim('c5', { maxDeliveries: 0 }), { name: 'TypeError', message: /`maxDeliveries`/ });
    });

    test('reclaim: a crash loop the DLQ refuses is skipped and reported; the rest is claimed', async () => {
      const q = await fresh();
      const loop = await enqueueRead(q, 'loop');
      await raw('XCLAIM', q.keys.jobs, q.group, 'c1', 0, loop.entryId); // delivery 2
      const crashed = await enqueueRead(q, 'crashed'); // delivery 1
      await raw('SET', q.keys.dlq, 'legacy');
      const r = await q.reclaim('c2', { minIdleMs: 0, count: 10, maxDeliveries: 2 });
      assert.equal(r.deadLettered, 0);
      assert.deepEqual(r.jobs.map((j) => j.entryId), [crashed.entryId]);
      assert.deepEqual(r.skipped.map((s) => s.entryId), [loop.entryId]);
      assert.match(r.skipped[0].reason, /is a string, not a stream/);
      const c = await counters(raw, q);
      assert.deepEqual([c.reclaim_skipped, c.reclaimed], [1, 1]);
      await raw('DEL', q.keys.dlq);
      assert.deepEqual(await q.reclaim('c3', { minIdleMs: 0, count: 10, maxDeliveries: 2 }).then((x) => [x.deadLettered, x.skipped]), [2, []]);
    });

    test('an entry id that is not a full stream id is refused before Redis', async () => {
      const q = await fresh();
      for (const id of ['5000', '+', '-', '(1-0', '01-0', '1-0 ', '18446744073709551616-0']) {
        await assert.rejects(q.ack(id), { name: 'TypeError', message: /`entry` to be a stream entry id \(<ms>-<seq>\)/ }, id);
        await assert.rejects(q.retry(id, 0, 'transient'), { name: 'TypeError' }, id);
        await assert.rejects(q.deadLetter(id, 'permanent_error'), { name: 'TypeError' }, id);
      }
      assert.equal(await q.ack('18446744073709551615-0'), false);
    });

    test('a late outcome, after another worker moved the entry, changes nothing', async () => {
      const q = await fresh();
      const job = await enqueueRead(q, 'job-1');
      const { jobs } = await q.reclaim('c2', { minIdleMs: 0 });
      assert.equal(jobs.length, 1);
      assert.equal(await q.ack(jobs[0]), true, 'the new owner finishes it');
      assert.equal(await q.retry(job, 0, 'transient', 'late'), null);
      assert.equal(await q.deadLetter(job, 'permanent_error', 'late'), null);
      assert.equal(await q.ack(job), false);
      const s = await q.stats();
      assert.deepEqual([s.jobs, s.pending, s.delayed, s.dlq], [0, 0, 0, 0]);
      assert.deepEqual(s.counters, { enqueued: 1, reclaimed: 1, 'attempts:success': 1, 'finished:success:1': 1, 'finished_sum:success': 1 });
    });

    test('NOSCRIPT: after SCRIPT FLUSH the scripts are sent again (EVALSHA first, then EVAL)', async () => {
      const q = await fresh();
      await q.enqueue('warm', 'p'); // the enqueue script is cached now
      await each('SCRIPT', 'FLUSH');
      await each('CONFIG', 'RESETSTAT');
      const job = await enqueueRead(q, 'job-1');
      assert.equal(await q.ack(job), true);
      assert.equal(await q.ack(job), false);
      assert.equal((await q.stats()).counters['attempts:success'], 1);
      const stats = (await each('INFO', 'commandstats')).join('\n');
      const sum = (re) => [...stats.matchAll(re)].reduce((a, m) => a + Number(m[1]), 0);
      const calls = (cmd) => sum(new RegExp(`cmdstat_${cmd}:calls=(\\d+)`, 'g'));
      const failed = (cmd) => sum(new RegExp(`cmdstat_${cmd}:.*failed_calls=(\\d+)`, 'g'));
      // enqueue and the first ack: EVALSHA fails (NOSCRIPT), EVAL runs; the second ack: EVALSHA.
      assert.equal(calls('eval'), 2, stats);
      assert.equal(calls('evalsha'), 3, stats);
      assert.equal(failed('evalsha'), 2, stats);
    });

    test('stats before the group exists, and a custom key layout', async () => {
      const q = createQueue(client, `${name.replace(/\W+/g, '-')}-nogroup`);
      assert.deepEqual(await q.stats(), { jobs: 0, pending: 0, delayed: 0, dlq: 0, counters: {} });
      const keys = { jobs: '{legacy}jobs:main', delayed: '{legacy}delayed:retries', dlq: '{legacy}jobs:dlq', stats: '{legacy}stats' };
      const lq = createQueue(client, 'legacy', { keys, group: `g-${name.replace(/\W+/g, '-')}` });
      assert.deepEqual(lq.keys, keys);
      await lq.ensureGroup();
      await lq.enqueue('job-1', 'p');
      const [job] = await lq.read('c1');
      assert.ok(await lq.retry(job, 0, 'transient', 'e'));
      assert.equal(Number(await raw('ZCARD', '{legacy}delayed:retries')), 1);
      await raw('DEL', ...Object.values(keys));
    });
  });
}

