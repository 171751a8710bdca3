package dev.backstop;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

/**
 * One failed attempt, as the policy sees it: the fields of the vectors'
 * {@code input} object ({@code testdata/vectors/README.md}). Immutable; make
 * one with {@link #builder()}:
 *
 * <pre>{@code
 * Failure f = Failure.builder().attempt(1).httpStatus(503).retryAfter("7")
 *     .method("POST").idempotencyKey("order-42").elapsedMs(120).build();
 * }</pre>
 *
 * <p>An unset {@code nowMs} is the host's clock ({@code System.currentTimeMillis()})
 * and an unset {@code random} a uniform draw in [0, 1) at {@code decide}:
 * hosts own time and randomness. Every other unset field is 0 or absent.
 * Strings are sent as UTF-8 (a lone surrogate as U+FFFD), at most 65535
 * bytes each.
 */
public final class Failure {
  static final int MAX_STRING = 0xffff;
  static final byte[] EMPTY = new byte[0];

  final long attempt;
  final int httpStatus;
  final int grpcCode;
  final byte[] errorKind;
  final byte[] retryAfter;
  final byte[] pushback;
  final byte[] method;
  final boolean idempotencyKey;
  final long elapsedMs;
  final Long nowMs;
  final Double random;
  final long prevDelayMs;
  final boolean retriedDownstream;
  final boolean serverDeclined;

  private Failure(Builder b) {
    attempt = b.attempt;
    httpStatus = b.httpStatus;
    grpcCode = b.grpcCode;
    errorKind = b.errorKind;
    retryAfter = b.retryAfter;
    pushback = b.pushback;
    method = b.method;
    idempotencyKey = b.idempotencyKey;
    elapsedMs = b.elapsedMs;
    nowMs = b.nowMs;
    random = b.random;
    prevDelayMs = b.prevDelayMs;
    retriedDownstream = b.retriedDownstream;
    serverDeclined = b.serverDeclined;
  }

  /** A builder with every field unset. */
  public static Builder builder() {
    return new Builder();
  }

  /** A builder with this failure's fields, to change some. */
  public Builder toBuilder() {
    Builder b = new Builder();
    b.attempt = attempt;
    b.httpStatus = httpStatus;
    b.grpcCode = grpcCode;
    b.errorKind = errorKind;
    b.retryAfter = retryAfter;
    b.pushback = pushback;
    b.method = method;
    b.idempotencyKey = idempotencyKey;
    b.elapsedMs = elapsedMs;
    b.nowMs = nowMs;
    b.random = random;
    b.prevDelayMs = prevDelayMs;
    b.retriedDownstream = retriedDownstream;
    b.serverDeclined = serverDeclined;
    return b;
  }

  public long attempt() {
    return attempt;
  }

  public int httpStatus() {
    return httpStatus;
  }

  public int grpcCode() {
    return grpcCode;
  }

  public String errorKind() {
    return new String(errorKind, StandardCharsets.UTF_8);
  }

  public String retryAfter() {
    return new String(retryAfter, StandardCharsets.UTF_8);
  }

  public String grpcRetryPushbackMs() {
    return new String(pushback, StandardCharsets.UTF_8);
  }

  public String method() {
    return new String(method, StandardCharsets.UTF_8);
  }

  public boolean hasIdempotencyKey() {
    return idempotencyKey;
  }

  public long elapsedMs() {
    return elapsedMs;
  }

  public long prevDelayMs() {
    return prevDelayMs;
  }

  public boolean retriedDownstream() {
    return retriedDownstream;
  }

  public boolean serverDeclined() {
    return serverDeclined;
  }

  @Override
  public String toString() {
    return "Failure{attempt=" + attempt + ", httpStatus=" + httpStatus + ", grpcCode=" + grpcCode + ", errorKind="
        + errorKind() + ", retryAfter=" + retryAfter() + ", method=" + method() + ", idempotencyKey=" + idempotencyKey
        + ", elapsedMs=" + elapsedMs + ", nowMs=" + nowMs + ", random=" + random + ", prevDelayMs=" + prevDelayMs + "}";
  }

  /**
   * Builds a {@link Failure}. Setters check what the host checks (a string
   * longer than 65535 UTF-8 bytes is an {@link InputException} at once); the
   * module checks ranges at {@code decide}.
   */
  public static final class Builder {
    private long attempt;
    private int httpStatus;
    private int grpcCode;
    private byte[] errorKind = EMPTY;
    private byte[] retryAfter = EMPTY;
    private byte[] pushback = EMPTY;
    private byte[] method = EMPTY;
    private boolean idempotencyKey;
    private long elapsedMs;
    private Long nowMs;
    private Double random;
    private long prevDelayMs;
    private boolean retriedDownstream;
    private boolean serverDeclined;

    private Builder() {}

    /** The 1-based number of the execution that just failed (the first is 1). */
    public Builder attempt(long attempt) {
      this.attempt = attempt;
      return this;
    }

    /** The response status; 0 (the default) when none. */
    public Builder httpStatus(int status) {
      this.httpStatus = status;
      return this;
    }

    /** The gRPC status code 1..16; 0 (the default) when none. */
    public Builder grpcCode(int code) {
      this.grpcCode = code;
      return this;
    }

    /** The gRPC status by name, in any ASCII letter case ({@code "UNAVAILABLE"}). */
    public Builder grpcCode(String name) {
      this.grpcCode = FailureReader.grpcCode(name);
      return this;
    }

    /** An error kind: {@code timeout}, {@code connection_refused}, … or one the policy's table knows. */
    public Builder errorKind(String kind) {
      this.errorKind = bytes(kind, "error_kind");
      return this;
    }

    /** The raw {@code Retry-After} header: delta-seconds or an HTTP-date. */
    public Builder retryAfter(String value) {
      this.retryAfter = bytes(value, "retry_after");
      return this;
    }

    /** The raw {@code grpc-retry-pushback-ms} value; used only without {@code retryAfter}. */
    public Builder grpcRetryPushbackMs(String value) {
      this.pushback = bytes(value, "grpc_retry_pushback_ms");
      return this;
    }

    /** The HTTP method; absent when not HTTP. */
    public Builder method(String method) {
      this.method = bytes(method, "method");
      return this;
    }

    /** The request's idempotency key: present when not null and not empty. */
    public Builder idempotencyKey(String key) {
      this.idempotencyKey = key != null && !key.isEmpty();
      return this;
    }

    /** Whether the request carries an idempotency key. */
    public Builder idempotencyKey(boolean present) {
      this.idempotencyKey = present;
      return this;
    }

    /** The time since the first execution started, in ms. */
    public Builder elapsedMs(long ms) {
      this.elapsedMs = ms;
      return this;
    }

    /** The current Unix time in ms; unset, the host's clock at decide. */
    public Builder nowMs(long ms) {
      this.nowMs = ms;
      return this;
    }

    /** The jitter draw in [0, 1) (out-of-range values are clamped); unset, a uniform draw at decide. */
    public Builder random(double random) {
      this.random = random;
      return this;
    }

    /** The previous delay in ms (the decorrelated strategy). */
    public Builder prevDelayMs(long ms) {
      this.prevDelayMs = ms;
      return this;
    }

    /** A layer below already retried this failure and gave up (docs/layers.md). */
    public Builder retriedDownstream(boolean v) {
      this.retriedDownstream = v;
      return this;
    }

    /** The server asked not to be retried ({@code X-Envoy-Overloaded}). */
    public Builder serverDeclined(boolean v) {
      this.serverDeclined = v;
      return this;
    }

    public Failure build() {
      return new Failure(this);
    }

    Builder rawErrorKind(byte[] b) {
      this.errorKind = b;
      return this;
    }

    Builder rawRetryAfter(byte[] b) {
      this.retryAfter = b;
      return this;
    }

    Builder rawPushback(byte[] b) {
      this.pushback = b;
      return this;
    }

    Builder rawMethod(byte[] b) {
      this.method = b;
      return this;
    }

    Builder nowMsOrClock(Long ms) {
      this.nowMs = ms;
      return this;
    }

    Builder randomOrDraw(Double r) {
      this.random = r;
      return this;
    }
  }

  private static byte[] bytes(String s, String field) {
    if (s == null || s.isEmpty()) return EMPTY;
    byte[] b = utf8(s);
    if (b.length > MAX_STRING) {
      throw new InputException(field, "must be at most " + MAX_STRING + " bytes (got " + b.length + ")");
    }
    return b;
  }

  /** s as UTF-8, a lone surrogate as U+FFFD (String.getBytes would write '?'). */
  static byte[] utf8(String s) {
    boolean ascii = true;
    boolean lone = false;
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (c >= 0x80) ascii = false;
      if (Character.isHighSurrogate(c) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))) {
        i++;
      } else if (Character.isSurrogate(c)) {
        lone = true;
      }
    }
    if (ascii) return s.getBytes(StandardCharsets.ISO_8859_1);
    if (!lone) return s.getBytes(StandardCharsets.UTF_8);
    StringBuilder b = new StringBuilder(s.length());
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (Character.isHighSurrogate(c) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))) {
        b.append(c).append(s.charAt(++i));
      } else {
        b.append(Character.isSurrogate(c) ? '\ufffd' : c);
      }
    }
    return b.toString().getBytes(StandardCharsets.UTF_8);
  }

  /**
   * Reads a failure value with the vectors' snake_case names, by the rules
   * every host follows ({@code testdata/vectors/README.md}, "Field values"):
   * integers as {@code Long}, {@code Integer}, {@code BigInteger} or integral
   * {@code Double}; strings as {@code String} or {@code byte[]}; a hint may
   * be a number; {@code null} is absent. The value of a parsed JSON object
   * (the vectors' {@code input}) reads as it is.
   *
   * @throws InputException naming the first invalid field, in every host's order
   */
  public static Failure fromMap(Map<String, ?> fields) {
    return FailureReader.read(fields, null, null);
  }

  /**
   * The rules of {@link #fromMap}, shared by the command ({@link Main}),
   * which reads an absent {@code now_ms} as 0 and an absent {@code random}
   * as its {@code --random}.
   */
  static final class FailureReader {
    static final Set<String> FIELDS = Set.of("attempt", "http_status", "grpc_code", "error_kind", "retry_after",
        "grpc_retry_pushback_ms", "method", "idempotency_key", "elapsed_ms", "now_ms", "random", "prev_delay_ms",
        "retried_downstream", "server_declined");
    static final List<String> GRPC_NAMES = List.of("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
        "UNAUTHENTICATED");
    private static final double TWO63 = 9223372036854775808.0;

    private FailureReader() {}

    /** Reads v; an absent now_ms is absentNow (null: the clock), an absent random absentRandom (null: a draw). */
    static Failure read(Object v, Long absentNow, Double absentRandom) {
      if (!(v instanceof Map)) throw new InputException("failure", "must be an object (got " + describe(v) + ")");
      Map<?, ?> m = (Map<?, ?>) v;
      String unknown = null;
      for (Object k : m.keySet()) {
        String name = String.valueOf(k);
        if (FIELDS.contains(name)) continue;
        String u = wellFormed(name);
        if (unknown == null || codePointLess(u, unknown)) unknown = u;
      }
      if (unknown != null) throw new InputException(unknown, "unknown field");
      Builder b = builder();
      b.attempt(int64(m.get("attempt"), "attempt", false));
      b.httpStatus(int32(m.get("http_status"), "http_status", "must be a 32-bit integer"));
      Object g = m.get("grpc_code");
      b.grpcCode(g instanceof String ? grpcCode((String) g)
          : int32(g, "grpc_code", "must be a 32-bit integer or a status name"));
      b.rawErrorKind(string(m.get("error_kind"), "error_kind"));
      b.rawRetryAfter(hint(m.get("retry_after"), "retry_after"));
      b.rawPushback(hint(m.get("grpc_retry_pushback_ms"), "grpc_retry_pushback_ms"));
      b.rawMethod(string(m.get("method"), "method"));
      b.idempotencyKey(key(m.get("idempotency_key")));
      b.elapsedMs(int64(m.get("elapsed_ms"), "elapsed_ms", true));
      Object now = m.get("now_ms");
      b.nowMsOrClock(now == null ? absentNow : Long.valueOf(int64(now, "now_ms", true)));
      Object r = m.get("random");
      b.randomOrDraw(r == null ? absentRandom : Double.valueOf(random(r)));
      b.prevDelayMs(int64(m.get("prev_delay_ms"), "prev_delay_ms", true));
      b.retriedDownstream(flag(m.get("retried_downstream"), "retried_downstream"));
      b.serverDeclined(flag(m.get("server_declined"), "server_declined"));
      return b.build();
    }

    static int grpcCode(String name) {
      boolean ascii = name.chars().allMatch(c -> c < 0x80);
      int code = ascii ? GRPC_NAMES.indexOf(name.toUpperCase(Locale.ROOT)) : -1;
      if (code < 0) throw new InputException("grpc_code", "unknown gRPC status name " + quote(name));
      return code;
    }

    private static long int64(Object v, String field, boolean truncate) {
      if (v == null) return 0;
      if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) {
        return ((Number) v).longValue();
      }
      if (v instanceof BigInteger) {
        BigInteger b = (BigInteger) v;
        if (b.bitLength() > 63) throw new InputException(field, "must fit in 64 bits (got " + b + ")");
        return b.longValue();
      }
      if (v instanceof Double || v instanceof Float) {
        double d = ((Number) v).doubleValue();
        if (!Double.isFinite(d) || (!truncate && d != Math.rint(d))) {
          throw new InputException(field, "must be an integer (got " + describe(v) + ")");
        }
        double t = d < 0 ? Math.ceil(d) : Math.floor(d);
        if (t >= TWO63 || t < -TWO63) throw new InputException(field, "must fit in 64 bits (got " + describe(v) + ")");
        return (long) t;
      }
      throw new InputException(field, "must be an integer (got " + describe(v) + ")");
    }

    private static int int32(Object v, String field, String reason) {
      if (v == null) return 0;
      if (v instanceof Integer || v instanceof Short || v instanceof Byte) return ((Number) v).intValue();
      if (v instanceof Long) {
        long l = (Long) v;
        if (l == (int) l) return (int) l;
      } else if (v instanceof BigInteger) {
        BigInteger b = (BigInteger) v;
        if (b.bitLength() <= 31) return b.intValue();
      } else if (v instanceof Double || v instanceof Float) {
        double d = ((Number) v).doubleValue();
        if (d == (int) d) return (int) d;
      }
      throw new InputException(field, reason + " (got " + describe(v) + ")");
    }

    private static byte[] string(Object v, String field) {
      if (v == null) return EMPTY;
      byte[] b;
      if (v instanceof String) {
        b = utf8((String) v);
      } else if (v instanceof byte[]) {
        b = (byte[]) v;
      } else {
        throw new InputException(field, "must be a string (got " + describe(v) + ")");
      }
      if (b.length > MAX_STRING) {
        throw new InputException(field, "must be at most " + MAX_STRING + " bytes (got " + b.length + ")");
      }
      return b;
    }

    // A hint: a string or bytes, or a number written as the integer it
    // rounds up to ("NaN", "Infinity", "-Infinity" stay malformed).
    private static byte[] hint(Object v, String field) {
      if (v instanceof Double || v instanceof Float) {
        double d = ((Number) v).doubleValue();
        if (Double.isNaN(d)) return string("NaN", field);
        if (Double.isInfinite(d)) return string(d > 0 ? "Infinity" : "-Infinity", field);
        return string(new BigDecimal(Math.ceil(d)).toBigInteger().toString(), field);
      }
      if (v instanceof Long || v instanceof Integer || v instanceof BigInteger || v instanceof Short
          || v instanceof Byte) {
        return string(v.toString(), field);
      }
      if (v instanceof Boolean || v instanceof Map || v instanceof List) {
        throw new InputException(field, "must be a string or a number (got " + describe(v) + ")");
      }
      return string(v, field);
    }

    private static boolean key(Object v) {
      if (v == null || Boolean.FALSE.equals(v)) return false;
      if (Boolean.TRUE.equals(v)) return true;
      if (v instanceof String) return !((String) v).isEmpty();
      if (v instanceof byte[]) return ((byte[]) v).length > 0;
      throw new InputException("idempotency_key", "must be a string or a boolean (got " + describe(v) + ")");
    }

    private static double random(Object v) {
      if (v instanceof Number && !(v instanceof BigDecimal)) return ((Number) v).doubleValue();
      if (v instanceof BigDecimal) return ((BigDecimal) v).doubleValue();
      if ("NaN".equals(v)) return Double.NaN;
      if ("Infinity".equals(v) || "+Infinity".equals(v)) return Double.POSITIVE_INFINITY;
      if ("-Infinity".equals(v)) return Double.NEGATIVE_INFINITY;
      throw new InputException("random",
          "must be a number, \"NaN\", \"Infinity\" or \"-Infinity\" (got " + describe(v) + ")");
    }

    private static boolean flag(Object v, String field) {
      if (v == null || Boolean.FALSE.equals(v)) return false;
      if (Boolean.TRUE.equals(v)) return true;
      throw new InputException(field, "must be a boolean (got " + describe(v) + ")");
    }

    /**
     * How a message shows a value of the wrong type or range, as every host
     * does: true, false, null, a number as JavaScript's String() prints it,
     * an integer in full, or "a string", "bytes", "an array", "an object".
     */
    static String describe(Object v) {
      if (v == null) return "null";
      if (v instanceof Boolean || v instanceof Long || v instanceof Integer || v instanceof BigInteger
          || v instanceof Short || v instanceof Byte) {
        return v.toString();
      }
      if (v instanceof Double || v instanceof Float) return esFormat(((Number) v).doubleValue());
      if (v instanceof String) return "a string";
      if (v instanceof byte[]) return "bytes";
      if (v instanceof List || v instanceof Object[]) return "an array";
      return "an object";
    }

    /** s as a JSON string, as every host's messages quote it. */
    static String quote(String s) {
      return Json.quote(new StringBuilder(), s).toString();
    }

    static String wellFormed(String s) {
      StringBuilder b = null;
      for (int i = 0; i < s.length(); i++) {
        char c = s.charAt(i);
        if (Character.isHighSurrogate(c) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))) {
          if (b != null) b.append(c).append(s.charAt(i + 1));
          i++;
        } else if (Character.isSurrogate(c)) {
          if (b == null) b = new StringBuilder(s.substring(0, i));
          b.append('\ufffd');
        } else if (b != null) {
          b.append(c);
        }
      }
      return b == null ? s : b.toString();
    }

    /** a < b in code point order, as Go and Python compare strings. */
    static boolean codePointLess(String a, String b) {
      int i = 0;
      int j = 0;
      while (i < a.length() && j < b.length()) {
        int x = a.codePointAt(i);
        int y = b.codePointAt(j);
        if (x != y) return x < y;
        i += Character.charCount(x);
        j += Character.charCount(y);
      }
      return a.length() - i < b.length() - j;
    }

    /**
     * A double as JavaScript's Number.prototype.toString writes it: the
     * shortest digits that read back as the same double, in ECMAScript's
     * layout (1e+21, 1.5e-7, 0.000001, 123).
     */
    static String esFormat(double d) {
      if (Double.isNaN(d)) return "NaN";
      if (Double.isInfinite(d)) return d > 0 ? "Infinity" : "-Infinity";
      if (d == 0) return "0";
      String sign = d < 0 ? "-" : "";
      double a = Math.abs(d);
      String digits = null;
      int exp = 0;
      // The exact value rounded to p digits (String.format would round
      // Double.toString's digits, which on Java 17 are not always the
      // shortest: a double rounding), for the least p that reads back.
      BigDecimal exact = new BigDecimal(a);
      for (int p = 1; p <= 17; p++) {
        BigDecimal r = exact.round(new java.math.MathContext(p, java.math.RoundingMode.HALF_EVEN));
        if (r.doubleValue() == a) {
          BigDecimal t = r.stripTrailingZeros();
          digits = t.unscaledValue().toString();
          exp = digits.length() - 1 - t.scale();
          break;
        }
      }
      int k = digits.length();
      int n = exp + 1; // the decimal point's position
      StringBuilder b = new StringBuilder(sign);
      if (k <= n && n <= 21) {
        b.append(digits);
        for (int i = 0; i < n - k; i++) b.append('0');
      } else if (0 < n && n <= 21) {
        b.append(digits, 0, n).append('.').append(digits, n, k);
      } else if (-6 < n && n <= 0) {
        b.append("0.");
        for (int i = 0; i < -n; i++) b.append('0');
        b.append(digits);
      } else {
        b.append(digits.charAt(0));
        if (k > 1) b.append('.').append(digits, 1, k);
        b.append('e').append(n - 1 >= 0 ? "+" : "-").append(Math.abs(n - 1));
      }
      return b.toString();
    }
  }
}
