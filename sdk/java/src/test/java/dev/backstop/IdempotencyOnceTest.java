package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.sync.RedisCommands;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * IdempotencyStore.once, the worker's side, over a real redis-server: the
 * checks Go's idemcases.Once runs on every backend (one effect and its
 * result twice, another request a conflict, a failure released, a duplicate
 * while the first runs in progress), and what Go's settle tests check of
 * Once (a result too large, a complete Redis refuses stored once it takes
 * writes again).
 */
class IdempotencyOnceTest {
  static RedisClient client;
  static StatefulRedisConnection<String, String> raw;
  static RedisCommands<String, String> r;

  PrometheusRegistry reg;
  IdempotencyStore store;
  final AtomicInteger effects = new AtomicInteger();

  @BeforeAll
  static void redis() throws Exception {
    client = RedisClient.create(RedisServer.get().url);
    raw = client.connect();
    r = raw.sync();
  }

  @AfterAll
  static void close() {
    raw.close();
    client.shutdown();
  }

  @BeforeEach
  void start() {
    start(IdempotencyStore.Options.defaults());
  }

  void start(IdempotencyStore.Options options) {
    if (store != null) store.close();
    reg = new PrometheusRegistry();
    store = IdempotencyStore.create(client, options.withPrefix("idem-once").withMetrics(reg));
  }

  @AfterEach
  void stop() {
    store.close();
    for (String k : r.keys("idem-once:*")) r.del(k);
  }

  byte[] charge() {
    effects.incrementAndGet();
    return "charged".getBytes(StandardCharsets.UTF_8);
  }

  String once(String key, String request) throws Exception {
    return new String(store.once("jobs", key, request, this::charge), StandardCharsets.UTF_8);
  }

  @Test
  void aRedeliveredJobGetsItsRecordedResult() throws Exception {
    assertEquals("charged", once("j1", "j1/10"));
    assertEquals("charged", once("j1", "j1/10"));
    assertEquals(1, effects.get(), "one effect, its result twice");
    assertThrows(IdempotencyStore.ConflictException.class, () -> once("j1", "j1/11"));
    String text = MetricsTest.scrape(reg);
    assertTrue(text.contains("backstop_idempotency_requests_total{outcome=\"first_run\"} 1.0"), text);
    assertTrue(text.contains("backstop_idempotency_requests_total{outcome=\"replayed\"} 1.0"), text);
    assertTrue(text.contains("backstop_idempotency_requests_total{outcome=\"conflict\"} 1.0"), text);
  }

  @Test
  void aFailureReleasesTheKey() throws Exception {
    IllegalStateException boom = new IllegalStateException("upstream timeout");
    IllegalStateException got = assertThrows(IllegalStateException.class, () -> store.once("jobs", "j2", "j2", () -> {
      throw boom;
    }));
    assertEquals(boom, got, "fn's own exception");
    assertEquals("charged", once("j2", "j2"), "a retry after the failure runs fn");
    assertEquals(1, effects.get());
  }

  @Test
  void aDuplicateWhileTheFirstRunsIsInProgress() throws Exception {
    AtomicReference<Exception> inner = new AtomicReference<>();
    store.once("jobs", "j3", "j3", () -> {
      try {
        once("j3", "j3");
      } catch (Exception e) {
        inner.set(e);
      }
      return null;
    });
    IdempotencyStore.InProgressException e = assertInstanceOf(IdempotencyStore.InProgressException.class, inner.get());
    assertEquals(30, e.retryAfterSeconds(), "the default lease");
    assertEquals(0, effects.get());
    assertArrayEquals(new byte[0], store.once("jobs", "j3", "j3", this::charge), "a null result is stored empty");
  }

  @Test
  void aResultTooLargeToStoreIsNotReplayed() throws Exception {
    start(IdempotencyStore.Options.defaults().withMaxBody(4));
    assertEquals("charged", once("j4", "j4"));
    assertThrows(IdempotencyStore.TooLargeException.class, () -> once("j4", "j4"));
    assertEquals(1, effects.get(), "never run twice");
  }

  // Redis refuses writes (out of memory) as fn returns: once retries the
  // complete while the lease lasts and returns when the record is stored,
  // so the redelivered job gets the result.
  @Test
  void aCompleteRedisRefusesIsStoredOnceItTakesWrites() throws Exception {
    String policy = r.configGet("maxmemory-policy").get("maxmemory-policy");
    AtomicReference<Throwable> failed = new AtomicReference<>();
    Thread worker = new Thread(() -> {
      try {
        store.once("jobs", "j5", "j5", () -> {
          r.configSet("maxmemory-policy", "noeviction");
          r.configSet("maxmemory", "1");
          return charge();
        });
      } catch (Throwable t) {
        failed.set(t);
      }
    });
    worker.start();
    try {
      RabbitCasesTest.until("a complete refused", () -> storeErrors("complete") >= 1); // retried meanwhile: 1, 2, ...
    } finally {
      r.configSet("maxmemory", "0");
      r.configSet("maxmemory-policy", policy);
    }
    worker.join(30_000);
    assertEquals(null, failed.get(), "once returns when the record is stored");
    assertEquals("charged", once("j5", "j5"));
    assertEquals(1, effects.get(), "the redelivery replays the result");
  }

  /** backstop_idempotency_store_errors_total of operation op, as scraped. */
  double storeErrors(String op) {
    String prefix = "backstop_idempotency_store_errors_total{operation=\"" + op + "\"} ";
    for (String line : scrape().split("\n")) {
      if (line.startsWith(prefix)) return Double.parseDouble(line.substring(prefix.length()).trim());
    }
    return 0;
  }

  String scrape() {
    try {
      return MetricsTest.scrape(reg);
    } catch (Exception e) {
      throw new AssertionError(e);
    }
  }

  static <T> T assertInstanceOf(Class<T> c, Object o) {
    return org.junit.jupiter.api.Assertions.assertInstanceOf(c, o);
  }
}
