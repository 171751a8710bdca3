#!/usr/bin/env node
// backstop-decide: failures in (JSON lines, the vector `input` shape),
// decisions out (one JSON line each, in order), like the Go `backstop
// decide` command: for the same input both write the same bytes
// (testdata/vectors/README.md, "Input lines"). Every input line gets exactly
// one output line: a blank, invalid or overlong line (and a last line
// without "\n") included; a bad line gets {"error": "..."} and the stream
// goes on. A line without random (or with null) gets a uniform draw in
// [0, 1) (jitter scales the delay by it; 0 would make every delay of full
// jitter 0); --random X gives such a line X instead, so the output depends
// on the input only. An absent now_ms is 0, as in the vectors. A line's
// duration_ms (how long the call took) is recorded before its failure is
// decided, for a slow-call-rate breaker.
import { existsSync, readFileSync } from 'node:fs';
import { PolicyError, loadPolicy } from '../index.js';
import { parseJSON } from '../lib/json.js';
import { PRESET_NAMES, toBigInt } from '../lib/host/contract.gen.js';
import { InputError } from '../lib/host/errors.js';

// The presets' names come from the schema (contract/abi.json), not a list here.
const PRESETS = PRESET_NAMES;
// The input fields: the library also takes their camelCase names, the
// command only these, as the Go command.
const FIELDS = new Set([
  'attempt', 'http_status', 'grpc_code', 'error_kind', 'retry_after', 'grpc_retry_pushback_ms',
  'method', 'idempotency_key', 'elapsed_ms', 'now_ms', 'random', 'prev_delay_ms',
  'retried_downstream', 'server_declined', 'duration_ms',
]);
// The limits of a line (internal/vector/line.go).
const MAX_LINE_BYTES = 4 << 20;
const MAX_DEPTH = 32;
const MAX_NUMBER_CHARS = 32;
const USAGE = 'usage: backstop-decide [--policy FILE|PRESET] [--random draw|X] < failures.jsonl > decisions.jsonl';

const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

function fail(msg, code = 1) {
  process.stderr.write(`backstop-decide: ${msg}\n`);
  process.exit(code);
}

// --policy and --random, as the Go flag package reads them (-name,
// --name, either with =value or the next argument).
function parseArgs(argv) {
  const flags = { policy: 'default', random: 'draw' };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const name = /^--?(policy|random)(=|$)/.exec(a)?.[1];
    if (a === '-h' || a === '--help') {
      process.stdout.write(`${USAGE}\n`);
      process.exit(0);
    } else if (name && a.includes('=')) {
      flags[name] = a.slice(a.indexOf('=') + 1);
    } else if (name) {
      if (i + 1 >= argv.length) fail(`--${name} needs a value\n${USAGE}`, 2);
      flags[name] = argv[++i];
    } else {
      fail(`unexpected argument ${JSON.stringify(a)}\n${USAGE}`, 2);
    }
  }
  return flags;
}

// The random of a line that sets none: a draw per line, or --random's X.
function absentRandomOf(flag) {
  if (flag === 'draw') return Math.random;
  const r = /^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(flag) ? Number(flag) : NaN;
  if (!(r >= 0 && r < 1)) fail(`--random must be draw or a number in [0, 1), got ${JSON.stringify(flag)}\n${USAGE}`, 2);
  return () => r;
}
let absentRandom = Math.random;

// A preset name, unless a file of that name exists; otherwise a file.
function readPolicy(arg) {
  if (PRESETS.includes(arg) && !existsSync(arg)) return arg;
  try {
    return readFileSync(arg);
  } catch (err) {
    fail(`${err.message} (and ${JSON.stringify(arg)} is not a preset: ${PRESETS.join(', ')})`);
  }
}

// The answer to one line (its bytes without the "\n"), as a JSON line.
function answer(policy, line, tooLong) {
  return `${JSON.stringify(answerOf(policy, line, tooLong)).replace(/[\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16)}`)}\n`;
}

function answerOf(policy, line, tooLong) {
  const bad = (reason) => ({ error: `invalid input line: ${reason}` });
  if (tooLong) return bad(`longer than ${MAX_LINE_BYTES} bytes`);
  if (line.every((b) => b === 0x20 || b === 0x09 || b === 0x0d)) return bad('empty');
  let text;
  try {
    text = utf8.decode(line);
  } catch {
    return bad('not UTF-8');
  }
  const { depth, longNumber } = scan(text);
  if (depth > MAX_DEPTH) return bad(`nested deeper than ${MAX_DEPTH} levels`);
  if (longNumber) return bad(`a number longer than ${MAX_NUMBER_CHARS} characters`);
  let input;
  try {
    input = parseJSON(text);
  } catch {
    return bad('not valid JSON');
  }
  if (input === null || typeof input !== 'object' || Array.isArray(input)) return bad('expected a JSON object');
  // The least unknown name in code point order: UTF-8's byte order (a lone
  // surrogate reads as U+FFFD).
  const unknown = Object.keys(input).filter((name) => !FIELDS.has(name)).map((name) => Buffer.from(name)).sort(Buffer.compare)[0];
  if (unknown !== undefined) return { error: `${unknown}: unknown field` };
  // duration_ms is the line's, not the failure's: how long the call took,
  // recorded (at a valid now_ms) before the failure is decided, as a loop
  // does (internal/vector/line.go, DecodeCallLine).
  const { duration_ms: duration, ...failure } = input;
  input = failure;
  if (input.random === null || input.random === undefined) input.random = absentRandom();
  if (input.now_ms === null || input.now_ms === undefined) input.now_ms = 0;
  try {
    if (duration !== null && duration !== undefined) {
      const ms = lineDuration(duration);
      let now;
      try {
        now = toBigInt(input.now_ms, 'now_ms');
      } catch {
        now = undefined; // the failure's error says so
      }
      if (now !== undefined) policy.recordDuration(ms, now);
    }
    const d = policy.decide(input);
    return { action: d.action, delay_ms: d.delayMs, reason: d.reason, class: d.class };
  } catch (err) {
    return { error: err.message }; // an InputError: "field: reason", as Go prints it
  }
}

// A line's duration_ms: an integer (a number with no fraction), >= 0.
function lineDuration(v) {
  if (typeof v === 'number' && !Number.isInteger(v)) throw new InputError('duration_ms', `must be an integer (got ${v})`);
  const ms = toBigInt(v, 'duration_ms');
  if (ms < 0n) throw new InputError('duration_ms', `must be >= 0 (got ${ms})`);
  return ms;
}

// The deepest nesting of brackets outside strings, and whether a run of
// number characters outside strings is longer than MAX_NUMBER_CHARS. A
// string runs from '"' to the next '"' not escaped by '\'; an unterminated
// one to the end (internal/vector/line.go, scanLine).
function scan(s) {
  let depth = 0;
  let d = 0;
  let run = 0;
  let longNumber = false;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 0x22) {
      for (i++; i < s.length && s.charCodeAt(i) !== 0x22; i++) {
        if (s.charCodeAt(i) === 0x5c) i++;
      }
      run = 0;
    } else if (c === 0x5b || c === 0x7b) {
      if (++d > depth) depth = d;
      run = 0;
    } else if (c === 0x5d || c === 0x7d) {
      d--;
      run = 0;
    } else if ((c >= 0x30 && c <= 0x39) || c === 0x2d || c === 0x2b || c === 0x2e || c === 0x65 || c === 0x45) {
      if (++run > MAX_NUMBER_CHARS) longNumber = true;
    } else {
      run = 0;
    }
  }
  return { depth, longNumber };
}

async function main() {
  const flags = parseArgs(process.argv.slice(2));
  const arg = flags.policy;
  absentRandom = absentRandomOf(flags.random);
  let policy;
  try {
    policy = await loadPolicy(readPolicy(arg));
  } catch (err) {
    if (err instanceof PolicyError) fail(`${arg}: ${err.message}`);
    throw err;
  }

  process.stdout.on('error', (err) => {
    if (err.code === 'EPIPE') process.exit(0); // the reader went away
    throw err;
  });
  // The current line's pieces; a line past the limit is not kept.
  const parts = [];
  let size = 0;
  let tooLong = false;
  const take = () => {
    const line = parts.length === 1 ? parts[0] : Buffer.concat(parts);
    const out = answer(policy, line, tooLong);
    parts.length = 0;
    size = 0;
    tooLong = false;
    return out;
  };
  // One write per chunk read: a process that writes one line and waits for
  // the answer gets it, and a long stream is not written line by line.
  for await (const chunk of process.stdin) {
    let out = '';
    for (let start = 0; ; ) {
      const nl = chunk.indexOf(0x0a, start);
      const end = nl < 0 ? chunk.length : nl;
      if (end > start && (size += end - start) > MAX_LINE_BYTES) {
        tooLong = true;
        parts.length = 0;
      } else if (end > start && !tooLong) {
        parts.push(chunk.subarray(start, end));
      }
      if (nl < 0) break;
      out += take();
      start = nl + 1;
    }
    if (out && !process.stdout.write(out)) {
      await new Promise((resolve) => process.stdout.once('drain', resolve));
    }
  }
  if (size > 0 || tooLong) process.stdout.write(take()); // a last line without "\n"
}

main().catch((err) => fail(err.stack ?? String(err)));
