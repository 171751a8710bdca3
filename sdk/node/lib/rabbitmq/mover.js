// The delay mover: the moves between the delay levels (README, "The moves
// between levels are the workers', not the broker's"), one per connection
// while a work() runs (core.js, useMover).
import { jitter, pause } from '../outcome.js';
import { amqpCode, BACKOFF_MAX_MS, BACKOFF_MIN_MS, lostOrAborted, publish, Rejected, unlessAborted, within } from './channel.js';
import { digits, H, moveHeaders, props, text } from './message.js';
import { DELIVER, delayRoutingKey, ENTER, HOLDS, holdName, LEVELS, levelName, RUN, UNROUTABLE } from './topology.js';

// A mover's deliveries in hand per level; how long a move the broker
// refused re-enters the delay (or, that refused too, is held before it is
// tried again); and the refusals after which it is dead-lettered.
const MOVE_PREFETCH = 1000;
const MOVE_RETRY_MS = 10_000;
const MAX_MOVE_REFUSALS = 30;

// The moves between delay levels (README, "The moves between levels are the
// workers', not the broker's"): on a confirm channel of its own, the mover
// consumes hold.L0..L10, holds each delivery until its time (releaseAt),
// publishes it unchanged to the next exchange (mandatory; side by side,
// but one at a time per job id and route: moveSession's routed), and acks
// it once confirmed. A move the broker returns (no route: its work queue is gone)
// is dead-lettered at once (reason unroutable); one it refuses (a full work
// queue) re-enters the delay for 10 s, and is dead-lettered at its 30th
// refusal; neither stays in the mover's hands, where it would hold up the
// level's other moves. Only a move whose re-entry is refused too is held
// and tried again after 10 s. A lost channel returns what it held to the
// levels, and the mover consumes again (with backoff, as work()) until
// stop aborts.
export async function move(core, stop) {
  for (let backoff = BACKOFF_MIN_MS; !stop.aborted; backoff = Math.min(2 * backoff, BACKOFF_MAX_MS)) {
    let ch;
    try {
      // Not past stop: a blocked connection answers nothing.
      const made = core.levels().then(() => core.channel(true));
      ch = await unlessAborted(made, stop);
      if (ch === undefined) {
        made.then((c) => c.close()).catch(() => {});
        return;
      }
    } catch {
      // work() reports the connection's failures; both make it again.
      await core.connection().catch(() => {});
      await pause(jitter(backoff), stop);
      continue;
    }
    if (await moveSession(core, ch, stop)) backoff = BACKOFF_MIN_MS;
    if (!stop.aborted) await pause(jitter(backoff), stop);
  }
}

// One channel's moves until it is lost or stop aborts; true when it consumed.
async function moveSession(core, ch, stop) {
  let gone = false; // the channel closed: what it held is back in the levels
  let ending = false;
  const lost = new Promise((resolve) => ch.once('close', () => {
    gone = true;
    resolve();
  }));
  const timers = new Set();
  const heldBy = new Map(); // timer → {n, msg}: what a run may take
  const moving = new Set(); // moves awaiting their confirm
  // The mandatory publish in flight per exchange, routing key and job id
  // (idOf), marked when the broker returns it: a return names no publish,
  // but comes before its confirm, and publishes of one idOf go one at a
  // time (routed), so a return is that one's. (Matched to any of several
  // side by side, one job id delayed on two queues, one of them deleted,
  // took the other's return: the routable move dead-lettered, the returned
  // one acked as moved, lost.)
  const unconfirmed = new Map();
  const idOf = (exchange, key, p) => `${exchange}\u0000${key}\u0000${p.messageId ?? ''}`;
  ch.on('return', (msg) => {
    const m = unconfirmed.get(idOf(msg.fields.exchange, msg.fields.routingKey, msg.properties));
    if (m) m.returned = true;
  });
  const hold = (n, msg, at) => {
    if (gone || ending) return; // still unacked: back to its level with the channel
    const t = setTimeout(() => {
      timers.delete(t);
      heldBy.delete(t);
      const p = moveOne(n, msg).finally(() => moving.delete(p));
      moving.add(p);
    }, Math.max(0, at - Date.now()));
    t.unref?.();
    timers.add(t);
    heldBy.set(t, { n, msg });
  };
  // Publishes (mandatory, confirmed) and resolves to whether it was
  // routed; once no other publish of its idOf is in flight.
  const routed = async (exchange, key, content, p) => {
    const id = idOf(exchange, key, p);
    while (unconfirmed.has(id)) await unconfirmed.get(id).done;
    let settle;
    const m = { returned: false, done: new Promise((resolve) => { settle = resolve; }) };
    unconfirmed.set(id, m);
    try {
      await publish(ch, exchange, key, content, { ...p, mandatory: true });
      return !m.returned;
    } finally {
      unconfirmed.delete(id);
      settle();
    }
  };
  // Dead-letters msg (reason unroutable, error): to Q.dlq, Q its
  // destination, else (no destination, or Q.dlq is gone too) to the
  // shared backstop.unroutable.
  const deadLetter = async (msg, base, error) => {
    const dest = text(msg.properties?.headers?.[H.destination]);
    const headers = { ...moveHeaders(msg.properties?.headers), [H.reason]: 'unroutable', [H.error]: error, [H.deadLettered]: String(Date.now()) };
    delete headers[H.moveRefusals];
    if (dest !== '' && (await routed('', `${dest}.dlq`, msg.content, { ...base, headers }))) return;
    if (!(await routed('', UNROUTABLE, msg.content, { ...base, headers }))) throw new Error(`no route to queue ${JSON.stringify(UNROUTABLE)}`);
  };
  // A refused move: re-enters the delay for MOVE_RETRY_MS, or the rest of
  // its own due time if later (its refusals counted in
  // backstop-move-refusals); dead-lettered at the last.
  const reenter = async (msg, base, refused) => {
    const h = msg.properties?.headers ?? {};
    const refusals = (digits(h[H.moveRefusals]) ?? 0) + 1;
    if (refusals >= MAX_MOVE_REFUSALS) {
      await deadLetter(msg, base, `the broker refused the delayed message's move ${refusals} times (a full queue or delay level): ${refused?.message ?? refused}`);
      return;
    }
    const now = Date.now();
    const due = Math.max(digits(h[H.due]) ?? 0, now + MOVE_RETRY_MS);
    const headers = { ...h, [H.due]: String(due), [H.moveRefusals]: String(refusals) };
    if (!(await routed(ENTER, delayRoutingKey(due - now), msg.content, { ...base, headers }))) throw new Error(`no route from ${ENTER}`);
  };
  const moveOne = async (n, msg) => {
    const exchange = n === 0 ? DELIVER : levelName(n - 1);
    const key = msg.fields.routingKey;
    const p = msg.properties ?? {};
    const base = props(msg);
    try {
      // Unchanged, but for x-delivery-count (publish drops it): the hold
      // queue's own count of redeliveries, which the work queue's worker would take for its own.
      let stage = 'move';
      try {
        if (!(await routed(exchange, key, msg.content, { ...base, headers: p.headers ?? {} }))) {
          stage = 'dead letter';
          const dest = text(p.headers?.[H.destination]);
          core.report(new Error(`rabbitmq delay mover: job ${JSON.stringify(text(p.messageId))} has no route to queue ${JSON.stringify(dest)}; dead-lettered (unroutable)`));
          await deadLetter(msg, base, dest === ''
            ? 'no route for a delayed message without backstop-destination'
            : `no route to queue ${JSON.stringify(dest)}: it was deleted or never declared`);
        }
      } catch (err) {
        if (!(err instanceof Rejected) || stage !== 'move') throw err;
        core.report(new Error(`rabbitmq delay mover: the move of job ${JSON.stringify(text(p.messageId))} to queue ${JSON.stringify(text(p.headers?.[H.destination]))} was refused; delayed again: ${err.message}`, { cause: err }));
        await reenter(msg, base, err);
      }
      ch.ack(msg);
    } catch (err) {
      if (gone) return;
      core.report(new Error(`rabbitmq delay mover: the move of job ${JSON.stringify(text(p.messageId))} from ${holdName(n)} failed; trying again in 10 s: ${err?.message ?? err}`, { cause: err }));
      hold(n, msg, Date.now() + MOVE_RETRY_MS);
    }
  };
  // A run of a held delayed job (Go's Queue.Run, README "Run a delayed job
  // now"): published to its work queue, its attempt kept and its due time
  // dropped (mandatory, confirmed), then acked; one the broker does not
  // take goes on down the levels, due now. Resolves to whether it moved.
  const runOne = async (n, msg) => {
    const p = msg.properties ?? {};
    const headers = moveHeaders(p.headers);
    delete headers[H.due];
    delete headers[H.moveRefusals];
    try {
      if (await routed('', text(p.headers?.[H.destination]), msg.content, { ...props(msg), headers })) {
        ch.ack(msg);
        return true;
      }
    } catch (err) {
      if (gone) return false;
      core.report(new Error(`rabbitmq delay mover: the run of job ${JSON.stringify(text(p.messageId))} failed; it goes on delayed: ${err?.message ?? err}`, { cause: err }));
    }
    hold(n, msg, Date.now());
    return false;
  };
  // A run's command: count the held deliveries it selects (queue, and job
  // id or due time bound), or take at most its limit of them, earliest due
  // first; answered to its reply-to with the counts.
  const answerRun = async (cmd) => {
    const h = cmd.properties?.headers ?? {};
    const dest = text(h['backstop-run-queue']);
    const id = text(h['backstop-run-id']);
    const before = digits(h['backstop-run-due-before-ms']);
    const limit = text(h['backstop-run-op']) === 'take' ? (digits(h['backstop-run-limit']) ?? 0) : 0;
    const dueOf = (msg) => digits(msg.properties?.headers?.[H.due]) ?? 0;
    const selected = [...heldBy].filter(([, { msg }]) => {
      const mh = msg.properties?.headers ?? {};
      return text(mh[H.destination]) === dest && (id !== '' ? text(msg.properties?.messageId) === id : before !== null && dueOf(msg) <= before);
    });
    selected.sort((a, b) => dueOf(a[1].msg) - dueOf(b[1].msg));
    let moved = 0;
    for (const [t, { n, msg }] of selected.slice(0, limit)) {
      if (!heldBy.has(t)) continue; // its time came meanwhile: the move has it
      clearTimeout(t);
      timers.delete(t);
      heldBy.delete(t);
      const p = runOne(n, msg).finally(() => moving.delete(p));
      moving.add(p);
      if (await p) moved++;
    }
    if (!cmd.properties?.replyTo || gone) return;
    ch.publish('', cmd.properties.replyTo, Buffer.alloc(0), {
      correlationId: cmd.properties.correlationId,
      headers: { 'backstop-run-matched': String(selected.length), 'backstop-run-moved': String(moved), 'backstop-run-mover': runQueue },
    });
  };
  let runQueue = '';
  let consumed = false;
  const consume = async () => {
    await ch.prefetch(MOVE_PREFETCH, false); // per consumer: per level
    for (let n = 0; n < HOLDS && !stop.aborted && !gone; n++) {
      await ch.consume(holdName(n), (msg) => {
        if (msg === null) {
          // Cancelled by the broker (the queue was deleted): declare the
          // levels again and consume on a new channel.
          core.shared = null;
          ch.close().catch(() => {});
          return;
        }
        hold(n, msg, releaseAt(n, msg, Date.now()));
      }, { noAck: false });
    }
    // Run's commands: a queue of this channel's own on the run exchange.
    await ch.assertExchange(RUN, 'fanout', { durable: true });
    runQueue = (await ch.assertQueue('', { exclusive: true, autoDelete: true, durable: false })).queue;
    await ch.bindQueue(runQueue, RUN, '');
    await ch.consume(runQueue, (cmd) => {
      if (cmd === null) return;
      answerRun(cmd).catch((err) => core.report(new Error(`rabbitmq delay mover: run command: ${err?.message ?? err}`, { cause: err })));
    }, { noAck: true });
    consumed = true;
  };
  try {
    // The consumers made, unless stopped first (a blocked connection answers nothing).
    await unlessAborted(Promise.race([consume(), lost]), stop);
    await lostOrAborted(lost, stop);
  } catch (err) {
    if (!gone) core.report(new Error(`rabbitmq delay mover: consume: ${err?.message ?? err}`, { cause: err }));
    if (amqpCode(err, 404)) core.shared = null; // a hold queue deleted: declared again
  }
  ending = true;
  for (const t of timers) clearTimeout(t);
  heldBy.clear();
  // The moves under way finish (confirmed and acked, or not) before the
  // channel closes, for 10 s at most: fewer duplicates. Still pending (a
  // blocked connection, whose broker reads nothing), the close is not waited for.
  let timer;
  await Promise.race([Promise.all([...moving]), new Promise((resolve) => {
    timer = setTimeout(resolve, MOVE_RETRY_MS);
  })]);
  clearTimeout(timer);
  if (!gone) await within(ch.close(), moving.size === 0 ? MOVE_RETRY_MS : 0);
  return consumed;
}

// When a delivery of hold.L<n> received at now (unix ms) leaves its level:
// 2^n s later, or earlier when its due time says it entered the level
// before (it waited there for a mover): due less the delay still to go
// below n, the routing key's lower bits. A routing key that is not the 18
// words of bits, or no valid backstop-due-ms: by the receipt alone.
function releaseAt(n, msg, now) {
  const at = now + 2 ** n * 1000;
  const due = digits(msg.properties?.headers?.[H.due]);
  const words = text(msg.fields?.routingKey).split('.');
  if (due === null || due <= 0 || words.length !== LEVELS) return at;
  let low = 0;
  for (let bit = 0; bit < n; bit++) {
    const w = words[LEVELS - 1 - bit];
    if (w === '1') low += 2 ** bit;
    else if (w !== '0') return at;
  }
  return Math.min(at, due - low * 1000);
}
