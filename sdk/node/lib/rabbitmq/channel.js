// What every part of the RabbitMQ queue does on an amqplib channel:
// publish with a confirm, return what it holds, wait for it to be lost, and
// the backoff between attempts at a lost connection.
import { digits, fitHeaders, props } from './message.js';

// The backoff between attempts at a lost connection or channel, doubling.
export const BACKOFF_MIN_MS = 100;
export const BACKOFF_MAX_MS = 5000;

// The x-delivery-count at which a dead letter looked at is given back as a
// fresh copy rather than returned (giveBack).
const REFRESH_AT = 10;

// Gives msgs, dead letters taken from queue on confirm channel ch and not
// moved (by inspect, or a replay that did not take them), back in the
// order taken, so that looking never uses them up (README, "The DLQ
// workflow"): RabbitMQ 3.10 to 4.2 count every return in x-delivery-count
// (nack, reject, a closed channel alike) and 4.x quorum queues drop a
// message at a delivery limit of 20 by default. Returned with basic.nack
// (requeue); but when one has been delivered REFRESH_AT times or more,
// each is published again to queue instead, unchanged but for
// x-delivery-count (confirmed), then acked: the copies start at 0. A crash
// in between leaves a dead letter twice, never none.
export async function giveBack(ch, queue, msgs) {
  if (!msgs.some((m) => (digits(m.properties?.headers?.['x-delivery-count']) ?? 0) >= REFRESH_AT)) {
    for (const m of msgs) ch.nack(m, false, true);
    return;
  }
  const confirms = msgs.map((m) => publish(ch, '', queue, m.content, { ...props(m), headers: m.properties?.headers ?? {} }));
  for (const c of confirms) c.catch(() => {}); // awaited below
  for (const [i, m] of msgs.entries()) {
    await confirms[i]; // refused: the originals come back when ch closes
    ch.ack(m);
  }
}

// Resolves once p (a channel's close, a cancel) settles, or after ms: the
// broker of a blocked connection (a memory or disk alarm) reads nothing.
export async function within(p, ms) {
  let timer;
  await Promise.race([p.catch(() => {}), new Promise((resolve) => {
    timer = setTimeout(resolve, ms);
  })]);
  clearTimeout(timer);
}

// A negative publisher confirm: the broker refused the message (a full
// queue's x-overflow = reject-publish).
export class Rejected extends Error {}

// Publishes on a confirm channel and resolves once the broker confirmed
// (acked): no timeout of its own, the confirm or the channel's close says
// what became of the message. Its headers are published as fitHeaders
// bounds them, so that no publish exceeds the broker's frame_max.
export function publish(ch, exchange, routingKey, body, props) {
  if (props.headers) props = { ...props, headers: fitHeaders(props.headers) };
  return new Promise((resolve, reject) => {
    try {
      ch.publish(exchange, routingKey, body, props, (err) => {
        if (err === null || err === undefined) resolve();
        // amqplib fails the unconfirmed messages of a closed channel too ('channel closed'): only a nack is a refusal.
        else if (err?.message === 'message nacked') {
          reject(new Rejected(`the broker rejected the message to ${JSON.stringify(exchange || routingKey)}`, { cause: err }));
        } else reject(err);
      });
    } catch (err) {
      reject(err);
    }
  });
}

// A declaration the broker refused because the queue exists with other
// arguments (AMQP 406), as amqplib reports it (possibly wrapped by #error).
export function preconditionFailed(err) {
  return amqpCode(err, 406);
}

// Whether err (or one it wraps) is the broker's AMQP reply code.
export function amqpCode(err, code) {
  for (let e = err; e; e = e.cause) if (e.code === code) return true;
  return false;
}

// -- arguments ---------------------------------------------------------------------

// A signal that aborts when any of signals does; dispose() forgets them.
export function anySignal(...signals) {
  const c = new AbortController();
  const abort = () => c.abort();
  const on = signals.filter((s) => s !== undefined);
  for (const s of on) {
    if (s.aborted) c.abort();
    else s.addEventListener('abort', abort, { once: true });
  }
  return { signal: c.signal, dispose: () => on.forEach((s) => s.removeEventListener('abort', abort)) };
}

// Resolves to p's value, or to undefined once stop aborts first (p is left
// to settle: the broker of a blocked connection answers nothing).
export async function unlessAborted(p, stop) {
  p.catch(() => {});
  return Promise.race([p, lostOrAborted(new Promise(() => {}), stop)]);
}

// Resolves when the channel is lost or stop is aborted, whichever is first,
// leaving no listener on stop.
export async function lostOrAborted(lost, stop) {
  let onAbort;
  const aborted = new Promise((resolve) => {
    onAbort = resolve;
    if (stop.aborted) resolve();
    stop.addEventListener('abort', resolve, { once: true });
  });
  await Promise.race([lost, aborted]);
  stop.removeEventListener('abort', onAbort);
}
