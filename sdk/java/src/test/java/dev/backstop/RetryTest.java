package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.net.ConnectException;
import java.net.SocketTimeoutException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpHeaders;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import javax.net.ssl.SSLSession;
import org.junit.jupiter.api.Test;

/** The retry loop on a fake clock: it never sleeps for real. */
class RetryTest {
  private static final long START = 1_767_225_600_000L;
  // No jitter: the delays are exact.
  private static final String POLICY = "{\"max_attempts\": 4, \"backoff\": {\"strategy\": \"exponential\","
      + " \"base\": \"100ms\", \"cap\": \"10s\"}, \"jitter\": {\"mode\": \"none\"}}";

  /** An operation that fails with the given errors in turn, then returns "ok". */
  private static Callable<String> failing(AtomicInteger calls, Exception... errors) {
    return () -> {
      int n = calls.getAndIncrement();
      if (n < errors.length) throw errors[n];
      return "ok";
    };
  }

  private static Retry loop(Policy p, FakeTicker clock) {
    return Backstop.retrying(p).withTicker(clock);
  }

  @Test
  void retriesTransientErrorsSleepingTheDecidedDelays() throws Exception {
    FakeTicker clock = new FakeTicker(START);
    AtomicInteger calls = new AtomicInteger();
    try (Policy p = Policy.load(POLICY)) {
      String got = loop(p, clock).call(failing(calls, new SocketTimeoutException("read timed out"),
          new ConnectException("Connection refused"), new HttpStatusException(503)));
      assertEquals("ok", got);
      assertEquals(4, calls.get());
      assertEquals(List.of(100L, 200L, 400L), clock.slept);
    }
  }

  @Test
  void retryAfterIsHonoured() throws Exception {
    FakeTicker clock = new FakeTicker(START);
    try (Policy p = Policy.load(POLICY)) {
      loop(p, clock).call(failing(new AtomicInteger(), new HttpStatusException(429, "7")));
      assertEquals(List.of(7000L), clock.slept);
    }
  }

  @Test
  void givesUpWithTheReasonTheAttemptsAndTheLastError() {
    FakeTicker clock = new FakeTicker(START);
    HttpStatusException notFound = new HttpStatusException(404);
    try (Policy p = Policy.load(POLICY)) {
      RetryException e = assertThrows(RetryException.class, () -> loop(p, clock).call(failing(new AtomicInteger(), notFound)));
      assertEquals(Decision.Reason.PERMANENT_ERROR, e.reason());
      assertEquals(1, e.attempts());
      assertSame(notFound, e.getCause());
      assertEquals("gave up after 1 attempt (permanent_error): HTTP 404", e.getMessage());

      SocketTimeoutException last = new SocketTimeoutException("the 4th");
      AtomicInteger calls = new AtomicInteger();
      e = assertThrows(RetryException.class, () -> loop(p, clock).call(failing(calls, new SocketTimeoutException("1"),
          new SocketTimeoutException("2"), new SocketTimeoutException("3"), last)));
      assertEquals(Decision.Reason.MAX_ATTEMPTS_REACHED, e.reason());
      assertEquals(4, e.attempts());
      assertEquals(4, calls.get());
      assertSame(last, e.getCause());
      assertEquals(Decision.Reason.MAX_ATTEMPTS_REACHED, e.decision().orElseThrow().reason());
    }
  }

  @Test
  void theIdempotencyGateNeedsAKeyForPost() throws Exception {
    try (Policy p = Policy.load(POLICY)) {
      // A POST without a key is not retried: the request may have been applied.
      RetryException e = assertThrows(RetryException.class, () -> loop(p, new FakeTicker(START)).withMethod("POST")
          .call(failing(new AtomicInteger(), new HttpStatusException(503))));
      assertEquals(Decision.Reason.NOT_IDEMPOTENT, e.reason());
      // With a key it is.
      assertEquals("ok", loop(p, new FakeTicker(START)).withMethod("POST").withIdempotencyKey("order-42")
          .call(failing(new AtomicInteger(), new HttpStatusException(503))));
      // A refused connection proves the request never left: retried without a key.
      assertEquals("ok", loop(p, new FakeTicker(START)).withMethod("POST")
          .call(failing(new AtomicInteger(), new ConnectException("Connection refused"))));
      // A GET needs none.
      assertEquals("ok", loop(p, new FakeTicker(START)).withMethod("GET")
          .call(failing(new AtomicInteger(), new HttpStatusException(503))));
    }
  }

  @Test
  void failedHttpResponsesAreFailuresWithTheirHeadersAndRequest() throws Exception {
    FakeTicker clock = new FakeTicker(START);
    HttpRequest get = HttpRequest.newBuilder(URI.create("http://127.0.0.1/orders/42")).GET().build();
    List<HttpResponse<String>> responses = new ArrayList<>(List.of(
        new Response(get, 503, Map.of("Retry-After", List.of("3"))), new Response(get, 200, Map.of())));
    try (Policy p = Policy.load(POLICY)) {
      HttpResponse<String> r = loop(p, clock).call(() -> responses.remove(0));
      assertEquals(200, r.statusCode());
      assertEquals(List.of(3000L), clock.slept);

      HttpRequest post = HttpRequest.newBuilder(URI.create("http://127.0.0.1/orders")).POST(HttpRequest.BodyPublishers.noBody()).build();
      Response failed = new Response(post, 503, Map.of());
      RetryException e = assertThrows(RetryException.class, () -> loop(p, clock).call(() -> failed));
      assertEquals(Decision.Reason.NOT_IDEMPOTENT, e.reason()); // the request's method, POST, and no key
      assertSame(failed, e.response().orElseThrow());
      assertInstanceOf(HttpStatusException.class, e.getCause());

      HttpRequest keyed = HttpRequest.newBuilder(URI.create("http://127.0.0.1/orders")).header("Idempotency-Key", "k1")
          .POST(HttpRequest.BodyPublishers.noBody()).build();
      List<HttpResponse<String>> more = new ArrayList<>(List.of(new Response(keyed, 503, Map.of()), new Response(keyed, 201, Map.of())));
      assertEquals(201, loop(p, clock).call(() -> more.remove(0)).statusCode());

      // A layer below retried and gave up (Backstop-No-Retry): this one gives up too.
      Response below = new Response(get, 503, Map.of("Backstop-No-Retry", List.of("1")));
      e = assertThrows(RetryException.class, () -> loop(p, clock).call(() -> below));
      assertEquals(Decision.Reason.RETRIED_DOWNSTREAM, e.reason());
    }
  }

  @Test
  void aNestedLoopThatGaveUpIsNotRetriedAgain() {
    try (Policy p = Policy.load(POLICY)) {
      RetryException e = assertThrows(RetryException.class, () -> loop(p, new FakeTicker(START)).call(
          () -> loop(p, new FakeTicker(START)).call(failing(new AtomicInteger(), new HttpStatusException(503),
              new HttpStatusException(503), new HttpStatusException(503), new HttpStatusException(503)))));
      assertEquals(Decision.Reason.RETRIED_DOWNSTREAM, e.reason());
      assertEquals(1, e.attempts());
    }
  }

  @Test
  void theCircuitBreakerRefusesCallsWhileOpen() throws Exception {
    String policy = "{\"max_attempts\": 2, \"jitter\": {\"mode\": \"none\"},"
        + " \"circuit_breaker\": {\"failure_threshold\": 2, \"open_for\": \"10s\"}}";
    FakeTicker clock = new FakeTicker(START);
    try (Policy p = Policy.load(policy)) {
      assertThrows(RetryException.class, () -> loop(p, clock).call(failing(new AtomicInteger(),
          new HttpStatusException(503), new HttpStatusException(503))));
      AtomicInteger calls = new AtomicInteger();
      RetryException e = assertThrows(RetryException.class, () -> loop(p, clock).call(failing(calls)));
      assertEquals(Decision.Reason.CIRCUIT_OPEN, e.reason());
      assertEquals(0, e.attempts());
      assertEquals(0, calls.get());
      assertTrue(e.retryInMs() > 0 && e.retryInMs() <= 10_000, e.retryInMs() + " ms");
      clock.advance(10_000);
      assertEquals("ok", loop(p, clock).call(failing(calls))); // half-open admits a trial
    }
  }

  @Test
  void eachAttemptIsBoundedByTheAttemptTimeout() throws Exception {
    String policy = "{\"max_attempts\": 3, \"attempt_timeout\": \"50ms\", \"jitter\": {\"mode\": \"none\"}}";
    CountDownLatch never = new CountDownLatch(1);
    AtomicInteger calls = new AtomicInteger();
    AtomicInteger interrupted = new AtomicInteger();
    FakeTicker clock = new FakeTicker(START);
    try (Policy p = Policy.load(policy)) {
      assertEquals(50, p.attemptTimeout(0));
      String got = loop(p, clock).call(() -> {
        if (calls.getAndIncrement() == 0) {
          try {
            never.await(); // hangs until the loop gives up on it
          } catch (InterruptedException e) {
            interrupted.incrementAndGet();
            throw e;
          }
        }
        return "ok";
      });
      assertEquals("ok", got);
      assertEquals(2, calls.get());
      assertEquals(1, clock.slept.size()); // the timeout was retried as a transient failure
    }
  }

  @Test
  void theClassifierComesFirstAndOtherErrorsAreUncertain() throws Exception {
    try (Policy p = Policy.load(POLICY)) {
      IOException unknown = new IOException("something else");
      RetryException e = assertThrows(RetryException.class, () -> loop(p, new FakeTicker(START))
          .call(failing(new AtomicInteger(), unknown, unknown, unknown, unknown)));
      // No signal: the policy's default class, uncertain, retries up to its own smaller limit.
      assertEquals(Decision.Reason.UNCERTAIN_LIMIT_REACHED, e.reason());
      assertEquals("ok", loop(p, new FakeTicker(START))
          .withClassifier(t -> t == unknown ? Failure.builder().errorKind("connection_reset") : null)
          .call(failing(new AtomicInteger(), unknown, unknown, unknown)));
    }
  }

  @Test
  void interruptionIsTheCallersDecision() {
    try (Policy p = Policy.load(POLICY)) {
      assertThrows(InterruptedException.class, () -> loop(p, new FakeTicker(START)).call(() -> {
        throw new InterruptedException();
      }));
    }
  }

  @Test
  void theListenerSeesEachRetry() throws Exception {
    List<String> seen = new ArrayList<>();
    try (Policy p = Policy.load(POLICY)) {
      loop(p, new FakeTicker(START)).withListener((attempt, error, d) -> seen.add(attempt + " " + error.getMessage() + " " + d.delayMs()))
          .call(failing(new AtomicInteger(), new SocketTimeoutException("slow")));
    }
    assertEquals(List.of("1 slow 100"), seen);
    assertFalse(seen.isEmpty());
  }

  /** A java.net.http response as a test makes it. */
  private static final class Response implements HttpResponse<String> {
    private final HttpRequest request;
    private final int status;
    private final HttpHeaders headers;

    Response(HttpRequest request, int status, Map<String, List<String>> headers) {
      this.request = request;
      this.status = status;
      this.headers = HttpHeaders.of(headers, (a, b) -> true);
    }

    @Override
    public int statusCode() {
      return status;
    }

    @Override
    public HttpRequest request() {
      return request;
    }

    @Override
    public Optional<HttpResponse<String>> previousResponse() {
      return Optional.empty();
    }

    @Override
    public HttpHeaders headers() {
      return headers;
    }

    @Override
    public String body() {
      return "";
    }

    @Override
    public Optional<SSLSession> sslSession() {
      return Optional.empty();
    }

    @Override
    public URI uri() {
      return request.uri();
    }

    @Override
    public HttpClient.Version version() {
      return HttpClient.Version.HTTP_1_1;
    }
  }
}
