package dev.backstop;

import java.net.http.HttpRequest;
import java.util.Map;
import java.util.concurrent.Callable;

/**
 * The retry loop: run an operation until it succeeds or the policy says
 * stop.
 *
 * <pre>{@code
 * Policy policy = Policy.preset("default");
 * String body = Backstop.retry(policy, () -> fetchOrder(42));
 * // with options:
 * HttpResponse<String> r = Backstop.retrying(policy).withMethod("POST").withIdempotencyKey(key)
 *     .call(() -> client.send(request, BodyHandlers.ofString()));
 * }</pre>
 *
 * <p>Each failure (an exception, or a {@code java.net.http.HttpResponse}
 * with a status of 400 or more) is classified: {@link HttpStatusException}
 * and responses by status and {@code Retry-After}; IOExceptions and
 * timeouts by the shared table contract/errorkinds.json (its "java" rows:
 * {@code SocketTimeoutException} → timeout, {@code ConnectException} →
 * connection_refused, {@code UnknownHostException} → dns_not_found, other
 * {@code SocketException}s → connection_reset, …). The policy decides; the
 * loop sleeps the decided delay (Retry-After honoured as a floor) and tries
 * again, or throws a {@link RetryException} that keeps the reason, the
 * attempts and the last error. A stateful policy's circuit breaker is asked
 * before each call, and each attempt is bounded by the policy's
 * {@code attempt_timeout}.
 *
 * <p>Retry at one layer (docs/layers.md): inside the operation,
 * {@link #attempt()} is the attempt number, and
 * {@link #withAttemptHeaders(HttpRequest.Builder)} puts it on the request
 * ({@code Backstop-Attempt}, {@code X-Envoy-Attempt-Count}) so the server
 * sees retries; a response with {@code Backstop-No-Retry} or
 * {@code X-Envoy-Overloaded} stops the loop, and {@link OneLayerFilter}
 * answers for a servlet whose own loops gave up.
 */
public final class Backstop {
  private Backstop() {}

  /**
   * Runs op under policy with the default options (see {@link Retry}).
   *
   * @return what op returned on its first success
   * @throws RetryException when the policy says stop
   * @throws InterruptedException when the thread is interrupted while waiting
   */
  public static <T> T retry(Policy policy, Callable<T> op) throws InterruptedException {
    return retrying(policy).call(op);
  }

  /** The retry loop of policy, to set options on and then {@link Retry#call}. */
  public static Retry retrying(Policy policy) {
    return new Retry(policy);
  }

  /** The header carrying the attempt number (1 for the first call). */
  public static final String ATTEMPT_HEADER = Layers.ATTEMPT;
  /** Envoy's name for it. */
  public static final String ENVOY_ATTEMPT_HEADER = Layers.ENVOY_ATTEMPT;
  /** On a response: a layer below decided the failure (the value says why it stopped); do not retry it. */
  public static final String NO_RETRY_HEADER = Layers.NO_RETRY;
  /** On a response: Envoy's "do not retry", the server sheds load. */
  public static final String OVERLOADED_HEADER = Layers.OVERLOADED;

  /**
   * The attempt number (1 for the first call) the innermost retry loop on
   * this thread runs its operation for, 0 outside one. A thread-local, as
   * the operation is a plain {@code Callable}: the loop sets it around each
   * attempt, on the attempt's own thread when attempt_timeout bounds it; an
   * operation that hands the call to another thread passes the number
   * itself ({@link #attemptHeaders(int)}).
   */
  public static int attempt() {
    return Layers.attempt();
  }

  /** The HTTP headers of this thread's attempt ({@link #attempt()}), none outside a retry loop. */
  public static Map<String, String> attemptHeaders() {
    int n = Layers.attempt();
    return n < 1 ? Map.of() : Layers.headers(n);
  }

  /** The HTTP headers of attempt n: {@code Backstop-Attempt} and {@code X-Envoy-Attempt-Count}, both n. */
  public static Map<String, String> attemptHeaders(int n) {
    return Layers.headers(n);
  }

  /** The gRPC metadata of this thread's attempt ({@link #attempt()}), none outside a retry loop. */
  public static Map<String, String> grpcAttemptMetadata() {
    int n = Layers.attempt();
    return n < 1 ? Map.of() : Layers.grpcMetadata(n);
  }

  /**
   * The gRPC metadata of attempt n: {@code backstop-attempt} n, and on a
   * retry (n > 1) {@code grpc-previous-rpc-attempts} n - 1, as gRPC's own
   * retries send it.
   */
  public static Map<String, String> grpcAttemptMetadata(int n) {
    return Layers.grpcMetadata(n);
  }

  /**
   * Sets the attempt headers of this thread's attempt on b and returns b;
   * outside a retry loop it changes nothing. A header the caller set on b
   * is left as it is; a builder used again for the next attempt (or another
   * loop) gets the new number.
   */
  public static HttpRequest.Builder withAttemptHeaders(HttpRequest.Builder b) {
    return Layers.set(b);
  }

  /**
   * A copy of request with the attempt headers of this thread's attempt
   * (request itself outside a retry loop, or when it has both): build the
   * request once, send {@code withAttemptHeaders(request)} in each attempt.
   * A header the request has is left as it is.
   */
  public static HttpRequest withAttemptHeaders(HttpRequest request) {
    return Layers.set(request);
  }
}
