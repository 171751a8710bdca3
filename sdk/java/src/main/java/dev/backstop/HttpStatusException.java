package dev.backstop;

import java.net.http.HttpResponse;
import java.util.Optional;

/**
 * A failed HTTP call, as the retry loop classifies it: the status, and the
 * raw {@code Retry-After} value when the response had one. Throw one from
 * the operation given to {@link Backstop#retry} to say "the downstream
 * answered 503 with Retry-After: 7"; a {@link HttpResponse} returned with a
 * status of 400 or more is read the same way, headers included.
 */
public class HttpStatusException extends java.io.IOException {
  private static final long serialVersionUID = 1L;

  private final int status;
  private final String retryAfter;
  private final boolean retriedDownstream;
  private final boolean serverDeclined;

  /** A failed call with this status and no Retry-After. */
  public HttpStatusException(int status) {
    this(status, null);
  }

  /** A failed call with this status and raw Retry-After value (null or "" when none). */
  public HttpStatusException(int status, String retryAfter) {
    this(status, retryAfter, false, false);
  }

  private HttpStatusException(int status, String retryAfter, boolean retriedDownstream, boolean serverDeclined) {
    super("HTTP " + status);
    this.status = status;
    this.retryAfter = retryAfter == null || retryAfter.isEmpty() ? null : retryAfter;
    this.retriedDownstream = retriedDownstream;
    this.serverDeclined = serverDeclined;
  }

  /**
   * The failure of a response: its status, Retry-After, and the signals of
   * the layers around it ({@code Backstop-No-Retry}: a layer below retried
   * and gave up; {@code X-Envoy-Overloaded}: do not retry; docs/layers.md).
   */
  public static HttpStatusException of(HttpResponse<?> response) {
    var h = response.headers();
    return new HttpStatusException(response.statusCode(), h.firstValue("Retry-After").orElse(null),
        present(h.firstValue("Backstop-No-Retry")), present(h.firstValue("X-Envoy-Overloaded")));
  }

  private static boolean present(Optional<String> v) {
    return v.isPresent() && !v.get().isEmpty(); // an empty value is absent, as Go's Header.Get reads it
  }

  public int status() {
    return status;
  }

  public Optional<String> retryAfter() {
    return Optional.ofNullable(retryAfter);
  }

  /** The fields of this failure. */
  Failure.Builder describe() {
    Failure.Builder b = Failure.builder().httpStatus(status).retriedDownstream(retriedDownstream)
        .serverDeclined(serverDeclined);
    if (retryAfter != null) b.retryAfter(retryAfter);
    return b;
  }
}
