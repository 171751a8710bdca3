// bin/backstop-decide.js: the vectors through the CLI, as the Go `backstop
// decide` command answers them.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { PRESET_NAMES } from '../lib/host/contract.gen.js';
import { parseJSON } from '../lib/json.js';

const bin = fileURLToPath(new URL('../bin/backstop-decide.js', import.meta.url));
const path = process.env.BACKSTOP_VECTORS ?? new URL('../../../testdata/vectors/vectors.json', import.meta.url);
const vectors = parseJSON(readFileSync(path, 'utf8'));
const dir = mkdtempSync(join(tmpdir(), 'backstop-decide-'));

// JSON.stringify, with BigInts written as the integers they are.
const stringify = (v) =>
  JSON.stringify(v, (_, x) => (typeof x === 'bigint' ? `\u0000${x}` : x)).replace(/"\\u0000(-?\d+)"/g, '$1');

function run(args, input) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [bin, ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d) => (stderr += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
    child.stdin.end(input);
  });
}

const line = (e) =>
  stringify(e.error !== undefined ? { error: e.error } : { action: e.action, delay_ms: e.delay_ms, reason: e.reason, class: e.class });

for (const [gi, group] of vectors.groups.entries()) {
  if (group.stateful) continue; // sequences with successes: the library tests run those
  test(`backstop-decide: ${group.name} (#${gi})`, async () => {
    let policyArg = group.preset;
    if (!policyArg) {
      policyArg = join(dir, `policy-${gi}.json`);
      writeFileSync(policyArg, JSON.stringify(group.policy));
    }
    const cases = group.cases.filter((c) => c.input);
    const input = cases.map((c) => `${stringify(c.input)}\n`).join('');
    // --random 0: the vectors read an absent random as 0; the command draws one.
    const { code, stdout, stderr } = await run(['--policy', policyArg, '--random', '0'], input);
    // The only stderr is the policy's lints (process warnings).
    assert.equal(stderr.split('\n').filter((l) => l && !/BackstopLintWarning|--trace-warnings/.test(l)).join('\n'), '');
    assert.equal(code, 0);
    assert.deepEqual(stdout.split('\n'), [...cases.map((c) => line(c.expect)), '']);
  });
}

test('backstop-decide: bad lines get an error and the stream goes on', async () => {
  const input = ['{"attempt": 1, "colour": 1}', 'garbage', '', '[1]', '{"attempt": 2, "http_status": 503, "random": 0.5}'].join('\n');
  const { code, stdout } = await run(['--policy=default'], input); // no final newline
  assert.equal(code, 0);
  assert.deepEqual(stdout.trimEnd().split('\n').map((l) => Object.keys(JSON.parse(l))[0]), ['error', 'error', 'error', 'error', 'action']);
  assert.match(stdout, /"colour: unknown field"/);
  assert.match(stdout, /"invalid input line: empty"/);
  assert.match(stdout, /"delay_ms":1000/);
});

test('backstop-decide: records a line\'s duration_ms before deciding it', async () => {
  // Three slow calls that fail permanently, and the fourth, a 503, finds
  // the breaker opened by the slow-call rate (without durations: retry).
  const policy = join(dir, 'slow.yaml');
  writeFileSync(policy, 'circuit_breaker: {type: failure_rate, slow_call_rate_threshold: 50, slow_call_duration_threshold: 100ms, sliding_window: {type: count, size: 4}, minimum_calls: 4, open_for: 30s}');
  const calls = [[400, 500], [400, 500], [400, -1], [400, 500], [503, 500]];
  const input = calls.map(([s, d], i) => `{"attempt":1,"http_status":${s},"now_ms":${1000 + i},"duration_ms":${d}}\n`).join('');
  const { code, stdout } = await run(['--policy', policy, '--random', '0'], input);
  assert.equal(code, 0);
  const lines = stdout.trimEnd().split('\n');
  assert.equal(lines.length, 5);
  assert.equal(lines[2], '{"error":"duration_ms: must be >= 0 (got -1)"}');
  assert.equal(lines[4], '{"action":"dead_letter","delay_ms":0,"reason":"circuit_open","class":"retryable"}');
});

test('backstop-decide: answers each line before the next is written', async () => {
  const child = spawn(process.execPath, [bin, '--policy', 'critical'], { stdio: ['pipe', 'pipe', 'inherit'] });
  child.stdout.setEncoding('utf8');
  const next = () => new Promise((resolve) => child.stdout.once('data', resolve));
  for (const attempt of [1, 2, 3]) {
    const answer = next();
    child.stdin.write(`{"attempt": ${attempt}, "http_status": 503, "random": 0.5}\n`);
    const d = JSON.parse(await answer);
    assert.equal(d.action, attempt < 3 ? 'retry' : 'dead_letter');
  }
  child.stdin.end();
  assert.equal(await new Promise((resolve) => child.on('close', resolve)), 0);
});

test('backstop-decide: an unknown policy is an error', async () => {
  const { code, stderr } = await run(['--policy', 'no-such-preset'], '');
  assert.equal(code, 1);
  assert.ok(stderr.includes(`is not a preset: ${PRESET_NAMES.join(', ')}`), stderr);
  const bad = join(dir, 'bad.json');
  writeFileSync(bad, '{"backoff": {"base": "1s", "cap": "1ms"}}');
  const res = await run(['--policy', bad], '');
  assert.equal(res.code, 1);
  assert.match(res.stderr, /invalid policy: backoff\.cap: must be >= backoff\.base/);
  assert.equal((await run(['--colour'], '')).code, 2);
});
