// Which Redis errors mean "not now" rather than "no": the queue worker
// (worker.js) sends an outcome again only for those. Not part of the
// package's exports.

// Whether err says that Redis could not apply a write now but may soon, so
// that the same request is worth sending again: the replies OOM (maxmemory
// reached with noeviction), READONLY (a replica, during a failover),
// LOADING, BUSY (a slow script), MASTERDOWN, MISCONF (writes refused after
// a failed save), TRYAGAIN, CLUSTERDOWN, NOREPLICAS and "ERR max number of
// clients reached"; no reply at all (a connection refused, reset or lost, a
// timeout, ioredis giving up on a command after its retries). Anything else
// is not retried: bad arguments (ERR backstop ...), WRONGTYPE, NOPERM, a
// client closed by its owner (node-redis ClientClosedError).
export function writeRefused(err) {
  const e = err?.cause ?? err;
  if (e === null || typeof e !== 'object') return false;
  const message = typeof e.message === 'string' ? e.message : '';
  const names = classNames(e);
  if (REPLY_ERRORS.some((n) => names.has(n))) {
    return REFUSED_REPLY.test(message) || message.startsWith('ERR max number of clients reached');
  }
  if (names.has('ClientClosedError')) return false;
  if (TRANSPORT_CODES.has(e.code)) return true;
  if (TRANSPORT_ERRORS.some((n) => names.has(n))) return true;
  return /^Connection is closed/.test(message); // ioredis, while it reconnects
}

const REPLY_ERRORS = ['ReplyError', 'ErrorReply'];
const REFUSED_REPLY = /^(OOM|READONLY|LOADING|BUSY|MASTERDOWN|MISCONF|TRYAGAIN|CLUSTERDOWN|NOREPLICAS) /;
const TRANSPORT_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ECONNABORTED', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN', 'ENOTCONN']);
const TRANSPORT_ERRORS = [
  'MaxRetriesPerRequestError', // ioredis
  'ClusterAllFailedError', // ioredis
  'ConnectionTimeoutError', // node-redis
  'SocketTimeoutError',
  'SocketClosedUnexpectedlyError',
  'ClientOfflineError',
  'TimeoutError',
];

// The names of err's classes, its own and its ancestors' (node-redis'
// errors do not set name).
function classNames(err) {
  const names = new Set([err.name]);
  for (let p = Object.getPrototypeOf(err); p && p !== Object.prototype; p = Object.getPrototypeOf(p)) {
    if (p.constructor?.name) names.add(p.constructor.name);
  }
  return names;
}
