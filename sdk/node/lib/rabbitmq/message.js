// The messages of the RabbitMQ queue: the headers every job carries, the
// job of a delivery as the handler sees it, a dead letter as inspect() and
// replay() see it, what a moved message keeps and the bounds every published one keeps.
import { randomBytes } from 'node:crypto';

// The largest attempt, as the Redis scripts and Go accept it.
const MAX_ATTEMPT = 1e14 - 1;
// What a malformed delivery is dead-lettered with (every header kept).
export const MALFORMED = 'malformed message: needs message_id, backstop-attempt >= 1 and backstop-first-enqueued-ms';
// The headers of a job's message.
export const H = Object.freeze({
  attempt: 'backstop-attempt',
  first: 'backstop-first-enqueued-ms',
  destination: 'backstop-destination',
  lastReason: 'backstop-last-reason',
  lastError: 'backstop-last-error',
  prevDelay: 'backstop-prev-delay-ms',
  due: 'backstop-due-ms',
  jobType: 'backstop-job-type',
  reason: 'backstop-reason',
  error: 'backstop-error',
  deadLettered: 'backstop-dead-lettered-ms',
  dropped: 'backstop-dropped-headers',
  moveRefusals: 'backstop-move-refusals',
});
// backstop-last-error and backstop-error at most (UTF-8 bytes, the marker
// included), and a published header table at most (encoded): well below the
// broker's frame_max (128 KiB), past which it closes the connection.
export const MAX_ERROR_BYTES = 8192;
export const MAX_TABLE_BYTES = 65536;
// backstop-dropped-headers at most (bytes).
const MAX_DROPPED_BYTES = 1024;
// How far ahead of the worker's clock backstop-due-ms may be: 30 days.
export const MAX_DUE_AHEAD_MS = 2_592_000_000;

// The job of a delivery at now (unix ms), as the handler sees it. A plain
// delivery without message_id is to be adopted (adopt: true, id ''), not run.
export function jobOf(msg, queue, now = Date.now()) {
  const p = msg.properties ?? {};
  const h = p.headers ?? {};
  let id = typeof p.messageId === 'string' ? p.messageId : text(p.messageId);
  let attempt;
  let first;
  const isPlain = plain(h);
  if (isPlain) {
    // A producer that knows nothing of backstop (README, "Plain producers"):
    // attempt 1 of the job called by its message_id (one without is adopted
    // first: adoptedId()), enqueued at its timestamp, else now.
    attempt = 1;
    first = timestampMs(p.timestamp) ?? now;
  } else {
    const attemptRaw = digits(h[H.attempt]);
    // '01' is not an attempt: the Redis scripts and Go read digits without a leading zero.
    const leadingZero = typeof h[H.attempt] === 'string' && /^0./.test(h[H.attempt]);
    attempt = attemptRaw !== null && attemptRaw >= 1 && attemptRaw <= MAX_ATTEMPT && !leadingZero ? attemptRaw : null;
    first = digits(h[H.first]);
  }
  const adopt = isPlain && id === '';
  const malformed = (id === '' && !adopt) || attempt === null || first === null;
  return {
    id,
    attempt: attempt ?? 0,
    firstEnqueuedMs: first ?? 0,
    payload: msg.content,
    contentType: p.contentType,
    jobType: text(h[H.jobType]),
    lastReason: text(h[H.lastReason]),
    lastError: text(h[H.lastError]),
    prevDelayMs: isPlain ? 0 : digits(h[H.prevDelay]) ?? 0,
    dueMs: digits(h[H.due]),
    // The broker's count only on a redelivery: on a first delivery it is
    // another publisher's (a shovel copies it).
    deliveryCount: msg.fields?.redelivered ? digits(h['x-delivery-count']) ?? 0 : 0,
    queue,
    headers: h,
    malformed,
    adopt,
    key: malformed || adopt ? null : `${id}\u0000${attempt}`,
  };
}

// What a delivery whose backstop-due-ms is more than MAX_DUE_AHEAD_MS ahead
// is dead-lettered with (reason malformed): it would cycle through the levels for ever.
export const DUE_ERROR = 'malformed message: backstop-due-ms is more than 30 days ahead';

// The message_id a plain message without one is adopted with: amqp- and
// 32 random lowercase hex characters.
export function adoptedId() {
  return `amqp-${randomBytes(16).toString('hex')}`;
}

// s at most MAX_ERROR_BYTES of UTF-8, cut on a character boundary and
// ending with the marker " …[truncated: N bytes]" (N: s's length in bytes).
export function boundError(s) {
  const b = Buffer.from(s, 'utf8');
  if (b.length <= MAX_ERROR_BYTES) return s;
  const marker = ` …[truncated: ${b.length} bytes]`;
  let end = MAX_ERROR_BYTES - Buffer.byteLength(marker);
  while (end > 0 && (b[end] & 0xc0) === 0x80) end--; // not inside a character
  return b.subarray(0, end).toString('utf8') + marker;
}

// Headers h as published (README, "Headers"): without x-delivery-count
// (the broker's count of the old place, or another publisher's), the
// error headers bounded (boundError); then, when the encoded table is over
// MAX_TABLE_BYTES, foreign headers (neither backstop-* nor x-death) dropped,
// largest first (ties by name), until it fits with room for the list of
// their names, appended to backstop-dropped-headers (whole names, at most
// 1024 bytes). A copy; h is not changed. As Go's boundHeaders.
export function fitHeaders(h) {
  const out = { ...h };
  delete out['x-delivery-count'];
  for (const k of [H.lastError, H.error]) if (typeof out[k] === 'string') out[k] = boundError(out[k]);
  let size = tableSize(out);
  if (size <= MAX_TABLE_BYTES) return out;
  const foreign = Object.keys(out)
    .filter((k) => !k.startsWith('backstop-') && k !== 'x-death' && out[k] !== undefined)
    .map((k) => [k, entrySize(k, out[k])])
    .sort(([a, x], [b, y]) => y - x || (a < b ? -1 : a > b ? 1 : 0));
  const dropped = [];
  if (Object.hasOwn(out, H.dropped)) { // rewritten below, with the new names
    if (out[H.dropped] !== undefined) size -= entrySize(H.dropped, out[H.dropped]);
    const prev = text(out[H.dropped]);
    delete out[H.dropped];
    if (prev !== '') dropped.push(prev);
  }
  // Room for the list of dropped names, at its largest.
  const limit = MAX_TABLE_BYTES - entrySize(H.dropped, ' '.repeat(MAX_DROPPED_BYTES));
  for (const [k, n] of foreign) {
    if (size <= limit) break;
    delete out[k];
    size -= n;
    dropped.push(k);
  }
  let list = dropped.join(',');
  while (Buffer.byteLength(list) > MAX_DROPPED_BYTES) {
    // Whole names only: the last goes until the list fits.
    const b = Buffer.from(list);
    list = b.subarray(0, Math.max(0, b.lastIndexOf(',', MAX_DROPPED_BYTES))).toString();
  }
  out[H.dropped] = list;
  return out;
}

// The size of h encoded as amqplib encodes a field table.
export function tableSize(h) {
  let n = 4;
  for (const [k, v] of Object.entries(h ?? {})) if (v !== undefined) n += entrySize(k, v);
  return n;
}

function entrySize(k, v) {
  return 1 + Buffer.byteLength(k) + valueSize(v);
}

// The size of a field value as amqplib encodes it (a number as the
// smallest integer that holds it, or a double; {'!': type, value} as type).
function valueSize(v) {
  let type = typeof v;
  let x = v;
  if (v !== null && type === 'object' && Object.hasOwn(v, '!')) {
    type = v['!'];
    x = v.value;
  }
  if (type === 'number') {
    if (x >= 0x8000000000000000 || (Math.abs(x) < 0x4000000000000 && Math.floor(x) !== x)) return 9;
    if (x < 128 && x >= -128) return 2;
    if (x >= -0x8000 && x < 0x8000) return 3;
    return x >= -0x80000000 && x < 0x80000000 ? 5 : 9;
  }
  switch (type) {
    case 'string':
      return 5 + Buffer.byteLength(x, 'utf8');
    case 'boolean': case 'byte': case 'int8': case 'uint8':
      return 2;
    case 'short': case 'int16': case 'uint16':
      return 3;
    case 'int': case 'int32': case 'uint32': case 'float':
      return 5;
    case 'decimal':
      return 6;
    case 'object':
      if (x === null) return 1;
      if (Array.isArray(x)) return 5 + x.reduce((n, y) => n + valueSize(y), 0);
      if (Buffer.isBuffer(x)) return 5 + x.length;
      return 1 + tableSize(x);
    default:
      return 9; // double, long, timestamp
  }
}

// A delivery is plain when it has neither of the headers every job carries.
export function plain(h) {
  return !Object.hasOwn(h, H.attempt) && !Object.hasOwn(h, H.first);
}

// The timestamp property (unix seconds) in ms; null when unset or 0.
function timestampMs(ts) {
  const s = typeof ts === 'bigint' ? Number(ts) : ts;
  if (typeof s !== 'number' || !Number.isSafeInteger(s) || s <= 0 || !Number.isSafeInteger(s * 1000)) return null;
  return s * 1000;
}

// A dead letter as inspect() and replay() see it.
export function deadLetterOf(msg) {
  const p = msg.properties ?? {};
  const h = p.headers ?? {};
  // backstop's reason, else the broker's (its latest x-death): its
  // delivery_limit is a crash loop no worker could dead-letter.
  let reason = text(h[H.reason]);
  if (reason === '' && Array.isArray(h['x-death']) && h['x-death'].length > 0) reason = text(h['x-death'][0]?.reason);
  if (reason === '') reason = text(h['x-first-death-reason']);
  if (reason === 'delivery_limit') reason = 'crash_loop';
  return {
    id: typeof p.messageId === 'string' ? p.messageId : text(p.messageId),
    reason,
    error: text(h[H.error]),
    attempt: digits(h[H.attempt]),
    firstEnqueuedMs: digits(h[H.first]),
    deadLetteredMs: digits(h[H.deadLettered]),
    jobType: text(h[H.jobType]),
    destination: text(h[H.destination]),
    payload: msg.content,
    contentType: p.contentType,
    headers: Object.fromEntries(Object.entries(h).filter(([k]) => k !== 'x-delivery-count')), // not the broker's count of looks
  };
}

// The broker's own headers: they describe the old place (x-death counts
// per queue) and are not moved, except with a malformed message.
const BROKER_HEADERS = new Set([
  'x-death', 'x-first-death-exchange', 'x-first-death-queue', 'x-first-death-reason',
  'x-last-death-exchange', 'x-last-death-queue', 'x-last-death-reason', 'x-delivery-count',
]);

// The headers a moved message keeps: every one (the job type, others'),
// less the broker's.
export function moveHeaders(h) {
  const out = {};
  for (const [k, v] of Object.entries(h ?? {})) if (!BROKER_HEADERS.has(k)) out[k] = v;
  return out;
}

// The properties a moved message keeps (as Go's next: not expiration, user_id).
export function props(msg) {
  const p = msg.properties ?? {};
  const out = { persistent: true };
  if (p.messageId !== undefined) out.messageId = p.messageId;
  if (p.contentType !== undefined) out.contentType = p.contentType;
  if (p.contentEncoding !== undefined) out.contentEncoding = p.contentEncoding;
  if (p.correlationId !== undefined) out.correlationId = p.correlationId;
  if (p.priority !== undefined) out.priority = p.priority;
  if (p.replyTo !== undefined) out.replyTo = p.replyTo;
  if (p.type !== undefined) out.type = p.type;
  if (p.appId !== undefined) out.appId = p.appId;
  if (p.timestamp !== undefined) out.timestamp = p.timestamp;
  return out;
}

// A header as a whole number >= 0: a string of digits or an AMQP integer.
export function digits(v) {
  if (typeof v === 'number') return Number.isSafeInteger(v) && v >= 0 ? v : null;
  if (typeof v === 'bigint') return v >= 0n && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : null;
  // Bytes are not digits (as Go reads them): a binary attempt is malformed.
  if (typeof v !== 'string' || !/^\d{1,18}$/.test(v)) return null;
  return Number(v); // past 2^53 only for absurd times, which stay absurd
}

export function text(v) {
  if (typeof v === 'string') return v;
  if (Buffer.isBuffer(v)) return v.toString('utf8');
  return v === null || v === undefined ? '' : String(v);
}
