package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.prometheus.metrics.model.registry.PrometheusRegistry;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import javax.sql.DataSource;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.postgresql.ds.PGSimpleDataSource;

/**
 * IdempotencyFilter over PgIdempotencyStore in a real servlet container
 * (embedded Tomcat 11) and a real PostgreSQL server: the answers it gives
 * over Redis (IdempotencyFilterTest) and Go's middleware on pgstore
 * (TestMiddleware): replay, 422 on another body, 409 while the first runs,
 * a released key; 409 with Retry-After 1 while a worker's onceTx holds the
 * key; 503 when the database refuses the store.
 */
class PgIdempotencyFilterTest {
  static final HttpClient http = HttpClient.newHttpClient();

  DataSource db;
  PrometheusRegistry reg;
  TomcatServer tomcat;
  final AtomicInteger runs = new AtomicInteger();
  volatile CountDownLatch started = new CountDownLatch(1);
  volatile CountDownLatch release = new CountDownLatch(0);

  /** Charges: counts its runs, waits for release, answers 201 JSON (503 when X-Answer says so). */
  final class Charges extends HttpServlet {
    private static final long serialVersionUID = 1L;

    @Override
    protected void service(HttpServletRequest req, HttpServletResponse res) throws IOException {
      String body = new String(req.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
      runs.incrementAndGet();
      started.countDown();
      try {
        release.await(30, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      if ("503".equals(req.getHeader("X-Answer"))) {
        res.sendError(503, "upstream down");
        return;
      }
      res.setContentType("application/json");
      res.setStatus(201);
      res.getWriter().write("{\"charged\":\"" + body + "\"}");
    }
  }

  @BeforeEach
  void start() throws Exception {
    PostgresServer pg = PostgresServer.get();
    db = pg.dataSource(pg.database());
    reg = new PrometheusRegistry();
    PgIdempotencyStore store = PgIdempotencyStore.create(db, IdempotencyStore.Options.defaults().withMetrics(reg));
    store.createTable();
    start(store);
  }

  void start(IdempotencyBackend store) throws Exception {
    if (tomcat != null) tomcat.close();
    tomcat = new TomcatServer(IdempotencyFilter.create(store, IdempotencyFilter.Options.defaults()), new Charges());
  }

  @AfterEach
  void stop() throws Exception {
    release.countDown();
    tomcat.close();
  }

  HttpResponse<String> post(String key, String body, String answer) throws Exception {
    HttpRequest.Builder b = HttpRequest.newBuilder(URI.create(tomcat.base + "/charges")).POST(HttpRequest.BodyPublishers.ofString(body));
    b.header("Idempotency-Key", key);
    if (answer != null) b.header("X-Answer", answer);
    return http.send(b.build(), HttpResponse.BodyHandlers.ofString());
  }

  @Test
  void replayConflictAndInProgressAsOnRedis() throws Exception {
    HttpResponse<String> first = post("k1", "500", null);
    HttpResponse<String> again = post("k1", "500", null);
    assertEquals(201, first.statusCode());
    assertEquals(201, again.statusCode());
    assertEquals("{\"charged\":\"500\"}", again.body());
    assertEquals("true", again.headers().firstValue(IdempotencyFilter.REPLAYED_HEADER).orElse(""));
    String ct = first.headers().firstValue("Content-Type").orElse("");
    assertTrue(ct.startsWith("application/json"), ct);
    assertEquals(ct, again.headers().firstValue("Content-Type").orElse(""), "the stored Content-Type");
    assertEquals(1, runs.get());
    assertEquals(422, post("k1", "700", null).statusCode(), "another body");

    release = new CountDownLatch(1);
    started = new CountDownLatch(1);
    CompletableFuture<HttpResponse<String>> slow = CompletableFuture.supplyAsync(() -> {
      try {
        return post("k2", "slow", null);
      } catch (Exception e) {
        throw new RuntimeException(e);
      }
    });
    assertTrue(started.await(20, TimeUnit.SECONDS));
    HttpResponse<String> dup = post("k2", "slow", null);
    assertEquals(409, dup.statusCode(), dup.body());
    assertEquals("30", dup.headers().firstValue("Retry-After").orElse(""), "the lease's seconds left");
    release.countDown();
    HttpResponse<String> done = slow.get(20, TimeUnit.SECONDS);
    HttpResponse<String> after = post("k2", "slow", null);
    assertEquals(201, after.statusCode());
    assertEquals(done.body(), after.body());
    assertEquals(2, runs.get());

    assertEquals(503, post("k3", "1", "503").statusCode());
    assertEquals(201, post("k3", "1", null).statusCode(), "a retryable status released the key");
    assertEquals(4, runs.get());

    MetricsTest.assertExposes(reg, "backstop_idempotency_requests_total{outcome=\"first_run\"} 4.0",
        "backstop_idempotency_requests_total{outcome=\"replayed\"} 2.0",
        "backstop_idempotency_requests_total{outcome=\"conflict\"} 1.0",
        "backstop_idempotency_requests_total{outcome=\"in_progress\"} 1.0");
  }

  // A worker's transaction holds the key (onceTx): the filter answers 409 and
  // Retry-After 1 at once, without running the handler; after the commit the
  // same request gets the worker's result.
  @Test
  void aWorkersTransactionHoldsTheKey() throws Exception {
    PgIdempotencyStore store = PgIdempotencyStore.create(db, IdempotencyStore.Options.defaults());
    String request = IdempotencyStore.requestHash("POST", "/charges", "9".getBytes(StandardCharsets.UTF_8));
    try (Connection conn = db.getConnection()) {
      conn.setAutoCommit(false);
      store.onceTx(conn, "", "w1", request, tx -> {
        try {
          HttpResponse<String> dup = post("w1", "9", null);
          assertEquals(409, dup.statusCode(), dup.body());
          assertEquals("1", dup.headers().firstValue("Retry-After").orElse(""));
        } catch (Exception e) {
          throw new AssertionError(e);
        }
        return "worker".getBytes(StandardCharsets.UTF_8);
      });
      conn.commit();
    }
    HttpResponse<String> after = post("w1", "9", null);
    assertEquals(200, after.statusCode());
    assertEquals("worker", after.body());
    assertEquals(0, runs.get(), "the handler never ran");
  }

  // The database refuses the store (a wrong password): 503 and Retry-After,
  // the handler not run, the password in no response.
  @Test
  void aStoreThatCannotConnectIs503() throws Exception {
    PGSimpleDataSource wrong = new PGSimpleDataSource();
    wrong.setUrl(PostgresServer.get().secretUrl("postgres").replace(PostgresServer.PASSWORD, "wrong-" + PostgresServer.PASSWORD));
    start(PgIdempotencyStore.create(wrong, IdempotencyStore.Options.defaults()));
    HttpResponse<String> r = post("d1", "1", null);
    assertEquals(503, r.statusCode());
    assertEquals("1", r.headers().firstValue("Retry-After").orElse(""));
    assertFalse(r.body().contains(PostgresServer.PASSWORD), r.body());
    assertEquals(0, runs.get());
  }
}
