// The Redis clients the queue is tested with: ioredis 6 and 5, node-redis 6
// (RESP2 and RESP3) and 4, standalone and, where the client has one, cluster.
import IORedis5 from 'ioredis5';
import { Cluster as IOCluster, Redis as IORedis } from 'ioredis';
import { createClient, createCluster } from 'redis';
import { createClient as createClient4, createCluster as createCluster4 } from 'redis4';

async function nodeRedis(client) {
  client.on('error', () => {}); // reconnects are the client's business; failed commands still reject
  await client.connect();
  return client;
}

const closeNodeRedis = (c) => (typeof c.close === 'function' ? c.close() : c.quit());

/** Factories of standalone clients by name: connect({host, port, url}) → client; close(client). */
export const standalone = {
  'ioredis 6': { connect: ({ host, port }) => new IORedis({ host, port }), close: (c) => c.quit() },
  'ioredis 6 RESP3 maps': { connect: ({ host, port }) => new IORedis({ host, port, replyMapping: 'resp3' }), close: (c) => c.quit() },
  'ioredis 6 RESP2': { connect: ({ host, port }) => new IORedis({ host, port, protocol: 2 }), close: (c) => c.quit() },
  'ioredis 5': { connect: ({ host, port }) => new IORedis5({ host, port }), close: (c) => c.quit() },
  'node-redis 6': { connect: ({ url }) => nodeRedis(createClient({ url })), close: closeNodeRedis },
  'node-redis 6 RESP3': { connect: ({ url }) => nodeRedis(createClient({ url, RESP: 3 })), close: closeNodeRedis },
  'node-redis 4': { connect: ({ url }) => nodeRedis(createClient4({ url })), close: closeNodeRedis },
  'node-redis 4 legacyMode': { connect: ({ url }) => nodeRedis(createClient4({ url, legacyMode: true })), close: (c) => c.v4.quit() },
};

/** Factories of cluster clients by name: connect(nodes) → client; close(client). */
export const cluster = {
  'ioredis 6 Cluster': { connect: (nodes) => new IOCluster(nodes), close: (c) => c.quit() },
  'node-redis 6 cluster': {
    connect: (nodes) => nodeRedis(createCluster({ rootNodes: nodes.map((n) => ({ url: `redis://${n.host}:${n.port}` })) })),
    close: closeNodeRedis,
  },
  'node-redis 4 cluster': {
    connect: (nodes) => nodeRedis(createCluster4({ rootNodes: nodes.map((n) => ({ url: `redis://${n.host}:${n.port}` })) })),
    close: closeNodeRedis,
  },
};

/** A raw command client to look at Redis behind the queue's back: ioredis, RESP2 replies. */
export function inspector(target) {
  const c = Array.isArray(target)
    ? new IOCluster(target, { redisOptions: { protocol: 2 } })
    : new IORedis({ host: target.host, port: target.port, protocol: 2 });
  const raw = (...args) => c.call(...args.map(String));
  raw.client = c;
  raw.close = () => c.quit();
  return raw;
}
