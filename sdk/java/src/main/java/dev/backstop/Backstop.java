package dev.backstop;

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
}
