package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;

import com.sun.net.httpserver.HttpServer;
import jakarta.servlet.Filter;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/**
 * The shared layer cases (testdata/layers/cases.json, see its README)
 * replayed in Java: a scripted bottom server (the JDK's HttpServer), a
 * middle servlet behind OneLayerFilter in embedded Tomcat whose handler
 * calls the bottom through Backstop.retry, and a top Backstop.retry with the
 * attempt headers on, all over java.net.http.HttpClient on loopback; what
 * they did compared with what the Go loop and middleware did.
 */
class LayersCasesTest {
  static final Map<String, Object> FILE = Repo.json("testdata/layers/cases.json");

  // The middle's breaker, when the case opens it before it starts.
  private static final Map<String, Object> OPEN_BREAKER = Map.of("failure_threshold", 1L, "open_for", "1h");
  // The headers the bottom records and the middle's response signals.
  private static final List<String> SEEN = List.of("backstop-attempt", "x-envoy-attempt-count");
  private static final List<String> SIGNALS = List.of("backstop-no-retry", "x-envoy-overloaded");

  private static final HttpClient CLIENT = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();

  /** The scripted bottom: its responses in order, the last one again; the attempt headers of each call. */
  static final class Bottom implements AutoCloseable {
    final HttpServer server;
    final List<Map<String, Object>> seen = Collections.synchronizedList(new ArrayList<>());
    final URI uri;

    @SuppressWarnings("unchecked")
    Bottom(List<Object> script) throws Exception {
      server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
      server.createContext("/", ex -> {
        Map<String, Object> h = new LinkedHashMap<>();
        for (String name : SEEN) {
          String v = ex.getRequestHeaders().getFirst(name);
          if (v != null) h.put(name, v);
        }
        int n;
        synchronized (seen) {
          seen.add(h);
          n = seen.size();
        }
        Map<String, Object> r = (Map<String, Object>) script.get(Math.min(n, script.size()) - 1);
        Map<String, Object> headers = (Map<String, Object>) r.getOrDefault("headers", Map.of());
        headers.forEach((k, v) -> ex.getResponseHeaders().set(k, (String) v));
        ex.getRequestBody().readAllBytes();
        ex.sendResponseHeaders(((Number) r.get("status")).intValue(), -1);
        ex.close();
      });
      server.start();
      uri = URI.create("http://127.0.0.1:" + server.getAddress().getPort() + "/");
    }

    @Override
    public void close() {
      server.stop(0);
    }
  }

  static HttpResponse<Void> get(URI uri) throws Exception {
    return CLIENT.send(Backstop.withAttemptHeaders(HttpRequest.newBuilder(uri)).build(),
        HttpResponse.BodyHandlers.discarding());
  }

  static Policy policy(Object config) {
    return Policy.load(Repo.write(config));
  }

  /** The middle: its policy's loop to the bottom, behind OneLayerFilter over that policy, in Tomcat. */
  @SuppressWarnings("unchecked")
  static final class Middle implements AutoCloseable {
    final AtomicInteger calls = new AtomicInteger();
    final Policy policy;
    final TomcatServer tomcat;
    final URI uri;

    Middle(Map<String, Object> c, Bottom bottom) throws Exception {
      Map<String, Object> m = (Map<String, Object>) c.get("middle");
      Map<String, Object> config = new LinkedHashMap<>((Map<String, Object>) m.getOrDefault("policy", FILE.get("policy")));
      boolean open = Boolean.TRUE.equals(m.get("breaker_open"));
      if (open) config.put("circuit_breaker", OPEN_BREAKER);
      policy = policy(config);
      if (open) policy.decide(Failure.builder().attempt(1).httpStatus(503).build());
      Filter one = OneLayerFilter.create(policy);
      // Every request the server received, shed ones too.
      Filter counting = (req, res, chain) -> {
        calls.incrementAndGet();
        one.doFilter(req, res, chain);
      };
      HttpServlet handler = new HttpServlet() {
        private static final long serialVersionUID = 1L;

        @Override
        protected void doGet(HttpServletRequest req, HttpServletResponse resp) {
          int status = 200;
          try {
            Backstop.retry(policy, () -> get(bottom.uri));
          } catch (RetryException e) {
            // A loop that made no call (its breaker refused it) has no response.
            status = e.response().map(r -> ((HttpResponse<?>) r).statusCode()).orElse(503);
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            status = 500;
          }
          resp.setStatus(status);
        }
      };
      tomcat = new TomcatServer(counting, handler);
      uri = URI.create(tomcat.base + "/");
    }

    @Override
    public void close() throws Exception {
      tomcat.close();
      policy.close();
    }
  }

  @SuppressWarnings("unchecked")
  static Map<String, Object> run(Map<String, Object> c) throws Exception {
    try (Bottom bottom = new Bottom((List<Object>) c.get("bottom"));
        Middle middle = c.containsKey("middle") ? new Middle(c, bottom) : null;
        Policy top = policy(c.getOrDefault("policy", FILE.get("policy")));
        Policy inner = Boolean.TRUE.equals(c.get("inner_loop")) ? policy(FILE.get("policy")) : null) {
      AtomicInteger attempts = new AtomicInteger();
      AtomicReference<Map<String, Object>> middleHeaders = new AtomicReference<>(Map.of());
      String reason = "success";
      try {
        Backstop.retry(top, () -> {
          attempts.incrementAndGet();
          if (inner != null) return Backstop.retry(inner, () -> get(bottom.uri)); // a second loop, same thread
          HttpResponse<Void> r = get(middle != null ? middle.uri : bottom.uri);
          if (middle != null) {
            Map<String, Object> h = new LinkedHashMap<>();
            for (String name : SIGNALS) r.headers().firstValue(name).ifPresent(v -> h.put(name, v));
            middleHeaders.set(h);
          }
          return r;
        });
      } catch (RetryException e) {
        reason = e.reason().toString();
      }
      Map<String, Object> got = new LinkedHashMap<>();
      got.put("reason", reason);
      got.put("attempts", (long) attempts.get());
      got.put("bottom_calls", (long) bottom.seen.size());
      got.put("bottom_seen", new ArrayList<>(bottom.seen));
      if (middle != null) {
        got.put("middle_calls", (long) middle.calls.get());
        got.put("middle_headers", middleHeaders.get());
      }
      return got;
    }
  }

  // Zero values left out, as the generator's JSON omits them.
  static Map<String, Object> compact(Map<String, Object> v) {
    Map<String, Object> out = new LinkedHashMap<>();
    v.forEach((k, x) -> {
      boolean empty = x == null || (x instanceof Number && ((Number) x).longValue() == 0)
          || (x instanceof List && ((List<?>) x).isEmpty()) || (x instanceof Map && ((Map<?, ?>) x).isEmpty());
      if (!empty) out.put(k, x);
    });
    return out;
  }

  @SuppressWarnings("unchecked")
  static List<Map<String, Object>> cases() {
    return (List<Map<String, Object>>) (List<?>) FILE.get("cases");
  }

  @Test
  void fileHasCases() {
    assertFalse(cases() == null || cases().isEmpty(), "testdata/layers/cases.json: no cases (make layers-cases writes it)");
  }

  @TestFactory
  @SuppressWarnings("unchecked")
  Stream<DynamicTest> layerCases() {
    return cases().stream().map(c -> DynamicTest.dynamicTest((String) c.get("name"),
        () -> assertEquals(compact((Map<String, Object>) c.get("expect")), compact(run(c)), (String) c.get("name"))));
  }
}
