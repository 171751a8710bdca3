// The one thing the Redis queue (queue.js) and the idempotency store
// (idempotency.js) need from the caller's client: send a command (strings
// and Buffers) and get the raw reply, routed by its key on a cluster. Raw
// replies have one shape in every version of both clients; typed methods
// do not.
export function sender(client) {
  if (client !== null && typeof client === 'object') {
    // ioredis Redis and Cluster: call() routes by the command's keys.
    if (typeof client.call === 'function' && typeof client.evalsha === 'function') {
      return (args) => client.call(...args);
    }
    // node-redis v4+: createClient, or createCluster (routed by the first key).
    // A v4 client in legacy mode keeps its promise API under .v4.
    if (client.options?.legacyMode === true && client.v4) client = client.v4;
    if (typeof client.sendCommand === 'function' && typeof client.evalSha === 'function') {
      if (typeof client.getSlotMaster === 'function') return (args, key) => client.sendCommand(key, false, args);
      return (args) => client.sendCommand(args);
    }
  }
  throw new TypeError(
    'Expected `client` to be an ioredis client (Redis, Cluster) or a node-redis v4+ client (createClient, createCluster)',
  );
}
