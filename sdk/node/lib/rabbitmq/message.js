// The messages of the RabbitMQ queue: the headers every job carries, the
// job of a delivery as the handler sees it, a dead letter as inspect() and
// replay() see it, and what a moved message keeps.
import { createHash } from 'node:crypto';

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
});

// The job of a delivery, as the handler sees it.
export function jobOf(msg, queue) {
  const p = msg.properties ?? {};
  const h = p.headers ?? {};
  let id = typeof p.messageId === 'string' ? p.messageId : text(p.messageId);
  let attempt;
  let first;
  const isPlain = plain(h);
  if (isPlain) {
    // A producer that knows nothing of backstop (README, "Plain producers"):
    // attempt 1 of the job called by its message_id, else by its body's
    // SHA-256, enqueued at its timestamp, else now.
    if (id === '') id = `sha256:${createHash('sha256').update(msg.content ?? Buffer.alloc(0)).digest('hex')}`;
    attempt = 1;
    first = timestampMs(p.timestamp) ?? Date.now();
  } else {
    const attemptRaw = digits(h[H.attempt]);
    // '01' is not an attempt: the Redis scripts and Go read digits without a leading zero.
    const leadingZero = typeof h[H.attempt] === 'string' && /^0./.test(h[H.attempt]);
    attempt = attemptRaw !== null && attemptRaw >= 1 && attemptRaw <= MAX_ATTEMPT && !leadingZero ? attemptRaw : null;
    first = digits(h[H.first]);
  }
  const malformed = id === '' || attempt === null || first === null;
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
    deliveryCount: digits(h['x-delivery-count']) ?? 0,
    queue,
    headers: h,
    malformed,
    key: malformed ? null : `${id}\u0000${attempt}`,
  };
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
    headers: h,
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

// The properties a moved message keeps.
export function props(msg) {
  const p = msg.properties ?? {};
  const out = { persistent: true };
  if (p.messageId !== undefined) out.messageId = p.messageId;
  if (p.contentType !== undefined) out.contentType = p.contentType;
  if (p.contentEncoding !== undefined) out.contentEncoding = p.contentEncoding;
  if (p.correlationId !== undefined) out.correlationId = p.correlationId;
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
