// Helpers the RabbitMQ tests share: a worker whose runs and outcomes are
// recorded, and a confirmed publish on a plain amqplib connection (what the
// library itself would not publish).

// Runs q's worker; returns {runs, outcomes, stop()}: runs has each job with the time it ran.
export function work(q, policy, handler, options = {}) {
  const ac = new AbortController();
  const runs = [];
  const outcomes = [];
  const done = q.work(policy, async (job) => {
    runs.push({ job, at: Date.now() });
    return handler(job);
  }, { signal: ac.signal, onError: () => {}, onOutcome: (o, job) => outcomes.push({ ...o, job }), ...options });
  return {
    runs,
    outcomes,
    stop: async () => {
      ac.abort();
      await done;
    },
  };
}

// Publishes body on conn (an amqplib connection) with a confirm.
export async function publishRaw(conn, exchange, key, body, props) {
  const ch = await conn.createConfirmChannel();
  try {
    await new Promise((resolve, reject) =>
      ch.publish(exchange, key, Buffer.from(body), { persistent: true, ...props }, (err) => (err ? reject(err) : resolve())));
  } finally {
    await ch.close();
  }
}
