package dev.backstop;

import java.net.http.HttpHeaders;
import java.net.http.HttpRequest;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.WeakHashMap;
import java.util.concurrent.Callable;

/**
 * Retry at one layer (docs/layers.md): the attempt number a retry loop
 * runs its operation for, and the request a servlet filter serves. Both
 * live in thread-locals, as Go keeps them in the context and Node in an
 * AsyncLocalStorage: the operation is a plain {@code Callable}, so it can
 * only learn its attempt from where it runs. No servlet class here: Retry
 * uses it without jakarta.servlet on the class path.
 */
final class Layers {
  private Layers() {}

  static final String ATTEMPT = "Backstop-Attempt";
  static final String ENVOY_ATTEMPT = "X-Envoy-Attempt-Count";
  static final String NO_RETRY = "Backstop-No-Retry";
  static final String OVERLOADED = "X-Envoy-Overloaded";

  /** The last retry loop of a request that gave up, written by the loops, read by OneLayerFilter. */
  static final class GaveUp {
    private volatile String reason;

    String reason() {
      return reason;
    }
  }

  // The innermost loop's attempt on this thread; null outside any loop.
  private static final ThreadLocal<Integer> ATTEMPT_NOW = new ThreadLocal<>();
  // The request OneLayerFilter serves on this thread; null outside one.
  private static final ThreadLocal<GaveUp> REQUEST = new ThreadLocal<>();
  // The builders withAttemptHeaders set the headers on, with the names it
  // set: on the next attempt (or the next loop) those are its own to
  // overwrite, not the caller's. Weak: a builder is dropped with its user.
  private static final Map<HttpRequest.Builder, boolean[]> OURS =
      Collections.synchronizedMap(new WeakHashMap<>());

  static int attempt() {
    Integer n = ATTEMPT_NOW.get();
    return n == null ? 0 : n;
  }

  /** Runs op as attempt n of a loop (the caller's thread or the attempt thread), restoring the outer loop's attempt after. */
  static <T> T run(int n, GaveUp request, Callable<T> op) throws Exception {
    Integer prevAttempt = ATTEMPT_NOW.get();
    GaveUp prevRequest = REQUEST.get();
    ATTEMPT_NOW.set(n);
    REQUEST.set(request);
    try {
      return op.call();
    } finally {
      restore(ATTEMPT_NOW, prevAttempt);
      restore(REQUEST, prevRequest);
    }
  }

  static GaveUp request() {
    return REQUEST.get();
  }

  /** Serves a request on this thread: returns the one it replaces, for {@link #leave}. */
  static GaveUp enter(GaveUp g) {
    GaveUp prev = REQUEST.get();
    REQUEST.set(g);
    return prev;
  }

  static void leave(GaveUp prev) {
    restore(REQUEST, prev);
  }

  /** Tells the request served on this thread, if any, that a retry loop stopped for reason. */
  static void recordGaveUp(Decision.Reason reason) {
    GaveUp g = REQUEST.get();
    if (g != null) g.reason = reason.toString();
  }

  private static <V> void restore(ThreadLocal<V> t, V v) {
    if (v == null) t.remove();
    else t.set(v);
  }

  static Map<String, String> headers(int n) {
    String v = Integer.toString(check(n));
    Map<String, String> h = new LinkedHashMap<>();
    h.put(ATTEMPT, v);
    h.put(ENVOY_ATTEMPT, v);
    return Collections.unmodifiableMap(h);
  }

  static Map<String, String> grpcMetadata(int n) {
    Map<String, String> md = new LinkedHashMap<>();
    md.put("backstop-attempt", Integer.toString(check(n)));
    if (n > 1) md.put("grpc-previous-rpc-attempts", Integer.toString(n - 1));
    return Collections.unmodifiableMap(md);
  }

  private static int check(int n) {
    if (n < 1) throw new IllegalArgumentException("attempt " + n + ": an attempt number is 1 or more");
    return n;
  }

  static HttpRequest.Builder set(HttpRequest.Builder b) {
    int n = attempt();
    if (n < 1) return b;
    boolean[] ours;
    synchronized (OURS) {
      ours = OURS.get(b);
      if (ours == null) {
        HttpHeaders h = headersOf(b);
        ours = new boolean[] {h.firstValue(ATTEMPT).isEmpty(), h.firstValue(ENVOY_ATTEMPT).isEmpty()};
        OURS.put(b, ours);
      }
    }
    String v = Integer.toString(n);
    if (ours[0]) b.setHeader(ATTEMPT, v);
    if (ours[1]) b.setHeader(ENVOY_ATTEMPT, v);
    return b;
  }

  // The headers the caller put on b: a builder shows them only in what it
  // builds, and one without a URI yet cannot build (so has none of ours).
  private static HttpHeaders headersOf(HttpRequest.Builder b) {
    try {
      return b.copy().build().headers();
    } catch (IllegalStateException e) {
      return HttpHeaders.of(Map.of(), (k, v) -> true);
    }
  }

  static HttpRequest set(HttpRequest r) {
    int n = attempt();
    if (n < 1) return r;
    HttpHeaders h = r.headers();
    boolean a = h.firstValue(ATTEMPT).isEmpty();
    boolean e = h.firstValue(ENVOY_ATTEMPT).isEmpty();
    if (!a && !e) return r;
    // A copy: the caller's request stays as it is for the next attempt.
    HttpRequest.Builder b = HttpRequest.newBuilder(r, (k, v) -> true);
    String v = Integer.toString(n);
    if (a) b.setHeader(ATTEMPT, v);
    if (e) b.setHeader(ENVOY_ATTEMPT, v);
    return b.build();
  }
}
