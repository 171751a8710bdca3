// backstop-policy/redis when Redis refuses writes: under maxmemory with
// noeviction Redis refuses ack, retry and dead_letter (their first write is
// flagged denyoom) but not XCLAIM, so reclaim could hand out a job whose
// outcome a worker knows. The worker keeps the outcome and holds the job
// until Redis takes it. Against a real redis-server, through ioredis and
// node-redis.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Redis } from 'ioredis';
import { loadPolicy } from '../index.js';
import { createQueue, scriptSource } from '../lib/redis.js';
import { inspector, standalone } from '../test-support/clients.js';
import { until } from '../test-support/eventually.js';
import { counters, serverNow } from '../test-support/queue-suite.js';
import { startRedis } from '../test-support/redis-server.js';

const server = await startRedis();
const raw = inspector(server);
let policy;
before(async () => {
  policy = await loadPolicy({ max_attempts: 3, backoff: { base: '10ms', cap: '20ms' } });
});
after(async () => {
  policy.close();
  await raw('CONFIG', 'SET', 'maxmemory', '0');
  await raw.close();
  await server.stop();
});

// Puts Redis in the state of a full server: a 4 MB filler, then maxmemory
// below the memory in use, with noeviction. Returns a function that lifts
// the limit.
async function outOfMemory() {
  await raw('SET', 'filler', 'x'.repeat(4 << 20));
  const used = Number(/used_memory:(\d+)/.exec(await raw('INFO', 'memory'))[1]);
  await raw('CONFIG', 'SET', 'maxmemory-policy', 'noeviction');
  await raw('CONFIG', 'SET', 'maxmemory', String(Math.floor(used / 2)));
  await assert.rejects(raw('SET', 'probe', 'x'), /^ReplyError: OOM /);
  return () => raw('CONFIG', 'SET', 'maxmemory', '0');
}

// A gate handlers wait at, and a count of the handlers waiting.
function gate() {
  let open;
  const opened = new Promise((resolve) => (open = resolve));
  const g = { waiting: 0, open, pass: async () => (g.waiting++, await opened) };
  return g;
}

async function pending(q) {
  return (await raw('XPENDING', q.keys.jobs, q.group, '-', '+', '100')).map(([id, consumer]) => [id, consumer]);
}

let n = 0;
for (const name of ['ioredis 6', 'node-redis 6']) {
  const kind = standalone[name];
  describe(name, () => {
    const clients = [];
    const connect = async () => {
      const c = await kind.connect(server);
      clients.push(c);
      return c;
    };
    after(() => Promise.all(clients.map((c) => kind.close(c))));
    const fresh = async (client) => {
      const q = createQueue(client ?? (await connect()), `oom-${name.replace(/\W+/g, '-')}-${++n}`);
      await q.ensureGroup();
      return q;
    };

    test('out of memory, no job runs twice and no success becomes a crash loop', async () => {
      const q = await fresh();
      // Batches of 4: flaky (a 503, then a success) and bad (a 400) each
      // start a batch, so that an outcome of each kind is refused, with
      // jobs of the batch waiting behind it.
      const ids = Array.from({ length: 16 }, (_, i) => ({ 0: 'flaky', 4: 'bad' })[i] ?? `ok-${i}`);
      for (const id of ids) await q.enqueue(id, 'p');
      const runs = new Map(); // id/attempt → handler runs
      const g = gate();
      const handler = async (job) => {
        const key = `${job.id}/${job.attempt}`;
        runs.set(key, (runs.get(key) ?? 0) + 1);
        await g.pass();
        if (job.id === 'bad') throw Object.assign(new Error('400 bad request'), { status: 400 });
        if (job.id === 'flaky' && job.attempt === 1) throw Object.assign(new Error('503 unavailable'), { status: 503 });
      };
      const refusals = [];
      const errors = [];
      const minIdleMs = 400;
      const ac = new AbortController();
      const workers = [];
      for (const consumer of ['w1', 'w2']) {
        const wq = createQueue(await connect(), q.name);
        workers.push(
          wq.work(policy, handler, {
            signal: ac.signal, consumer, batch: 4, blockMs: 20, promoteEveryMs: 20, reclaimEveryMs: 20, minIdleMs, maxDeliveries: 2,
            onOutcome: (o) => o.refusals && refusals.push(o.refusals),
            onError: (err) => errors.push(err),
          }),
        );
      }
      let lift = async () => {};
      try {
        // Both workers are running a job when Redis fills up; their outcomes
        // are refused. Another consumer reclaims meanwhile, as a worker in
        // another process would (XAUTOCLAIM takes what reclaim takes: entries
        // idle for min idle), for several min idle periods: it must find
        // nothing to take.
        await until('two handlers to run', () => g.waiting === 2);
        lift = await outOfMemory();
        g.open();
        // The probing lasts until Redis's own clock, the one idle times are
        // measured on, has moved four min idle periods past the outage.
        const stolen = [];
        const start = await serverNow(raw);
        await until('four min idle periods of reclaim attempts', async () => {
          const [, claimed] = await raw('XAUTOCLAIM', q.keys.jobs, q.group, 'other', minIdleMs, '0-0', 'COUNT', 100);
          for (const [, f] of claimed) stolen.push(`${f[f.indexOf('id') + 1]}/${f[f.indexOf('attempt') + 1]}`);
          return (await serverNow(raw)) - start >= 4 * minIdleMs;
        });
        await lift();
        await until('every job to finish', async () => {
          const c = await counters(raw, q);
          return (c['attempts:success'] ?? 0) + (c['attempts:dead_letter'] ?? 0) >= ids.length && (await pending(q)).length === 0;
        });
        ac.abort();
        await Promise.all(workers);

        const expected = new Map([...ids.map((id) => [`${id}/1`, 1]), ['flaky/2', 1]]);
        assert.deepEqual(new Map([...runs].sort()), new Map([...expected].sort()), 'each job runs once (flaky: attempts 1 and 2)');
        const c = await counters(raw, q);
        assert.deepEqual(
          [c['dead_letters:crash_loop'], c['attempts:success'], c['dead_letters:permanent_error'], c['attempts:retry']],
          [undefined, ids.length - 1, 1, 1],
        );
        assert.deepEqual(
          [await raw('XLEN', q.keys.jobs), await raw('XLEN', q.keys.dlq), await raw('ZCARD', q.keys.delayed)],
          [0, 1, 0],
        );
        assert.deepEqual(stolen, [], 'another consumer reclaimed jobs whose outcome a worker held');
        assert.ok(refusals.length > 0, 'onOutcome says how often an outcome was refused');
        assert.ok(errors.length > 0 && errors.every((e) => /OOM command not allowed/.test(e.message)), `errors: ${errors.map((e) => e.message)}`);
      } finally {
        ac.abort();
        await lift();
        g.open();
      }
    });

    test('stopped while Redis refuses, a worker leaves the entry pending and says so', async () => {
      const q = await fresh();
      await q.enqueue('j', 'p');
      const g = gate();
      const errors = [];
      const ac = new AbortController();
      const done = q.work(policy, () => g.pass(), {
        signal: ac.signal, consumer: 'w1', batch: 1, blockMs: 20, promoteEveryMs: 0, reclaimEveryMs: 0,
        onError: (err) => errors.push(err),
      });
      let lift = async () => {};
      try {
        await until('the handler to run', () => g.waiting === 1);
        lift = await outOfMemory();
        g.open();
        await until('a refused outcome', () => errors.length > 0);
        ac.abort();
        await done;
        await lift();
        assert.match(errors.at(-1).message, /not applied: the worker stopped while Redis refused it/);
        assert.match(errors.at(-1).cause.message, /OOM/);
        assert.deepEqual((await pending(q)).map(([, consumer]) => consumer), ['w1'], 'the entry stays pending');
        assert.equal(g.waiting, 1, 'the job ran once');
      } finally {
        ac.abort();
        await lift();
        g.open();
      }
    });

    test('a worker starts while Redis is out of memory', async () => {
      const q = await fresh();
      await q.enqueue('j', 'p');
      let ran = 0;
      const ac = new AbortController();
      const lift = await outOfMemory();
      let done;
      try {
        done = q.work(policy, () => void ran++, { signal: ac.signal, consumer: 'w1', blockMs: 20, promoteEveryMs: 0, onError: () => {} });
        let failed;
        done.catch((err) => (failed = err));
        await until('the job to run', () => {
          if (failed) throw failed;
          return ran === 1;
        });
        await lift();
        await until('the job to be acked', async () => (await counters(raw, q))['attempts:success'] === 1);
      } finally {
        ac.abort();
        await lift();
      }
      await done;
      assert.equal(ran, 1);
    });

    test('hold() keeps this consumer’s entries, leaves others’, works out of memory', async () => {
      const q = await fresh();
      const ids = [];
      for (let i = 0; i < 5; i++) ids.push(await q.enqueue(`j${i}`, 'p'));
      await raw('XREADGROUP', 'GROUP', q.group, 'c1', 'COUNT', '5', 'STREAMS', q.keys.jobs, '>');
      await raw('XCLAIM', q.keys.jobs, q.group, 'c2', '0', ids[1], 'JUSTID');
      await q.ack(ids[2]); // finished
      await raw('XDEL', q.keys.jobs, ids[3]); // data gone
      const lift = await outOfMemory();
      try {
        await assert.rejects(q.ack(ids[4]), /OOM/);
        // Hold resets idle time: let the entries go idle first, as Redis sees it.
        const idle = async (id) => Number((await raw('XPENDING', q.keys.jobs, q.group, id, id, '1'))[0]?.[2] ?? 0);
        await until('the pending entries idle for 20ms', async () => (await idle(ids[0])) >= 20 && (await idle(ids[1])) >= 20);
        assert.deepEqual(await q.hold('c1', ids), [true, false, false, false, true]);
        const p = await raw('XPENDING', q.keys.jobs, q.group, '-', '+', '10');
        const byId = Object.fromEntries(p.map(([id, consumer, idle, deliveries]) => [id, { consumer, idle, deliveries }]));
        assert.equal(byId[ids[0]].consumer, 'c1');
        assert.equal(byId[ids[0]].deliveries, 1, 'holding is not a delivery');
        // Both were idle for 20ms before the hold: only the held one started again.
        assert.ok(byId[ids[0]].idle < byId[ids[1]].idle, `idle ${byId[ids[0]].idle} reset (the other's ${byId[ids[1]].idle})`);
        assert.equal(byId[ids[1]].consumer, 'c2');
        assert.ok(byId[ids[1]].idle >= 20, 'another consumer’s entry is left alone');
        assert.equal(byId[ids[3]], undefined);
        assert.deepEqual(await q.hold('c1', []), []);
        const script = (...args) => raw('EVAL', scriptSource('hold'), '1', q.keys.jobs, q.group, ...args);
        await assert.rejects(script('c1', 'x-1'), /ERR backstop hold: entry id must be a full stream id/);
        await assert.rejects(script('c1', '5'), /ERR backstop hold/);
        await assert.rejects(script('', ids[0]), /ERR backstop hold/);
        await assert.rejects(q.hold('c1', ['x-1']), { name: 'TypeError', message: /`entry`/ });
        await assert.rejects(q.hold('', ids), { name: 'TypeError', message: /`consumer`/ });
        await assert.rejects(q.hold('c1', 'nope'), { name: 'TypeError', message: /`entries`/ });
      } finally {
        await lift();
      }
    });

    test('which errors are worth sending again', async () => {
      const { writeRefused } = await import('../lib/redis/refused.js');
      const c = await connect();
      const q = await fresh(c);
      const reply = async (msg) => {
        try {
          await (typeof c.call === 'function' ? c.call('EVAL', 'return redis.error_reply(ARGV[1])', '0', msg) : c.sendCommand(['EVAL', 'return redis.error_reply(ARGV[1])', '0', msg]));
        } catch (err) {
          return err;
        }
        assert.fail(`no error for ${msg}`);
      };
      const rejection = (p) => p.then(() => assert.fail('no error'), (err) => err);
      await raw('SET', q.keys.stats, 'not a hash');
      const id = await q.enqueue('j', 'p').catch(() => raw('XADD', q.keys.jobs, '*', 'id', 'j', 'attempt', '1', 'first_enqueued_ms', '1'));
      await raw('XREADGROUP', 'GROUP', q.group, 'c', 'COUNT', '1', 'STREAMS', q.keys.jobs, '>');
      const closed = await kind.connect(server);
      await kind.close(closed);
      const refused = new Redis({ host: '127.0.0.1', port: 1, maxRetriesPerRequest: 0, retryStrategy: () => null });
      refused.on('error', () => {});
      const cases = [
        ['OOM', await reply("OOM command not allowed when used memory > 'maxmemory'."), true],
        ['READONLY', await reply("READONLY You can't write against a read only replica."), true],
        ['LOADING', await reply('LOADING Redis is loading the dataset in memory'), true],
        ['BUSY', await reply('BUSY Redis is busy running a script.'), true],
        ['MASTERDOWN', await reply('MASTERDOWN Link with MASTER is down'), true],
        ['MISCONF', await reply('MISCONF Redis is configured to save RDB snapshots, but it is unable to persist to disk.'), true],
        ['TRYAGAIN', await reply('TRYAGAIN Multiple keys request during rehashing of slot'), true],
        ['CLUSTERDOWN', await reply('CLUSTERDOWN The cluster is down'), true],
        ['NOREPLICAS', await reply('NOREPLICAS Not enough good replicas to write.'), true],
        ['max clients', await reply('ERR max number of clients reached'), true],
        ['wrapped by the queue', new Error('queue q: ack 1-0: OOM', { cause: await reply('OOM command not allowed') }), true],
        ['connection refused', await rejection(refused.call('PING')), true],
        ['BUSYGROUP', await reply('BUSYGROUP Consumer Group name already exists'), false],
        ['WRONGTYPE', await rejection(q.ack(id)), false],
        ['bad ARGV', await rejection(q.retry(id, 0, 'because', 'e')), false],
        ['NOPERM', await reply("NOPERM this user has no permissions to run the 'evalsha' command"), false],
        ['a plain error', new Error('boom'), false],
        ['not an error', 'OOM', false],
      ];
      if (name.startsWith('node-redis')) cases.push(['closed client', await rejection(closed.sendCommand(['PING'])), false]);
      refused.disconnect();
      for (const [what, err, want] of cases) assert.equal(writeRefused(err), want, `${what}: ${err?.message ?? err}`);
    });
  });
}
