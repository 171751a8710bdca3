// Plain producers (issue 27): a jobs-stream entry without id, attempt,
// first_enqueued_ms and malformed_delayed_member is attempt 1 of the job
// called by its entry id, its payload the payload field or else the entry's
// "fields JSON" (lib/redis/plain.js), byte for byte what the scripts (lib.lua)
// write for it.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { loadPolicy } from '../index.js';
import { fieldsJSON } from '../lib/redis/plain.js';
import { createQueue } from '../lib/redis.js';
import { inspector, standalone } from '../test-support/clients.js';
import { entries } from '../test-support/queue-suite.js';
import { startRedis } from '../test-support/redis-server.js';

const b = (s) => Buffer.from(s, 'utf8');
const json = (obj) => fieldsJSON(Object.entries(obj).map(([k, v]) => [b(k), b(v)])).toString('utf8');

test('fieldsJSON: names in byte order, not UTF-16 code units nor locale', () => {
  // U+FF61 is EF BD A1 in UTF-8, U+1F600 F0 9F 98 80: bytewise U+FF61 comes
  // first, by UTF-16 code units (D83D DE00 < FF61) U+1F600 would.
  assert.ok('\u{1F600}' < '\uff61');
  assert.equal(json({ '\u{1F600}': '1', '\uff61': '2' }), '{"\uff61":"2","\u{1F600}":"1"}');
  // ASCII before every non-ASCII name; upper case before lower case (bytes, not locale).
  assert.equal(
    json({ é: 'e', z: 'z', Z: 'Z', a: 'a', '~': 't', '\u00ff': 'y', _: 'u', A: 'A' }),
    '{"A":"A","Z":"Z","_":"u","a":"a","z":"z","~":"t","é":"e","\u00ff":"y"}',
  );
  // A name that is a prefix of another comes first.
  assert.equal(json({ ab: '2', a: '1', '': '0' }), '{"":"0","a":"1","ab":"2"}');
  assert.equal(json({}), '{}');
});

test('fieldsJSON: only \\, " and bytes below 0x20 escaped, lowercase \\u00xx', () => {
  assert.equal(json({ 'k"\\': 'a"b\\c' }), '{"k\\"\\\\":"a\\"b\\\\c"}');
  assert.equal(json({ x: '\u0000\u0001\n\r\t\u001b\u001f' }), '{"x":"\\u0000\\u0001\\u000a\\u000d\\u0009\\u001b\\u001f"}');
  // 0x20, 0x7f, '/', non-ASCII (U+2028 too, which JSON.stringify keeps as well) as they are.
  assert.equal(json({ x: ' \u007f/é\u2028\u{1F600}<>&' }), '{"x":" \u007f/é\u2028\u{1F600}<>&"}');
  // Bytes that are not UTF-8 stay as they are.
  const out = fieldsJSON([[b('k'), Buffer.from([0xff, 0x80, 0x1f])]]);
  assert.deepEqual(out, Buffer.concat([b('{"k":"'), Buffer.from([0xff, 0x80]), b('\\u001f"}')]));
  // Valid JSON whose parse gives the fields back.
  const fields = { 'a"': '\\', b: '\u0000x', é: 'ü', '\u{1F600}': '\u007f' };
  assert.deepEqual(JSON.parse(json(fields)), fields);
});

const server = await startRedis();
const raw = inspector(server);
const policy = await loadPolicy({ max_attempts: 1 });
after(async () => {
  policy.close();
  await raw.close();
  await server.stop();
});

// The job read() gives for one entry added with fields, over client kind.
async function readOne(kind, id, fields) {
  await raw('FLUSHALL');
  const client = await standalone[kind].connect(server);
  try {
    const q = createQueue(client, 'p');
    await q.ensureGroup();
    await raw('XADD', q.keys.jobs, id, ...fields);
    const jobs = await q.read('c1');
    assert.equal(jobs.length, 1);
    return jobs[0];
  } finally {
    await standalone[kind].close(client);
  }
}

const pick = (j) => ({
  entryId: j.entryId, id: j.id, attempt: j.attempt, firstEnqueuedMs: j.firstEnqueuedMs, payload: j.payload,
  type: j.type, lastError: j.lastError, lastReason: j.lastReason, prevDelayMs: j.prevDelayMs, malformed: j.malformed,
});

for (const kind of ['ioredis 6', 'ioredis 6 RESP3 maps', 'node-redis 6', 'node-redis 6 RESP3', 'node-redis 4']) {
  test(`${kind}: a plain entry is attempt 1 of the job called by its entry id`, async () => {
    const job = await readOne(kind, '1733370000000-7', ['order', '42', 'type', 'send_email', 'note', 'b', 'order', '43']);
    assert.deepEqual(pick(job), {
      entryId: '1733370000000-7', id: '1733370000000-7', attempt: 1, firstEnqueuedMs: 1733370000000,
      // Every name once with its last value, type included, in byte order.
      payload: '{"note":"b","order":"43","type":"send_email"}',
      type: 'send_email', lastError: '', lastReason: '', prevDelayMs: 0, malformed: false,
    });
  });
}

test('a plain entry with payload fields: the last one is the payload', async () => {
  const job = await readOne('ioredis 6', '5-1', ['payload', 'p1', 'x', 'y', 'payload', 'p2']);
  assert.deepEqual([job.id, job.attempt, job.firstEnqueuedMs, job.payload, job.type, job.malformed], ['5-1', 1, 5, 'p2', '', false]);
});

test('non-ASCII names, escapes and duplicates in the fields JSON, over the wire', async () => {
  const job = await readOne('node-redis 6', '7-0', ['é', '1', 'z', 'q"\\', '\uff61', '\n', '\u{1F600}', 'x', 'é', '2', 'A', '\u007f']);
  assert.equal(job.payload, '{"A":"\u007f","z":"q\\"\\\\","é":"2","\uff61":"\\u000a","\u{1F600}":"x"}');
  assert.equal(job.malformed, false);
});

test('the first enqueued time past 2^53 - 1 ms is malformed', async () => {
  let job = await readOne('ioredis 6', '9007199254740991-0', ['k', 'v']);
  assert.deepEqual([job.firstEnqueuedMs, job.malformed], [9007199254740991, false]);
  job = await readOne('ioredis 6', '9007199254740992-0', ['k', 'v']);
  assert.equal(job.malformed, true);
});

test('an entry with any of the job fields keeps the malformed rules', async () => {
  for (const fields of [
    ['id', '', 'k', 'v'],
    ['attempt', '1', 'first_enqueued_ms', '5'],
    ['first_enqueued_ms', '5'],
    ['malformed_delayed_member', 'junk'],
    ['id', 'j', 'attempt', 'x', 'first_enqueued_ms', '5'],
  ]) {
    const job = await readOne('ioredis 6', '9-0', fields);
    assert.equal(job.malformed, true, JSON.stringify(fields));
  }
  const job = await readOne('ioredis 6', '9-0', ['id', 'j', 'attempt', '2', 'first_enqueued_ms', '5', 'payload', 'x']);
  assert.deepEqual([job.id, job.attempt, job.firstEnqueuedMs, job.payload, job.malformed], ['j', 2, 5, 'x', false]);
});

test('the scripts resolve a plain entry as read() does: the dead letter holds the same job', async () => {
  const fields = ['é', '1', 'z', 'q"\\\u0001', '\uff61', '\t', '\u{1F600}', 'x', 'é', '2', 'type', 'send_email'];
  await raw('FLUSHALL');
  const q = createQueue(raw.client, 'p');
  await q.ensureGroup();
  await raw('XADD', q.keys.jobs, '1733370000000-3', ...fields);
  const [job] = await q.read('c1');
  const out = await q.apply(job, new Error('boom'), policy);
  assert.equal(out.action, 'dead_letter');
  assert.equal(out.applied, true);
  const [dead] = await entries(raw, q.keys.dlq);
  assert.equal(dead.fields.id, job.id);
  assert.equal(dead.fields.attempt, '1');
  assert.equal(dead.fields.first_enqueued_ms, String(job.firstEnqueuedMs));
  assert.equal(dead.fields.payload, job.payload);
  assert.equal(dead.fields.type, 'send_email');
  // The earlier é went to entry.* (the JSON holds its last value).
  assert.equal(dead.fields['entry.é'], '1');
});
