package dev.backstop;

import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.sync.RedisCommands;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.concurrent.CountDownLatch;

/**
 * A Java worker in the Go crash test's fleet (queue/redisqueue/crash_test.go,
 * TestCrashLosesNothingWithJavaWorkers): the same queue "crash", policy and
 * handler semantics as the Go worker processes there (crashRole), so that Go
 * and Java workers share the jobs and the test's counters, and the test can
 * SIGKILL either. Configured by the same environment: BACKSTOP_CRASH_REDIS
 * (host:port), BACKSTOP_CRASH_STORE ("1": the side effect under the
 * idempotency store, the job id as key, lease 500 ms).
 */
public final class CrashWorker {
  private CrashWorker() {}

  static final String POLICY = "{\"max_attempts\": 6, \"backoff\": {\"base\": \"5ms\", \"cap\": \"50ms\"},"
      + " \"retry_after\": {\"cap\": \"2s\", \"on_exceed\": \"clamp\"}}";

  /** The simulated downstream, as Go's outcome: 5% permanent, 30% transient, 5% 429 with Retry-After. */
  static void outcome(String id, long attempt) throws Exception {
    byte[] sum = MessageDigest.getInstance("SHA-256").digest((id + "/" + attempt).getBytes(StandardCharsets.UTF_8));
    long v = (ByteBuffer.wrap(sum, 0, 4).getInt() & 0xffffffffL) % 100;
    if (v < 5) throw new HttpStatusException(400);
    if (v < 35) throw new HttpStatusException(503);
    if (v < 40) throw new HttpStatusException(429, "1");
  }

  static boolean crashAfter(String id) throws Exception {
    byte[] sum = MessageDigest.getInstance("SHA-256").digest(("crash/" + id).getBytes(StandardCharsets.UTF_8));
    return (ByteBuffer.wrap(sum, 0, 4).getInt() & 0xffffffffL) % 1000 < 5;
  }

  public static void main(String[] args) throws Exception {
    RedisClient client = RedisClient.create("redis://" + System.getenv("BACKSTOP_CRASH_REDIS"));
    StatefulRedisConnection<String, String> conn = client.connect();
    RedisCommands<String, String> rdb = conn.sync();
    boolean withStore = "1".equals(System.getenv("BACKSTOP_CRASH_STORE"));
    IdempotencyStore store = withStore ? IdempotencyStore.create(client,
        IdempotencyStore.Options.defaults().withLease(java.time.Duration.ofMillis(500))) : null;
    Policy policy = Policy.load(POLICY);
    RedisQueue q = RedisQueue.create(client, "crash");
    QueueHandler<RedisJob> handler = job -> {
      String run = job.id() + "/" + job.attempt();
      boolean first;
      if (store == null) {
        first = effect(rdb, job, run);
      } else {
        // Go's Store.Once: the job id is the key and the request.
        IdempotencyStore.Claim c = store.begin("crash", job.id(), job.id());
        switch (c.state()) {
          case COMPLETED:
            first = false; // replayed: the run finished before
            break;
          case IN_PROGRESS:
            rdb.incr("crash:in_progress");
            throw new HttpStatusException(429, "1");
          case CONFLICT:
            throw new IllegalStateException("conflict on " + job.id());
          default:
            try {
              first = effect(rdb, job, run);
            } catch (Exception e) {
              store.fail("crash", job.id(), c.token());
              throw e;
            }
            store.complete("crash", job.id(), c.token(), new IdempotencyStore.Response(200, null, null, false, false));
        }
      }
      // The run's work is done (and recorded): only the queue's ack is left.
      rdb.hset("crash:finished", run, "1");
      if (first && crashAfter(job.id())) {
        rdb.incr("crash:injected");
        Runtime.getRuntime().halt(137); // as a SIGKILL: no hook, no ack
      }
    };
    RedisWorker w = q.work(policy, handler, WorkOptions.defaults().withPrefetch(8));
    rdb.incr("crash:java_started"); // the test enqueues once its Java workers are up
    CountDownLatch stopped = new CountDownLatch(1);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> { // SIGTERM: a graceful stop
      try {
        w.close();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      stopped.countDown();
    }));
    stopped.await();
  }

  /** The job's side effect, counted as Go's effect counts it; true on the attempt's first execution. */
  static boolean effect(RedisCommands<String, String> rdb, RedisJob job, String run) throws Exception {
    if (rdb.hexists("crash:finished", run)) rdb.hincrby("crash:after_finish", run, 1);
    long n = rdb.hincrby("crash:exec", run, 1);
    rdb.hincrby("crash:exec_by", "java", 1);
    Thread.sleep(1); // the job's work: the window a SIGKILL lands in
    outcome(job.id(), job.attempt());
    rdb.sadd("crash:succeeded", job.id());
    return n == 1;
  }
}
