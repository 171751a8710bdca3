// The connection of a Broker (connect()), made again when lost, shared by
// its queues: channels, the publishing channel of enqueue, the shared delay
// levels declared once, and the delay mover while a work() runs.
import { anySignal } from './channel.js';
import { move } from './mover.js';
import { declareQueue, declareShared } from './topology.js';

// The connection (one per Broker, made again when lost), the declared
// topologies and the publishing channel; shared by the Broker's queues.
export class Core {
  constructor(amqp, url, socketOptions, onError) {
    this.amqp = amqp;
    this.url = url;
    this.socketOptions = socketOptions;
    this.onError = onError;
    this.conn = null;
    this.connecting = null;
    this.closed = false;
    this.closing = new AbortController(); // ends the workers' reconnection loops
    this.pub = null; // the confirm channel of enqueue, a promise
    this.shared = null; // the shared delay levels, declared once per Broker (a promise)
    this.movers = 0; // work() calls running: the delay mover runs while there is one
    this.mover = null; // {stop, done} of the running mover
  }

  report(err) {
    try {
      this.onError(err);
    } catch {
      // A failing logger must not stop anything.
    }
  }

  // The live connection: one attempt at connecting when there is none.
  connection() {
    if (this.closed) return Promise.reject(new Error('rabbitmq: the broker connection is closed'));
    if (this.conn !== null) return Promise.resolve(this.conn);
    this.connecting ??= (async () => {
      try {
        const conn = await this.amqp.connect(this.url, this.socketOptions);
        conn.on('error', (err) => this.report(err));
        // Under a memory or disk alarm the broker blocks the connection: its
        // confirms wait (never taken as "not published"); said once each way.
        conn.on('blocked', (reason) => this.report(new Error(`rabbitmq connection blocked: ${reason}`)));
        conn.on('unblocked', () => this.report(new Error('rabbitmq connection unblocked')));
        conn.on('close', () => {
          if (this.conn === conn) this.conn = null;
          this.pub = null;
        });
        if (this.closed) {
          await conn.close().catch(() => {});
          throw new Error('rabbitmq: the broker connection is closed');
        }
        this.conn = conn;
        return conn;
      } finally {
        this.connecting = null;
      }
    })();
    return this.connecting;
  }

  // A new channel (in confirm mode when confirm), its errors reported
  // through its 'close' (a channel error closes it).
  async channel(confirm) {
    const conn = await this.connection();
    const ch = confirm ? await conn.createConfirmChannel() : await conn.createChannel();
    ch.on('error', () => {}); // the failing operation rejects with it
    return ch;
  }

  // The confirm channel enqueue publishes on.
  publisher() {
    if (this.pub === null) {
      const p = this.channel(true).then((ch) => {
        ch.on('close', () => {
          if (this.pub === p) this.pub = null;
        });
        return ch;
      });
      p.catch(() => {
        if (this.pub === p) this.pub = null;
      });
      this.pub = p;
    }
    return this.pub;
  }

  // The shared delay levels, declared once per Broker (again after a failure).
  levels() {
    if (this.shared === null) {
      const p = (async () => {
        const ch = await this.channel(false);
        try {
          await declareShared(ch);
        } finally {
          await ch.close().catch(() => {});
        }
      })();
      p.catch(() => {
        if (this.shared === p) this.shared = null;
      });
      this.shared = p;
    }
    return this.shared;
  }

  async declare(name, maxDeliveries) {
    await this.levels();
    const ch = await this.channel(false);
    try {
      await declareQueue(ch, name, maxDeliveries);
    } finally {
      await ch.close().catch(() => {});
    }
  }

  // Runs the delay mover (move()) for this connection while a work() runs:
  // returns what that work() calls when it stops, which stops the mover
  // when no other needs it and resolves once its channel is closed (what
  // it held back in the levels).
  useMover() {
    if (this.movers++ === 0) {
      const stop = new AbortController();
      const { signal, dispose } = anySignal(stop.signal, this.closing.signal);
      this.mover = { stop, done: move(this, signal).catch((err) => this.report(err)).finally(dispose) };
    }
    let released = false;
    return async () => {
      if (released) return;
      released = true;
      if (--this.movers > 0) return;
      const { stop, done } = this.mover;
      this.mover = null;
      stop.abort();
      await done;
    };
  }

  async close() {
    this.closed = true;
    this.closing.abort();
    await this.connecting?.catch(() => {});
    const conn = this.conn;
    this.conn = null;
    if (conn !== null) await conn.close().catch(() => {});
  }
}
