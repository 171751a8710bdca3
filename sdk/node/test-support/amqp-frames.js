// Publishing what amqplib cannot: a message whose header table is over
// amqplib's 64 KiB encoding buffer, as a Go or Java publisher sends it (up
// to the broker's frame_max), the AMQP frames written by hand on a channel
// of conn (without confirms: look for it in the queue). For the tests of
// the header bounds (issue 40). (Outside test/ so that `node --test` does
// not take it for a test file.)
import { until } from './eventually.js';

const shortStr = (s) => Buffer.concat([Buffer.from([Buffer.byteLength(s)]), Buffer.from(s)]);
const u16 = (n) => Buffer.from([n >> 8, n & 0xff]);
const u32 = (n) => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
};

/**
 * Publishes body to queue (the default exchange) with props {messageId,
 * contentType, deliveryMode, headers}: headers' values must be strings.
 * Resolves once the queue holds one message more.
 */
export async function publishFrames(conn, queue, props, body) {
  const ch = await conn.createChannel();
  try {
    const before = (await ch.checkQueue(queue)).messageCount;
    const frame = (type, payload) => Buffer.concat([Buffer.from([type]), u16(ch.ch), u32(payload.length), payload, Buffer.from([0xce])]);
    const { messageId, contentType, deliveryMode, headers = {} } = props;
    const entries = Buffer.concat(Object.entries(headers).map(([k, v]) => {
      if (typeof v !== 'string') throw new TypeError(`publishFrames: header ${k} is not a string`);
      return Buffer.concat([shortStr(k), Buffer.from('S'), u32(Buffer.byteLength(v)), Buffer.from(v)]);
    }));
    // The properties in their order, each flagged: content-type, headers, delivery-mode, message-id.
    let flags = 0x2000;
    const list = [];
    if (contentType !== undefined) {
      flags |= 0x8000;
      list.push(shortStr(contentType));
    }
    list.push(u32(entries.length), entries);
    if (deliveryMode !== undefined) {
      flags |= 0x1000;
      list.push(Buffer.from([deliveryMode]));
    }
    if (messageId !== undefined) {
      flags |= 0x0080;
      list.push(shortStr(messageId));
    }
    const size = Buffer.alloc(8);
    size.writeBigUInt64BE(BigInt(body.length));
    const out = ch.connection.channels[ch.ch].buffer;
    out.write(frame(1, Buffer.concat([u16(60), u16(40), u16(0), shortStr(''), shortStr(queue), Buffer.from([0])]))); // basic.publish
    out.write(frame(2, Buffer.concat([u16(60), u16(0), size, u16(flags), ...list]))); // the content header: class 60, weight 0
    out.write(frame(3, body));
    await until(`the message in ${queue}`, async () => (await ch.checkQueue(queue)).messageCount === before + 1);
  } finally {
    await ch.close().catch(() => {});
  }
}
