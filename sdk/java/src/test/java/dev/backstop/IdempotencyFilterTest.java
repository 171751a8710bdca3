package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.sync.RedisCommands;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.net.http.HttpTimeoutException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * IdempotencyFilter in a real servlet container (embedded Tomcat 11, Servlet
 * 6.1) over a real redis-server: the answers Go's idempotency.Middleware
 * gives (first run, replay, 409 in progress, 422 on another body, a
 * released key), and issue 40's faults: a client that times out while the
 * handler runs, a handler that throws, a store that fails between begin and
 * complete, records another language stored with headers a server refuses.
 */
class IdempotencyFilterTest {
  static RedisClient client;
  static StatefulRedisConnection<String, String> raw;
  static RedisCommands<String, String> r;
  static final HttpClient http = HttpClient.newHttpClient();

  TomcatServer tomcat;
  String base;
  IdempotencyStore store;
  final Map<String, AtomicInteger> runs = new ConcurrentHashMap<>();
  volatile CountDownLatch started = new CountDownLatch(1);
  volatile CountDownLatch release = new CountDownLatch(0);

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

  /** The handler: counts its runs by key, waits for release when asked to, answers as X-Answer says. */
  final class Charges extends HttpServlet {
    private static final long serialVersionUID = 1L;

    @Override
    protected void service(HttpServletRequest req, HttpServletResponse res) throws IOException {
      String ct = req.getContentType();
      String body = ct != null && ct.startsWith("application/x-www-form-urlencoded") ? req.getParameter("amount")
          : new String(req.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
      String key = req.getHeader("Idempotency-Key");
      runs.computeIfAbsent(key == null ? "-" : key, k -> new AtomicInteger()).incrementAndGet();
      started.countDown();
      try {
        release.await(30, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      String answer = req.getHeader("X-Answer");
      if ("throw".equals(answer)) throw new IllegalStateException("the charge failed");
      if ("503".equals(answer)) {
        res.sendError(503, "upstream down");
        return;
      }
      res.setContentType("application/json");
      res.setHeader("Location", "/charges/caf\u00e9"); // Tomcat sends it as Latin-1
      res.setHeader("X-Not-Stored", "1");
      res.setStatus(201);
      res.getWriter().write("{\"charged\":\"" + body + "\"}");
    }
  }

  @BeforeEach
  void start() throws Exception {
    start(IdempotencyStore.Options.defaults().withPrefix("idem-filter"));
  }

  void start(IdempotencyStore.Options options) throws Exception {
    if (tomcat != null) stop();
    store = IdempotencyStore.create(client, options);
    tomcat = new TomcatServer(IdempotencyFilter.create(store, IdempotencyFilter.Options.defaults()), new Charges());
    base = tomcat.base;
  }

  @AfterEach
  void stop() throws Exception {
    release.countDown();
    tomcat.close();
    store.close();
    for (String k : r.keys("idem-filter:*")) r.del(k);
  }

  HttpResponse<String> post(String key, String body, String answer, Duration timeout) throws Exception {
    HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(base + "/charges")).POST(HttpRequest.BodyPublishers.ofString(body));
    if (key != null) b.header("Idempotency-Key", key);
    if (answer != null) b.header("X-Answer", answer);
    if (timeout != null) b.timeout(timeout);
    return http.send(b.build(), HttpResponse.BodyHandlers.ofString());
  }

  HttpResponse<String> post(String key, String body) throws Exception {
    return post(key, body, null, null);
  }

  int runs(String key) {
    AtomicInteger n = runs.get(key);
    return n == null ? 0 : n.get();
  }

  @Test
  void aRetryGetsTheFirstResponseAndTheHandlerRunsOnce() throws Exception {
    HttpResponse<String> first = post("k1", "10");
    assertEquals(201, first.statusCode());
    assertEquals("{\"charged\":\"10\"}", first.body());
    assertTrue(first.headers().firstValue(IdempotencyFilter.REPLAYED_HEADER).isEmpty());
    HttpResponse<String> again = post("k1", "10");
    assertEquals(201, again.statusCode());
    assertEquals("{\"charged\":\"10\"}", again.body());
    assertEquals("true", again.headers().firstValue(IdempotencyFilter.REPLAYED_HEADER).orElse(""));
    // Stored under the header rule, as Go stores /orders/€42.
    assertEquals("/charges/caf%C3%A9", again.headers().firstValue("Location").orElse(""));
    String ct = first.headers().firstValue("Content-Type").orElse("");
    assertTrue(ct.startsWith("application/json"), ct);
    assertEquals(ct, again.headers().firstValue("Content-Type").orElse(""));
    assertTrue(again.headers().firstValue("X-Not-Stored").isEmpty(), "a header not chosen was stored");
    assertEquals(1, runs("k1"));
    // The record is the one every language reads.
    Map<String, String> rec = r.hgetall("idem-filter:{:k1}");
    assertEquals("completed", rec.get("state"));
    assertEquals("201", rec.get("status"));
    assertEquals("{\"Content-Type\":[\"" + ct + "\"],\"Location\":[\"/charges/caf%C3%A9\"]}", rec.get("headers"));
    assertEquals(IdempotencyStore.fingerprint("POST", "/charges", "10".getBytes(StandardCharsets.UTF_8)), rec.get("request"));
  }

  // The body the filter read is the handler's still: a form's parameters too.
  @Test
  void aFormPostKeepsItsParameters() throws Exception {
    HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(base + "/charges?currency=eur"))
        .header("Content-Type", "application/x-www-form-urlencoded").header("Idempotency-Key", "f1")
        .POST(HttpRequest.BodyPublishers.ofString("amount=12%2C50"));
    HttpResponse<String> first = http.send(b.build(), HttpResponse.BodyHandlers.ofString());
    assertEquals("{\"charged\":\"12,50\"}", first.body());
    HttpResponse<String> other = http.send(b.POST(HttpRequest.BodyPublishers.ofString("amount=13")).build(),
        HttpResponse.BodyHandlers.ofString());
    assertEquals(422, other.statusCode(), "another form under the key");
    assertEquals(1, runs("f1"));
  }

  @Test
  void anotherBodyUnderTheKeyIs422AndNoKeyPassesThrough() throws Exception {
    assertEquals(201, post("k2", "10").statusCode());
    HttpResponse<String> other = post("k2", "11");
    assertEquals(422, other.statusCode(), other.body());
    assertEquals(1, runs("k2"));
    assertEquals(201, post(null, "10").statusCode());
    assertEquals(201, post(null, "10").statusCode());
    assertEquals(2, runs("-"), "a request without a key runs every time");
    assertEquals(400, post("k".repeat(256), "10").statusCode(), "a key over 255 bytes");
  }

  @Test
  void aDuplicateWhileTheFirstRunsIs409WithRetryAfter() throws Exception {
    release = new CountDownLatch(1);
    started = new CountDownLatch(1);
    CompletableFuture<HttpResponse<String>> first = CompletableFuture.supplyAsync(() -> {
      try {
        return post("k3", "10");
      } catch (Exception e) {
        throw new RuntimeException(e);
      }
    });
    assertTrue(started.await(20, TimeUnit.SECONDS));
    HttpResponse<String> dup = post("k3", "10");
    assertEquals(409, dup.statusCode(), dup.body());
    assertEquals("30", dup.headers().firstValue("Retry-After").orElse(""));
    release.countDown();
    assertEquals(201, first.get(20, TimeUnit.SECONDS).statusCode());
    assertEquals(1, runs("k3"));
  }

  @Test
  void aRetryableStatusOrAThrowReleasesTheKey() throws Exception {
    assertEquals(503, post("k4", "10", "503", null).statusCode());
    assertNull(r.hget("idem-filter:{:k4}", "state"), "a 503 was stored");
    assertEquals(201, post("k4", "10").statusCode());
    assertEquals(2, runs("k4"));
    assertEquals(500, post("k5", "10", "throw", null).statusCode());
    assertNull(r.hget("idem-filter:{:k5}", "state"), "a handler that threw left its key");
    assertEquals(201, post("k5", "10").statusCode());
    assertEquals(2, runs("k5"));
  }

  // The backstop_idempotency_* families, named and helped as Go's, Node's
  // and Python's, every series there from the start.
  @Test
  void theFilterCountsWhatGoCounts() throws Exception {
    io.prometheus.metrics.model.registry.PrometheusRegistry reg = new io.prometheus.metrics.model.registry.PrometheusRegistry();
    start(IdempotencyStore.Options.defaults().withPrefix("idem-filter").withMetrics(reg));
    assertEquals(201, post("m1", "10").statusCode());
    assertEquals(201, post("m1", "10").statusCode());
    assertEquals(422, post("m1", "11").statusCode());
    MetricsTest.assertExposes(reg,
        "# HELP backstop_idempotency_requests_total Requests carrying an idempotency key, by outcome: first_run, replayed, in_progress, conflict, too_large.",
        "# HELP backstop_idempotency_lease_expiries_total Keys taken over because their owner's lease ran out (a crashed or slow request).",
        "# HELP backstop_idempotency_lease_lost_total Complete or fail refused because the caller no longer owned its key.",
        "# HELP backstop_idempotency_store_errors_total Calls to the idempotency store that failed, by operation: begin, complete, fail.",
        "backstop_idempotency_requests_total{outcome=\"first_run\"} 1.0",
        "backstop_idempotency_requests_total{outcome=\"replayed\"} 1.0",
        "backstop_idempotency_requests_total{outcome=\"conflict\"} 1.0",
        "backstop_idempotency_requests_total{outcome=\"in_progress\"} 0.0",
        "backstop_idempotency_store_errors_total{operation=\"complete\"} 0.0",
        "backstop_idempotency_lease_lost_total 0.0");
  }

  // Issue 40, fault 1: a client that times out while the handler runs. The
  // handler finishes after the client left; its response is stored, so the
  // retry gets it (not a 409, and never, after the lease, a second charge).
  @Test
  void aClientThatTimedOutDoesNotRunTheChargeTwice() throws Exception {
    release = new CountDownLatch(1);
    started = new CountDownLatch(1);
    CompletableFuture<Void> hung = CompletableFuture.runAsync(() -> {
      HttpTimeoutException e = assertThrows(HttpTimeoutException.class, () -> post("k6", "10", null, Duration.ofMillis(300)));
      assertTrue(e.getMessage().contains("timed out"), e.getMessage());
    });
    assertTrue(started.await(20, TimeUnit.SECONDS));
    hung.get(20, TimeUnit.SECONDS); // the client has given up
    release.countDown();
    RabbitCasesTest.until("the record completed", () -> "completed".equals(r.hget("idem-filter:{:k6}", "state")));
    HttpResponse<String> retry = post("k6", "10");
    assertEquals(201, retry.statusCode());
    assertEquals("true", retry.headers().firstValue(IdempotencyFilter.REPLAYED_HEADER).orElse(""));
    assertEquals(1, runs("k6"));
  }

  // Issue 40, fault 1 (second half): Redis refuses the complete (out of
  // memory) between begin and complete. The client gets its response, the
  // complete is retried in the background while the lease lasts, and once
  // Redis takes writes again the record is completed: the retry replays it.
  @Test
  void aStoreErrorAtCompleteIsRetriedWhileTheLeaseLasts() throws Exception {
    release = new CountDownLatch(1);
    started = new CountDownLatch(1);
    CompletableFuture<HttpResponse<String>> first = CompletableFuture.supplyAsync(() -> {
      try {
        return post("k7", "10");
      } catch (Exception e) {
        throw new RuntimeException(e);
      }
    });
    assertTrue(started.await(20, TimeUnit.SECONDS));
    String policy = r.configGet("maxmemory-policy").get("maxmemory-policy");
    r.configSet("maxmemory-policy", "noeviction");
    r.configSet("maxmemory", "1");
    try {
      release.countDown();
      HttpResponse<String> resp = first.get(20, TimeUnit.SECONDS);
      assertEquals(201, resp.statusCode(), "the client still gets its answer");
      assertEquals("in_progress", r.hget("idem-filter:{:k7}", "state"), "the complete was refused");
    } finally {
      r.configSet("maxmemory", "0");
      r.configSet("maxmemory-policy", policy);
    }
    RabbitCasesTest.until("the record completed by a retry", () -> "completed".equals(r.hget("idem-filter:{:k7}", "state")));
    HttpResponse<String> retry = post("k7", "10");
    assertEquals("true", retry.headers().firstValue(IdempotencyFilter.REPLAYED_HEADER).orElse(""), retry.body());
    assertEquals(1, runs("k7"));
  }

  // Issue 40, fault 2: records another language stored, or stored before
  // the header rule (raw €, a control byte, CR LF, a name that is not a
  // token), are replayed under the rule: never a crash or a 500.
  @Test
  void recordsOtherLanguagesStoredAreReplayed() throws Exception {
    Map<String, String> headers = Map.of(
        "go-location", "{\"Location\":[\"/orders/\u20ac42\"],\"Content-Type\":[\"application/json\"]}",
        "python-control", "{\"location\":[\"/charges/1\\u0001\"]}",
        "crlf", "{\"X-Split\":[\"a\\r\\nSet-Cookie: x=1\"]}",
        "odd-name", "{\"X Odd:Name\":[\"v\"],\"content-type\":[\"application/json\"]}");
    Map<String, String> want = Map.of("go-location", "/orders/%E2%82%AC42", "python-control", "/charges/1%01",
        "crlf", "a%0D%0ASet-Cookie: x=1", "odd-name", "");
    for (Map.Entry<String, String> e : headers.entrySet()) {
      String rk = store.recordKey("", e.getKey());
      r.hset(rk, Map.of("state", "completed", "request", IdempotencyStore.fingerprint("POST", "/charges", new byte[] {'1'}),
          "status", "201", "headers", e.getValue(), "body", "c3RvcmVk", "too_large", "0"));
      HttpResponse<String> resp = post(e.getKey(), "1");
      assertEquals(201, resp.statusCode(), e.getKey() + ": " + resp.body());
      assertEquals("stored", resp.body(), e.getKey());
      assertEquals("true", resp.headers().firstValue(IdempotencyFilter.REPLAYED_HEADER).orElse(""), e.getKey());
      String got = e.getKey().equals("crlf") ? resp.headers().firstValue("X-Split").orElse("")
          : resp.headers().firstValue("Location").orElse("");
      assertEquals(want.get(e.getKey()), got, e.getKey());
      assertTrue(resp.headers().firstValue("Set-Cookie").isEmpty(), e.getKey());
      assertEquals(0, runs(e.getKey()), e.getKey() + ": a replay ran the handler");
    }
  }
}
