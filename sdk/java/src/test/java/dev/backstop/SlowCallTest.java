package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Issue 43: the slow-call rate. Every call succeeds, most of them slower
 * than the policy's slow_call_duration_threshold: the retry loop and the
 * Redis worker measure each call and report it, so the breaker opens on
 * successes alone.
 */
class SlowCallTest {
  static RedisClient client;

  @BeforeAll
  static void start() throws Exception {
    client = RedisClient.create(RedisServer.get().url);
  }

  @AfterAll
  static void stop() {
    client.shutdown();
  }

  @Test
  void slowSuccessesOpenTheBreakerInTheRetryLoop() throws Exception {
    String policy = "{\"circuit_breaker\": {\"type\": \"failure_rate\", \"slow_call_rate_threshold\": 50,"
        + " \"slow_call_duration_threshold\": \"2s\", \"sliding_window\": {\"size\": 20}, \"minimum_calls\": 10,"
        + " \"open_for\": \"30s\"}}";
    try (Policy p = Policy.load(policy)) {
      FakeTicker clock = new FakeTicker(1_767_225_600_000L);
      for (int i = 0; i < 10; i++) {
        long took = i % 5 == 4 ? 100 : 3000; // four slow calls of every five
        assertEquals("ok", Backstop.retrying(p).withTicker(clock).call(() -> {
          clock.advance(took);
          return "ok";
        }));
      }
      AtomicInteger ran = new AtomicInteger();
      RetryException e = assertThrows(RetryException.class,
          () -> Backstop.retrying(p).withTicker(clock).call(ran::incrementAndGet));
      assertEquals(Decision.Reason.CIRCUIT_OPEN, e.reason());
      assertEquals(0, ran.get(), "no call leaves while the breaker is open");
    }
  }

  @Test
  void recordDurationIsValidatedAndIgnoredWithoutASlowCallRate() throws Exception {
    try (Policy p = Policy.load("{\"circuit_breaker\": {\"type\": \"failure_rate\"}}")) {
      assertThrows(InputException.class, () -> p.recordDuration(1, -1));
      for (int i = 0; i < 200; i++) p.recordDuration(Duration.ofHours(1));
      assertEquals(CircuitState.CLOSED, p.circuitState());
    }
  }

  /** record_duration's first answer 1 (no slow-call rate) stops the calls: the instance's clock, one tick a call, stands still. */
  @Test
  void recordDurationStopsCallingAPolicyWithoutASlowCallRate() {
    try (PolicyRuntime rt = PolicyRuntime.builder().maxInstances(1).build();
        Policy p = rt.load("{\"circuit_breaker\": {\"failure_threshold\": 3}}")) {
      p.recordDuration(1, 5);
      long calls = rt.slot(0).wasi.now();
      for (int i = 0; i < 3; i++) p.recordDuration(2 + i, 5);
      assertEquals(calls, rt.slot(0).wasi.now());
      assertThrows(InputException.class, () -> p.recordDuration(9, -1)); // still refused, by the module
      assertEquals(calls + VirtualWasi.CALL_NS, rt.slot(0).wasi.now());
    }
  }

  /** The handler spins at least 3 ms against a 1 ms threshold: a lower bound on the clock, never an upper one. */
  @Test
  void slowSuccessesOpenTheBreakerInTheRedisWorker() throws Exception {
    String policy = "{\"circuit_breaker\": {\"type\": \"failure_rate\", \"slow_call_rate_threshold\": 100,"
        + " \"slow_call_duration_threshold\": \"1ms\", \"sliding_window\": {\"size\": 5}, \"minimum_calls\": 5,"
        + " \"open_for\": \"1h\"}}";
    try (RedisQueue q = RedisQueue.create(client, "jslow"); Policy p = Policy.load(policy)) {
      RedisCasesTest.cmd(q, "DEL", q.keys().jobs(), q.keys().delayed(), q.keys().dlq(), q.keys().stats());
      q.ensureGroup();
      for (int i = 0; i < 6; i++) q.enqueue("report-" + i, new byte[0], null);
      AtomicInteger ran = new AtomicInteger();
      try (RedisWorker w = q.work(p, job -> {
        ran.incrementAndGet();
        for (long start = System.nanoTime(); System.nanoTime() - start < 3_000_000L; ) {
          Thread.onSpinWait();
        }
      }, WorkOptions.defaults().withPrefetch(1))) {
        RabbitCasesTest.until("the sixth job deferred", () -> "1".equals(RedisWorkerTest.stats(q).get("deferred:circuit_open")));
      }
      Map<String, String> st = RedisWorkerTest.stats(q);
      assertEquals("5", st.get("attempts:success"), st.toString());
      assertTrue(ran.get() == 5, "ran " + ran.get());
    }
  }
}
