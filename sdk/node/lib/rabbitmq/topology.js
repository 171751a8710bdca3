// The RabbitMQ topology (README, "Topology"): the delay levels every work
// queue of a virtual host shares, a work queue's own queues and exchanges,
// and the routing key of a delay.
import { show } from '../args.js';
import { H } from './message.js';

export const LEVELS = 18; // the routing key's bits; exchanges (and the first topology's TTL queues) backstop.delay.L0..L17
// backstop.hold.L0..L10: the levels a delay hops, moved by the workers'
// movers, which hold a message 2^10 s at most (under the broker's 30 min
// consumer timeout). A longer delay than 2^11 - 1 s (34 min) arrives early
// and is delayed again for the rest.
export const HOLDS = 11;
const MAX_DELAY_S = 2 ** HOLDS - 1;

export const DELIVER = 'backstop.delay.deliver';
// A delayed message enters at its highest set bit's level, not L17: each
// exchange-to-exchange hop costs the publishing channel a topic match.
export const ENTER = 'backstop.delay.enter';
// Where the movers dead-letter a message (reason unroutable) that has no
// work queue's DLQ to go to: a quorum queue shared by the virtual host.
export const UNROUTABLE = 'backstop.unroutable';

// Where a run (Go's Queue.Run, `backstop queue run`) asks the movers for the
// delayed jobs they hold: a fanout every mover binds a queue of its own to
// (mover.js, answerRun).
export const RUN = 'backstop.run';

/** The name of delay level n (0..17): a topic exchange and the first topology's TTL queue. */
export function levelName(n) {
  return `backstop.delay.L${n}`;
}

/** The queue of delay level n (0..10) the movers hold messages from. */
export function holdName(n) {
  return `backstop.hold.L${n}`;
}

/**
 * The routing key of a delay: its whole seconds (rounded up, at most
 * 2^11 - 1) as 18 words of one bit each, most significant first.
 */
export function delayRoutingKey(delayMs) {
  if (!Number.isFinite(delayMs) || delayMs < 0) {
    throw new TypeError(`Expected \`delayMs\` to be a finite number >= 0 (got ${show(delayMs)})`);
  }
  const s = Math.min(MAX_DELAY_S, Math.ceil(delayMs / 1000));
  const words = [];
  for (let bit = LEVELS - 1; bit >= 0; bit--) words.push(String(Math.floor(s / 2 ** bit) % 2));
  return words.join('.');
}

// The binding pattern of exchange L<n>: word for bit n is v, the others *.
function levelPattern(n, v) {
  const words = Array(LEVELS).fill('*');
  words[LEVELS - 1 - n] = v;
  return words.join('.');
}

// The binding pattern from the enter exchange to L<n>: the bits above n 0, bit n 1.
function enterPattern(n) {
  const words = Array(LEVELS).fill('*');
  for (let bit = LEVELS - 1; bit > n; bit--) words[LEVELS - 1 - bit] = '0';
  words[LEVELS - 1 - n] = '1';
  return words.join('.');
}

// The delay levels every work queue of a virtual host shares: exchange
// L<n> routes a message whose bit n is 1 to queue hold.L<n> (a mover holds
// it 2^n s, then publishes it to exchange L<n-1>), else on to exchange
// L<n-1> at once; L0's next is the deliver exchange, by destination. The
// first topology's TTL queues L<n> are still declared, so that messages
// delayed before an upgrade drain, but no longer bound for n < 11:
// RabbitMQ 3.10 can lose the process that dead-letters them (README, "The
// moves between levels are the workers'").
export async function declareShared(ch) {
  await ch.assertExchange(DELIVER, 'headers', { durable: true });
  for (let n = 0; n < LEVELS; n++) {
    await ch.assertExchange(levelName(n), 'topic', { durable: true });
    await ch.assertQueue(levelName(n), {
      durable: true,
      arguments: {
        'x-queue-type': 'quorum',
        'x-message-ttl': 2 ** n * 1000,
        'x-dead-letter-exchange': n === 0 ? DELIVER : levelName(n - 1),
        'x-dead-letter-strategy': 'at-least-once',
        'x-overflow': 'reject-publish',
      },
    });
  }
  for (let n = 0; n < HOLDS; n++) await ch.assertQueue(holdName(n), { durable: true, arguments: { 'x-queue-type': 'quorum' } });
  await ch.assertQueue(UNROUTABLE, { durable: true, arguments: { 'x-queue-type': 'quorum' } });
  for (let n = 0; n < LEVELS; n++) {
    if (n < HOLDS) {
      // Bit n set: to the hold queue, which the movers empty; the TTL queue
      // is unbound only after, so a message routed meanwhile goes to both
      // (a duplicate), never to neither.
      await ch.bindQueue(holdName(n), levelName(n), levelPattern(n, '1'));
      await ch.unbindQueue(levelName(n), levelName(n), levelPattern(n, '1'));
    } else {
      await ch.bindQueue(levelName(n), levelName(n), levelPattern(n, '1')); // no delay routes here since the cap
    }
    await ch.bindExchange(n === 0 ? DELIVER : levelName(n - 1), levelName(n), levelPattern(n, '0'));
  }
  await ch.assertExchange(ENTER, 'topic', { durable: true });
  for (let n = 0; n < LEVELS; n++) await ch.bindExchange(levelName(n), ENTER, enterPattern(n));
  await ch.bindExchange(DELIVER, ENTER, delayRoutingKey(0)); // no bit set: straight to the queue
  await ch.assertExchange(RUN, 'fanout', { durable: true });
}

export async function declareQueue(ch, name, maxDeliveries) {
  await ch.assertQueue(name, {
    durable: true,
    arguments: {
      'x-queue-type': 'quorum',
      'x-delivery-limit': maxDeliveries + 2,
      'x-dead-letter-exchange': '',
      'x-dead-letter-routing-key': `${name}.dlq`,
      'x-dead-letter-strategy': 'at-least-once',
      'x-overflow': 'reject-publish',
    },
  });
  await ch.assertQueue(`${name}.dlq`, { durable: true, arguments: { 'x-queue-type': 'quorum' } });
  await ch.assertExchange(`${name}.delay`, 'fanout', { durable: true });
  await ch.bindExchange(ENTER, `${name}.delay`, '');
  await ch.unbindExchange(levelName(LEVELS - 1), `${name}.delay`, ''); // the first topology's binding
  await ch.assertExchange(`${name}.due`, 'fanout', { durable: true });
  await ch.bindQueue(name, `${name}.due`, '');
  await ch.bindExchange(`${name}.due`, DELIVER, '', { 'x-match': 'all', [H.destination]: name });
}
