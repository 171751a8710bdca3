// What every part of the RabbitMQ queue does on an amqplib channel:
// publish with a confirm, return what it holds, wait for it to be lost, and
// the backoff between attempts at a lost connection.
import { fitHeaders } from './message.js';

// The backoff between attempts at a lost connection or channel, doubling.
export const BACKOFF_MIN_MS = 100;
export const BACKOFF_MAX_MS = 5000;

// Returns every unacked message of ch to its queue (a lost channel does it anyway).
export function returnAll(ch) {
  try {
    ch.nackAll(true);
  } catch {
    // The channel is gone: the broker returned them.
  }
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
