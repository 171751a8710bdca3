#!/usr/bin/env node
// backstop-decide: failures in (JSON lines, the vector `input` shape),
// decisions out (one JSON line each, in order), like the Go `backstop
// decide` command, so the two hosts can be compared line for line. A bad
// line gets {"error": "..."} and the stream goes on. An absent random or
// now_ms is 0 here, as in the vectors: the output depends on the input only.
import { existsSync, readFileSync } from 'node:fs';
import { InputError, PolicyError, loadPolicy } from '../index.js';
import { parseJSON } from '../lib/json.js';
import { GRPC_CODES } from '../lib/policy.js';

const PRESETS = ['default', 'critical', 'batch', 'fast-transient'];
// The input fields and their JSON types, checked as strictly as the Go
// command decodes them, so that both give the same answer for any line.
const FIELDS = {
  attempt: 'int', http_status: 'int', elapsed_ms: 'int', now_ms: 'int', prev_delay_ms: 'int',
  error_kind: 'string', retry_after: 'string', grpc_retry_pushback_ms: 'string', method: 'string',
  idempotency_key: 'string', grpc_code: 'grpc', random: 'random',
};
const SPECIAL = ['NaN', 'Infinity', '+Infinity', '-Infinity'];
const USAGE = 'usage: backstop-decide [--policy FILE|PRESET] < failures.jsonl > decisions.jsonl';

function fail(msg, code = 1) {
  process.stderr.write(`backstop-decide: ${msg}\n`);
  process.exit(code);
}

function parseArgs(argv) {
  let policy = 'default';
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '-h' || a === '--help') {
      process.stdout.write(`${USAGE}\n`);
      process.exit(0);
    } else if (a === '--policy' || a === '-policy') {
      if (i + 1 >= argv.length) fail(`--policy needs a value\n${USAGE}`, 2);
      policy = argv[++i];
    } else if (a.startsWith('--policy=') || a.startsWith('-policy=')) {
      policy = a.slice(a.indexOf('=') + 1);
    } else {
      fail(`unexpected argument ${JSON.stringify(a)}\n${USAGE}`, 2);
    }
  }
  return policy;
}

// A preset name, unless a file of that name exists; otherwise a file.
function readPolicy(arg) {
  if (PRESETS.includes(arg) && !existsSync(arg)) return arg;
  try {
    return readFileSync(arg);
  } catch (err) {
    fail(`${err.message} (and ${JSON.stringify(arg)} is not a preset: ${PRESETS.join(', ')})`);
  }
}

function answer(policy, line) {
  let input;
  try {
    input = parseJSON(line);
  } catch (err) {
    return { error: `invalid input line: ${err.message}` };
  }
  if (input === null || typeof input !== 'object' || Array.isArray(input)) {
    return { error: 'invalid input line: expected a JSON object' };
  }
  const problem = check(input);
  if (problem) return { error: `invalid input line: ${problem}` };
  try {
    const d = policy.decide({ random: 0, now_ms: 0, ...input });
    return { action: d.action, delay_ms: d.delayMs, reason: d.reason, class: d.class };
  } catch (err) {
    if (err instanceof InputError) return { error: err.message };
    throw err;
  }
}

// Returns what is wrong with the input's fields, if anything, and turns a
// gRPC status name into its code.
function check(input) {
  const show = (v) => (typeof v === 'bigint' ? String(v) : JSON.stringify(v));
  for (const [k, v] of Object.entries(input)) {
    const type = FIELDS[k];
    if (type === undefined) return `unknown field ${JSON.stringify(k)}`;
    if (v === null) continue; // as absent, like Go's encoding/json
    if (type === 'int' && !(typeof v === 'bigint' || Number.isInteger(v))) return `${k}: must be an integer (got ${show(v)})`;
    if (type === 'string' && typeof v !== 'string') return `${k}: must be a string (got ${show(v)})`;
    if (type === 'random' && typeof v !== 'number' && !SPECIAL.includes(v)) {
      return `random: must be a number, "NaN", "Infinity" or "-Infinity" (got ${show(v)})`;
    }
    if (type === 'grpc') {
      if (typeof v === 'string') {
        const code = GRPC_CODES.get(v.toUpperCase());
        if (code === undefined) return `grpc_code: unknown gRPC status name ${JSON.stringify(v)}`;
        input.grpc_code = code;
      } else if (!(typeof v === 'bigint' || Number.isInteger(v))) {
        return `grpc_code: must be a number or a status name (got ${show(v)})`;
      }
    }
  }
  return '';
}

async function main() {
  const arg = parseArgs(process.argv.slice(2));
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
  let rest = '';
  process.stdin.setEncoding('utf8');
  // One write per chunk read: a process that writes one line and waits for
  // the answer gets it, and a long stream is not written line by line.
  for await (const chunk of process.stdin) {
    const lines = (rest + chunk).split('\n');
    rest = lines.pop();
    let out = '';
    for (const line of lines) {
      if (line.trim()) out += `${JSON.stringify(answer(policy, line))}\n`;
    }
    if (out && !process.stdout.write(out)) {
      await new Promise((resolve) => process.stdout.once('drain', resolve));
    }
  }
  if (rest.trim()) process.stdout.write(`${JSON.stringify(answer(policy, rest))}\n`);
}

main().catch((err) => fail(err.stack ?? String(err)));
