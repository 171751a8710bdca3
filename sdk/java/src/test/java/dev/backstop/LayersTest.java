package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * What testdata/layers does not pin in Java: the attempt number and headers
 * inside the operation (nested loops, the attempt_timeout thread, a header
 * the caller set, a builder used again), and OneLayerFilter's edges (a
 * response committed before the loop gave up, a header the handler set,
 * sendError, a large body, a thrown exception, a policy without a breaker).
 */
class LayersTest {
  private static final String FAST = "{\"max_attempts\": 3, \"backoff\": {\"strategy\": \"constant\", \"base\": \"1ms\"},"
      + " \"jitter\": {\"mode\": \"none\"}}";
  private static final HttpClient CLIENT = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();

  @Test
  void attemptHeadersAndMetadata() {
    assertEquals(Map.of("Backstop-Attempt", "2", "X-Envoy-Attempt-Count", "2"), Backstop.attemptHeaders(2));
    assertEquals(Map.of("backstop-attempt", "1"), Backstop.grpcAttemptMetadata(1));
    assertEquals(Map.of("backstop-attempt", "3", "grpc-previous-rpc-attempts", "2"), Backstop.grpcAttemptMetadata(3));
    assertThrows(IllegalArgumentException.class, () -> Backstop.attemptHeaders(0));
    // Outside a loop: no attempt, nothing to send.
    assertEquals(0, Backstop.attempt());
    assertEquals(Map.of(), Backstop.attemptHeaders());
    assertEquals(Map.of(), Backstop.grpcAttemptMetadata());
    HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:9/"));
    assertTrue(Backstop.withAttemptHeaders(b).build().headers().map().isEmpty());
  }

  @Test
  void attemptNumbersOfNestedLoops() throws Exception {
    List<String> seen = new ArrayList<>();
    try (Policy p = Policy.load(FAST)) {
      assertThrows(RetryException.class, () -> Backstop.retry(p, () -> {
        int outer = Backstop.attempt();
        try {
          Backstop.retry(p, () -> {
            seen.add(outer + "." + Backstop.attempt() + " " + Backstop.grpcAttemptMetadata());
            throw new HttpStatusException(503);
          });
        } finally {
          seen.add(outer + " again " + Backstop.attempt()); // the inner loop gave the outer's number back
        }
        return null;
      }));
    }
    assertEquals(List.of("1.1 {backstop-attempt=1}", "1.2 {backstop-attempt=2, grpc-previous-rpc-attempts=1}",
        "1.3 {backstop-attempt=3, grpc-previous-rpc-attempts=2}", "1 again 1"), seen);
    assertEquals(0, Backstop.attempt());
  }

  @Test
  void attemptOnTheAttemptTimeoutThread() throws Exception {
    String policy = "{\"max_attempts\": 2, \"attempt_timeout\": \"30s\", \"backoff\": {\"strategy\": \"constant\","
        + " \"base\": \"1ms\"}, \"jitter\": {\"mode\": \"none\"}}";
    List<String> seen = new ArrayList<>();
    Thread caller = Thread.currentThread();
    try (Policy p = Policy.load(policy)) {
      assertThrows(RetryException.class, () -> Backstop.retry(p, () -> {
        assertNotSame(caller, Thread.currentThread()); // the bounded attempt runs on its own thread
        seen.add(Backstop.attemptHeaders().toString());
        throw new HttpStatusException(503);
      }));
    }
    assertEquals(List.of("{Backstop-Attempt=1, X-Envoy-Attempt-Count=1}", "{Backstop-Attempt=2, X-Envoy-Attempt-Count=2}"),
        seen);
  }

  @Test
  void builderUsedAgainAndCallerSetHeader() throws Exception {
    HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:9/")).header("Backstop-Attempt", "7");
    List<String> seen = new ArrayList<>();
    try (Policy p = Policy.load(FAST)) {
      for (int loop = 0; loop < 2; loop++) {
        assertThrows(RetryException.class, () -> Backstop.retry(p, () -> {
          HttpRequest r = Backstop.withAttemptHeaders(b).build();
          seen.add(r.headers().allValues("Backstop-Attempt") + " " + r.headers().allValues("X-Envoy-Attempt-Count"));
          throw new HttpStatusException(503);
        }));
      }
    }
    // The caller's 7 left alone; the envoy header its attempt's, in the second loop too.
    assertEquals(List.of("[7] [1]", "[7] [2]", "[7] [3]", "[7] [1]", "[7] [2]", "[7] [3]"), seen);
  }

  @Test
  void requestCopied() throws Exception {
    HttpRequest request = HttpRequest.newBuilder(URI.create("http://127.0.0.1:9/x")).header("X-Envoy-Attempt-Count", "5")
        .GET().build();
    assertSame(request, Backstop.withAttemptHeaders(request));
    List<HttpRequest> sent = new ArrayList<>();
    try (Policy p = Policy.load(FAST)) {
      assertThrows(RetryException.class, () -> Backstop.retry(p, () -> {
        sent.add(Backstop.withAttemptHeaders(request));
        throw new HttpStatusException(503);
      }));
    }
    assertEquals(3, sent.size());
    HttpRequest third = sent.get(2);
    assertEquals(Optional.of("3"), third.headers().firstValue("Backstop-Attempt"));
    assertEquals(Optional.of("5"), third.headers().firstValue("X-Envoy-Attempt-Count"));
    assertEquals(request.uri(), third.uri());
    assertEquals(Optional.empty(), request.headers().firstValue("Backstop-Attempt")); // the caller's request as it was
  }

  /** A servlet whose GET runs a loop that gives up (permanent_error on a 404) and then answers as the path says. */
  static final class GivesUp extends HttpServlet {
    private static final long serialVersionUID = 1L;
    final transient Policy policy;

    GivesUp(Policy policy) {
      this.policy = policy;
    }

    @Override
    protected void doGet(HttpServletRequest req, HttpServletResponse resp) throws IOException {
      String path = req.getRequestURI();
      if (path.equals("/committed")) {
        resp.setStatus(503);
        resp.flushBuffer(); // committed before the loop gave up: too late for a header
      }
      try {
        Backstop.retry(policy, () -> {
          throw new HttpStatusException(404);
        });
      } catch (RetryException e) {
        // gave up
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      switch (path) {
        case "/committed":
          return;
        case "/own-header":
          resp.setHeader("Backstop-No-Retry", "mine");
          resp.setStatus(502);
          return;
        case "/send-error":
          resp.sendError(502, "no");
          return;
        case "/large":
          resp.setStatus(500);
          resp.getWriter().write("x".repeat(resp.getBufferSize() * 4)); // commits while writing
          return;
        case "/ok":
          resp.setStatus(200);
          return;
        case "/throws":
          throw new IllegalStateException("handler failed");
        default:
          resp.setStatus(503);
      }
    }
  }

  private static HttpResponse<String> get(TomcatServer s, String path) throws Exception {
    return CLIENT.send(HttpRequest.newBuilder(URI.create(s.base + path)).build(), HttpResponse.BodyHandlers.ofString());
  }

  @Test
  void filterMarksFailedResponses() throws Exception {
    try (Policy p = Policy.load(FAST); TomcatServer s = new TomcatServer(OneLayerFilter.create(p), new GivesUp(p))) {
      record Want(String path, int status, String noRetry) {}
      for (Want w : List.of(new Want("/plain", 503, "permanent_error"), new Want("/send-error", 502, "permanent_error"),
          new Want("/large", 500, "permanent_error"), new Want("/throws", 500, "permanent_error"),
          new Want("/own-header", 502, "mine"), new Want("/ok", 200, null), new Want("/committed", 503, null))) {
        HttpResponse<String> r = get(s, w.path);
        assertEquals(w.status, r.statusCode(), w.path);
        assertEquals(Optional.ofNullable(w.noRetry), r.headers().firstValue("Backstop-No-Retry"), w.path);
        assertEquals(Optional.empty(), r.headers().firstValue("X-Envoy-Overloaded"), w.path);
      }
    }
  }

  @Test
  void filterShedsWhileABreakerIsOpen() throws Exception {
    String breaker = "{\"max_attempts\": 1, \"circuit_breaker\": {\"failure_threshold\": 1, \"open_for\": \"1h\"}}";
    AtomicInteger handled = new AtomicInteger();
    HttpServlet ok = new HttpServlet() {
      private static final long serialVersionUID = 1L;

      @Override
      protected void doGet(HttpServletRequest req, HttpServletResponse resp) {
        handled.incrementAndGet();
        resp.setStatus(204);
      }
    };
    try (Policy stateless = Policy.load(FAST); Policy p = Policy.load(breaker);
        TomcatServer s = new TomcatServer(OneLayerFilter.create(stateless, p), ok)) {
      assertEquals(204, get(s, "/").statusCode());
      p.decide(Failure.builder().attempt(1).httpStatus(503).build()); // opens the breaker
      HttpResponse<String> r = get(s, "/");
      assertEquals(503, r.statusCode());
      assertEquals(Optional.of("circuit_open"), r.headers().firstValue("Backstop-No-Retry"));
      assertEquals(Optional.of("true"), r.headers().firstValue("X-Envoy-Overloaded"));
      assertTrue(r.body().contains("circuit breaker open"), r.body());
      assertEquals(1, handled.get()); // the handler did not run
    }
    // A closed policy cannot answer: it sheds nothing.
    Policy closed = Policy.load(breaker);
    closed.decide(Failure.builder().attempt(1).httpStatus(503).build());
    closed.close();
    try (TomcatServer s = new TomcatServer(OneLayerFilter.create(closed), ok)) {
      assertEquals(204, get(s, "/").statusCode());
    }
    assertEquals(2, handled.get());
  }
}
