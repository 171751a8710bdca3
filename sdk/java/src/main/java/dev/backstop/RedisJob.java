package dev.backstop;

import java.util.Collections;
import java.util.Map;

/**
 * A job as a Redis Streams worker sees it: one delivery of a stream entry
 * (queue/redisqueue/README.md). {@code attempt} is the 1-based number of this
 * execution (it lives in Redis: it survives crashes); {@code id} the job's
 * stable identity, its idempotency key. {@code malformed} marks an entry
 * without an id, a whole attempt >= 1 or first_enqueued_ms: it is
 * dead-lettered {@code malformed}, not run. An entry with none of backstop's
 * fields (a plain producer's XADD) is the job's first attempt, its id the
 * entry id. {@code dueMs} is when promote moved the entry's delayed member
 * was due (the server's clock; 0 when it was not promoted): the worker
 * measures a retry's latency from it.
 */
public record RedisJob(String entryId, String id, long attempt, long firstEnqueuedMs, byte[] payload, String lastError,
    String lastReason, boolean malformed, long prevDelayMs, Map<String, String> fields, String jobType, long dueMs) {

  public RedisJob {
    fields = Collections.unmodifiableMap(fields);
  }

  @Override
  public String toString() {
    return "RedisJob[entryId=" + entryId + ", id=" + id + ", attempt=" + attempt + ", jobType=" + jobType + "]";
  }
}
