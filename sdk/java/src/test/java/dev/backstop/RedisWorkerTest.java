package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The Java Redis Streams worker against a real redis-server: a failed job
 * retried through the delayed set (promoted by the worker) succeeds, the
 * stats hash counts it, the hook is told; a handler past its deadline fails
 * as a timeout; a job type runs with its own policy; an outcome Redis
 * refuses (out of memory) is kept and applied once it takes writes again.
 */
class RedisWorkerTest {
  static RedisClient client;
  static final String FAST = "{\"max_attempts\": 3, \"backoff\": {\"strategy\": \"constant\", \"base\": \"1s\"},"
      + " \"jitter\": {\"mode\": \"none\"}}";

  @BeforeAll
  static void start() throws Exception {
    client = RedisClient.create(RedisServer.get().url);
  }

  @AfterAll
  static void stop() {
    client.shutdown();
  }

  record Told(String action, String reason, long attempt, String failureClass, long delayMs) {}

  static Map<String, String> stats(RedisQueue q) {
    Map<String, String> out = new java.util.TreeMap<>();
    List<?> h = (List<?>) RedisCasesTest.cmd(q, "HGETALL", q.keys().stats());
    for (int i = 0; i + 1 < h.size(); i += 2) out.put(RedisCasesTest.text(h.get(i)), RedisCasesTest.text(h.get(i + 1)));
    return out;
  }

  /**
   * Puts Redis in the state of a full server (as queue/redisqueue's
   * outOfMemory): a 4 MB filler, then maxmemory below the memory in use with
   * noeviction, so every denyoom write (the scripts' HINCRBY, XADD...) is
   * refused. It returns what lifts the limit.
   */
  static Runnable outOfMemory() {
    io.lettuce.core.api.StatefulRedisConnection<String, String> c = client.connect();
    io.lettuce.core.api.sync.RedisCommands<String, String> r = c.sync();
    r.set("filler", "x".repeat(4 << 20));
    long used = 0;
    for (String line : r.info("memory").split("\r\n")) {
      if (line.startsWith("used_memory:")) used = Long.parseLong(line.substring("used_memory:".length()));
    }
    assertTrue(used > 0, "no used_memory in INFO memory");
    r.configSet("maxmemory-policy", "noeviction");
    r.configSet("maxmemory", Long.toString(used / 2));
    try {
      r.set("probe", "x");
      throw new AssertionError("SET under maxmemory succeeded, want OOM");
    } catch (io.lettuce.core.RedisCommandExecutionException e) {
      assertTrue(e.getMessage().startsWith("OOM"), e.getMessage());
    }
    return () -> {
      r.configSet("maxmemory", "0");
      r.del("filler");
      c.close();
    };
  }

  /**
   * An outcome Redis refuses (out of memory) is kept, the entry held, and
   * sent again until Redis takes it: the handler ran once, the ack landed
   * after the fault cleared. Before, the outcome was dropped and the entry
   * reclaimed after 60 s, its handler run a second time.
   */
  @Test
  void anOutcomeRedisRefusesIsKeptAndAppliedOnceRedisTakesWrites() throws Exception {
    try (RedisQueue q = RedisQueue.create(client, "joom"); Policy p = Policy.load(FAST)) {
      RedisCasesTest.cmd(q, "DEL", q.keys().jobs(), q.keys().delayed(), q.keys().dlq(), q.keys().stats());
      q.ensureGroup();
      q.enqueue("oom-1", new byte[0], "charge");
      java.util.concurrent.atomic.AtomicInteger ran = new java.util.concurrent.atomic.AtomicInteger();
      CountDownLatch entered = new CountDownLatch(1);
      CountDownLatch gate = new CountDownLatch(1);
      CountDownLatch refused = new CountDownLatch(1);
      CountDownLatch acked = new CountDownLatch(1);
      List<String> errors = Collections.synchronizedList(new ArrayList<>());
      try (RedisWorker w = q.work(p, job -> {
        ran.incrementAndGet();
        entered.countDown();
        gate.await();
      }, WorkOptions.defaults().<RedisJob>withOnError((e, j) -> {
        errors.add(String.valueOf(e.getMessage()));
        refused.countDown();
      }).<RedisJob>withOnOutcome(out -> {
        if (out.action().equals("ack")) acked.countDown();
      }))) {
        try {
          assertTrue(entered.await(30, TimeUnit.SECONDS), "the job ran");
          Runnable lift = outOfMemory();
          try {
            gate.countDown();
            assertTrue(refused.await(30, TimeUnit.SECONDS), "the worker reported the refused outcome");
            assertEquals(1, acked.getCount(), "acked under maxmemory");
          } finally {
            lift.run();
          }
          // Without a kept outcome, the entry waits 60 s for reclaim, and runs again.
          assertTrue(acked.await(30, TimeUnit.SECONDS), "the kept outcome applied: " + errors);
          assertTrue(errors.get(0).contains("refused, retrying"), errors.toString());
        } finally {
          gate.countDown(); // close waits for the handler
        }
      }
      assertEquals(1, ran.get());
      assertEquals("1", stats(q).get("attempts:success"), stats(q).toString());
      assertEquals(0L, RedisCasesTest.list(RedisCasesTest.cmd(q, "XPENDING", q.keys().jobs(), q.group)).get(0));
    }
  }

  /**
   * Redis refuses XGROUP CREATE when out of memory even for a group that
   * exists (as queue/redisqueue's TestWorkStartsWhileOutOfMemory): a worker
   * started then must still start and run its jobs, and its outcome lands
   * once Redis takes writes again.
   */
  @Test
  void aWorkerStartsWhileRedisIsOutOfMemory() throws Exception {
    try (RedisQueue q = RedisQueue.create(client, "joomstart"); Policy p = Policy.load(FAST)) {
      RedisCasesTest.cmd(q, "DEL", q.keys().jobs(), q.keys().delayed(), q.keys().dlq(), q.keys().stats());
      q.ensureGroup();
      q.enqueue("j", new byte[0], null);
      java.util.concurrent.atomic.AtomicInteger ran = new java.util.concurrent.atomic.AtomicInteger();
      CountDownLatch acked = new CountDownLatch(1);
      Runnable lift = outOfMemory();
      boolean lifted = false;
      try (RedisWorker w = q.work(p, job -> ran.incrementAndGet(), WorkOptions.defaults().<RedisJob>withOnOutcome(out -> {
        if (out.action().equals("ack")) acked.countDown();
      }).<RedisJob>withOnError((e, j) -> {}))) {
        try {
          RabbitCasesTest.until("the job to run under maxmemory", () -> ran.get() == 1);
        } finally {
          lift.run();
          lifted = true;
        }
        assertTrue(acked.await(30, TimeUnit.SECONDS), "the job acked once Redis takes writes");
      } finally {
        if (!lifted) lift.run();
      }
      assertEquals(1, ran.get());
      assertEquals("1", stats(q).get("attempts:success"), stats(q).toString());
    }
  }

  @Test
  void aFailedJobIsRetriedThroughTheDelayedSetAndSucceeds() throws Exception {
    try (RedisQueue q = RedisQueue.create(client, "jretry"); Policy p = Policy.load(FAST)) {
      RedisCasesTest.cmd(q, "DEL", q.keys().jobs(), q.keys().delayed(), q.keys().dlq(), q.keys().stats());
      q.ensureGroup();
      q.enqueue("order-1", "{}".getBytes(StandardCharsets.UTF_8), "send_email");
      List<Told> told = Collections.synchronizedList(new ArrayList<>());
      CountDownLatch done = new CountDownLatch(1);
      try (RedisWorker w = q.work(p, job -> {
        if (job.attempt() == 1) throw new HttpStatusException(503);
        assertEquals("transient", job.lastReason());
      }, WorkOptions.defaults().<RedisJob>withOnOutcome(out -> {
        told.add(new Told(out.action(), out.reason(), out.job().attempt(), out.failureClass(), out.delayMs()));
        if (out.action().equals("ack")) done.countDown();
      }))) {
        assertTrue(done.await(30, TimeUnit.SECONDS), "the retry came back: " + told);
      }
      assertEquals(List.of(new Told("retry", "transient", 1, "retryable", 1000), new Told("ack", "success", 2, "", 0)), told);
      Map<String, String> st = stats(q);
      assertEquals("1", st.get("attempts:retry"), st.toString());
      assertEquals("1", st.get("attempts:success"), st.toString());
    }
  }

  @Test
  void aHandlerPastItsDeadlineFailsAsATimeoutAndAJobTypeHasItsOwnPolicy() throws Exception {
    try (RedisQueue q = RedisQueue.create(client, "jdeadline"); Policy p = Policy.load(FAST);
        Policy once = Policy.load("{\"max_attempts\": 1}")) {
      RedisCasesTest.cmd(q, "DEL", q.keys().jobs(), q.keys().delayed(), q.keys().dlq(), q.keys().stats());
      q.ensureGroup();
      q.enqueue("slow", new byte[0], "charge");
      CountDownLatch done = new CountDownLatch(1);
      List<QueueOutcome<RedisJob>> told = Collections.synchronizedList(new ArrayList<>());
      try (RedisWorker w = q.work(p, job -> Thread.sleep(10_000), WorkOptions.defaults()
          .withHandlerTimeout(Duration.ofMillis(100)).withPolicies(Map.of("charge", once))
          .<RedisJob>withOnOutcome(out -> {
            told.add(out);
            done.countDown();
          }))) {
        assertTrue(done.await(30, TimeUnit.SECONDS));
      }
      assertEquals("dead_letter", told.get(0).action());
      assertEquals("max_attempts_reached", told.get(0).reason(), "the type's policy: 1 attempt");
      assertEquals("retryable", told.get(0).failureClass());
      assertEquals("handler deadline exceeded after 100 ms", told.get(0).error());
      List<?> dlq = (List<?>) RedisCasesTest.cmd(q, "XRANGE", q.keys().dlq(), "-", "+");
      String fields = dlq.toString();
      assertEquals(1, dlq.size());
      List<?> f = (List<?>) ((List<?>) dlq.get(0)).get(1);
      List<String> texts = new ArrayList<>();
      for (Object x : f) texts.add(RedisCasesTest.text(x));
      assertTrue(texts.contains("handler deadline exceeded after 100 ms"), texts + " " + fields);
    }
  }

  // As Python's test_queue_metrics.py and Go's queue/metrics_test.go: a
  // worker's backstop_client_* families, target = the queue: a success, a
  // failure that opens the breaker (deferred: a retry, reason circuit_open),
  // and a job the open breaker refuses before it runs.
  @Test
  void theWorkerCountsUnderTargetTheQueue() throws Exception {
    String policy = "{\"max_attempts\": 3, \"backoff\": {\"base\": \"10ms\", \"cap\": \"20ms\"}, \"jitter\": {\"mode\": \"none\"},"
        + " \"circuit_breaker\": {\"failure_threshold\": 1, \"open_for\": \"1h\"}}";
    try (RedisQueue q = RedisQueue.create(client, "orders"); Policy p = Policy.load(policy)) {
      RedisCasesTest.cmd(q, "DEL", q.keys().jobs(), q.keys().delayed(), q.keys().dlq(), q.keys().stats());
      q.ensureGroup();
      for (String id : List.of("job-ok", "job-fails", "job-refused")) q.enqueue(id, new byte[0], null);
      io.prometheus.metrics.model.registry.PrometheusRegistry reg = new io.prometheus.metrics.model.registry.PrometheusRegistry();
      String want = "backstop_client_calls_refused_total{policy=\"payments\",reason=\"circuit_open\",target=\"orders\"} 1";
      // One read takes all three: the worker reads no more once the breaker opens.
      try (RedisWorker w = q.work(p, job -> {
        if (!job.id().equals("job-ok")) throw new java.net.SocketException("503");
      }, WorkOptions.defaults().withPrefetch(3).withMetrics(reg, "payments"))) {
        RabbitCasesTest.until("a job refused", () -> {
          try {
            return MetricsTest.scrape(reg).contains(want);
          } catch (Exception e) {
            throw new AssertionError(e);
          }
        });
      }
      String text = MetricsTest.scrape(reg);
      for (String line : List.of(
          "backstop_client_attempts_total{outcome=\"success\",policy=\"payments\",target=\"orders\"} 1",
          "backstop_client_attempts_total{outcome=\"retry\",policy=\"payments\",target=\"orders\"} 1",
          "backstop_client_attempts_total{outcome=\"refused\",policy=\"payments\",target=\"orders\"} 1",
          "backstop_client_retries_total{policy=\"payments\",reason=\"circuit_open\",target=\"orders\"} 1",
          "backstop_client_circuit_state{policy=\"payments\",state=\"open\",target=\"orders\"} 1",
          "backstop_client_circuit_transitions_total{from=\"closed\",policy=\"payments\",target=\"orders\",to=\"open\"} 1")) {
        assertTrue(text.contains(line), line + " in\n" + text);
      }
      assertTrue(!text.contains("outcome=\"dead_letter\""), text);
    }
  }

  /**
   * withReclaim (as Go's redisqueue.WithReclaim): an entry a crashed consumer
   * was given and never settled is claimed after the min idle time and run;
   * one delivered maxDeliveries times without an outcome is dead-lettered
   * crash_loop without running. Before, the worker's 60 s and 5 were fixed.
   */
  @Test
  void withReclaimRunsACrashedConsumersJobAndDeadLettersACrashLoop() throws Exception {
    try (RedisQueue q = RedisQueue.create(client, "jreclaim"); Policy p = Policy.load(FAST)) {
      RedisCasesTest.cmd(q, "DEL", q.keys().jobs(), q.keys().delayed(), q.keys().dlq(), q.keys().stats());
      q.ensureGroup();
      q.enqueue("crashed-1", new byte[0], "charge");
      try (var c = q.client.connect(io.lettuce.core.codec.ByteArrayCodec.INSTANCE)) {
        assertEquals(1, q.read(c.sync(), "crashed-consumer", 10, 100).size()); // delivered, never settled
      }
      List<String> ran = Collections.synchronizedList(new ArrayList<>());
      CountDownLatch acked = new CountDownLatch(1);
      WorkOptions o = WorkOptions.defaults().withReclaim(Duration.ofMillis(100), Duration.ofMillis(300), 5)
          .<RedisJob>withOnOutcome(out -> {
            if (out.action().equals("ack")) acked.countDown();
          });
      try (RedisWorker w = q.work(p, job -> ran.add(job.id()), o)) {
        assertTrue(acked.await(30, TimeUnit.SECONDS), "the crashed consumer's job was reclaimed and run");
      }
      assertEquals(List.of("crashed-1"), ran);

      q.enqueue("looping-1", new byte[0], "charge");
      try (var c = q.client.connect(io.lettuce.core.codec.ByteArrayCodec.INSTANCE)) {
        assertEquals(1, q.read(c.sync(), "crashed-consumer", 10, 100).size());
      }
      try (RedisWorker w = q.work(p, job -> ran.add(job.id()),
          WorkOptions.defaults().withReclaim(Duration.ofMillis(100), Duration.ofMillis(300), 1))) {
        RabbitCasesTest.until("the crash loop dead-lettered", () -> "1".equals(stats(q).get("dead_letters:crash_loop")));
      }
      assertEquals("1", stats(q).get("dead_letters:crash_loop"), stats(q).toString());
      assertEquals(List.of("crashed-1"), ran, "a crash loop is dead-lettered without running");
      assertEquals(1L, RedisCasesTest.list(RedisCasesTest.cmd(q, "XLEN", q.keys().dlq())).get(0));
    }
  }

  @Test
  void withReclaimChecksItsArguments() {
    WorkOptions d = WorkOptions.defaults();
    assertThrows(IllegalArgumentException.class, () -> d.withReclaim(Duration.ZERO, Duration.ofSeconds(1), 5));
    assertThrows(IllegalArgumentException.class, () -> d.withReclaim(Duration.ofSeconds(1), Duration.ZERO, 5));
    assertThrows(IllegalArgumentException.class, () -> d.withReclaim(Duration.ofSeconds(1), Duration.ofSeconds(1), 0));
  }
}
