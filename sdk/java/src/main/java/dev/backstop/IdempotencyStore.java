package dev.backstop;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.RedisException;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.sync.RedisCommands;
import io.lettuce.core.codec.ByteArrayCodec;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * The server side of idempotency keys in Redis (Lettuce): one record per key,
 * every call one run of the contract's {@code idempotency.lua}, the script the
 * Go, Node.js and Python stores run, so a record one language stored is one
 * every other replays (testdata/idempotency pins what it answers). The
 * servlet {@link IdempotencyFilter} is built over it.
 *
 * <pre>{@code
 * IdempotencyStore store = IdempotencyStore.create(RedisClient.create("redis://127.0.0.1:6379"),
 *     IdempotencyStore.Options.defaults().withRetention(Duration.ofHours(24)));
 * }</pre>
 *
 * <p>A record lives at {@code <prefix>:{<scope>:<key>}}. Each call waits at
 * most the call timeout for Redis (5s, as Go's settle attempt); the
 * connection is the store's own (close the store to close it), the client
 * stays the caller's.
 */
public final class IdempotencyStore implements IdempotencyBackend, AutoCloseable {
  /** The longest key accepted, in bytes (Stripe's limit). */
  public static final int MAX_KEY_LENGTH = IdempotencyRules.MAX_KEY_LENGTH;

  /** What begin found under a key. */
  public enum State {
    /** The key was absent (or its owner's lease ran out): the caller owns it and must complete or fail. */
    STARTED,
    /** Another request holds the key: retry after {@link Claim#retryAfterSeconds()}. */
    IN_PROGRESS,
    /** {@link Claim#response()} is the first request's response. */
    COMPLETED,
    /** The key was used for a different request. */
    CONFLICT;

    /** The name the shared cases and the other languages use: started, in_progress, completed, conflict. */
    @Override
    public String toString() {
      return name().toLowerCase(java.util.Locale.ROOT);
    }
  }

  /**
   * A stored response: headers are the selected ones (name → values), as the
   * header rule ({@link #safeHeader}) has them.
   *
   * @param tooLarge the response was over the store's limit and was not kept: it cannot be replayed
   * @param truncated the client left before the response was finished: body is what was captured
   */
  public record Response(int status, Map<String, List<String>> headers, byte[] body, boolean tooLarge,
      boolean truncated) {
    public Response {
      headers = headers == null ? Map.of() : headers;
      body = body == null ? new byte[0] : body;
    }
  }

  /**
   * The answer of begin: token when STARTED (takenOver when the previous
   * owner's lease ran out), retryAfterSeconds when IN_PROGRESS, response when
   * COMPLETED.
   */
  public record Claim(State state, String token, boolean takenOver, long retryAfterSeconds, Response response) {}

  /** Thrown by complete and fail when the caller no longer owns the key; nothing was written. */
  public static final class LeaseLostException extends BackstopException {
    private static final long serialVersionUID = 1L;

    LeaseLostException(String message) {
      super(message);
    }
  }

  /** Thrown by {@link IdempotencyBackend#once} when the key was used for a different request. */
  public static final class ConflictException extends BackstopException {
    private static final long serialVersionUID = 1L;

    ConflictException(String key) {
      super("idempotency key " + Json.quote(new StringBuilder(), key) + " was used for a different request");
    }
  }

  /** Thrown by {@link IdempotencyBackend#once} while another call holds the key: retry after {@link #retryAfterSeconds()}. */
  public static final class InProgressException extends BackstopException {
    private static final long serialVersionUID = 1L;
    private final long retryAfterSeconds;

    InProgressException(String key, long retryAfterSeconds) {
      super("idempotency key " + Json.quote(new StringBuilder(), key) + " is in progress; retry after " + retryAfterSeconds + "s");
      this.retryAfterSeconds = retryAfterSeconds;
    }

    /** When the holder's lease ends, at the latest. */
    public long retryAfterSeconds() {
      return retryAfterSeconds;
    }
  }

  /** Thrown by {@link IdempotencyBackend#once} when the first result was over the store's limit: it was not kept and cannot be replayed. */
  public static final class TooLargeException extends BackstopException {
    private static final long serialVersionUID = 1L;

    TooLargeException(String key) {
      super("the first result for idempotency key " + Json.quote(new StringBuilder(), key) + " was too large to store");
    }
  }

  /**
   * The store's options: immutable, each {@code withX} returns a copy
   * (checked at once, naming the option). Defaults: prefix "idem", lease
   * 30s, retention 24h, bodies up to 1 MiB stored, 5s per call.
   */
  public static final class Options {
    final String prefix;
    final Duration lease;
    final Duration retention;
    final int maxBody;
    final Duration callTimeout;
    final PrometheusRegistry registry;

    private Options(String prefix, Duration lease, Duration retention, int maxBody, Duration callTimeout,
        PrometheusRegistry registry) {
      this.prefix = prefix;
      this.lease = lease;
      this.retention = retention;
      this.maxBody = maxBody;
      this.callTimeout = callTimeout;
      this.registry = registry;
    }

    /**
     * Counts into registry (prometheus-metrics-core, an optional dependency)
     * the backstop_idempotency_* families every language exports: requests by
     * outcome (the filter's), lease expiries, lost leases, store errors by
     * operation. Default: no metrics.
     */
    public Options withMetrics(PrometheusRegistry registry) {
      return new Options(prefix, lease, retention, maxBody, callTimeout, java.util.Objects.requireNonNull(registry, "registry"));
    }

    public static Options defaults() {
      return new Options("idem", Duration.ofSeconds(30), Duration.ofHours(24), 1 << 20, Duration.ofSeconds(5), null);
    }

    /** How long one store call waits for Redis before it fails (at least 1ms). */
    public Options withCallTimeout(Duration d) {
      if (d == null || d.toMillis() < 1) throw new IllegalArgumentException("idempotency: call timeout must be at least 1ms (got " + d + ")");
      return new Options(prefix, lease, retention, maxBody, d, registry);
    }

    /** The key prefix: non-empty, no braces. */
    public Options withPrefix(String prefix) {
      if (prefix == null || prefix.isEmpty() || prefix.contains("{") || prefix.contains("}")) {
        throw new IllegalArgumentException("idempotency: prefix must be non-empty without braces (got " + prefix + ")");
      }
      return new Options(prefix, lease, retention, maxBody, callTimeout, registry);
    }

    /** How long a started request owns its key before another may take it over (at least 1ms, at most the retention). */
    public Options withLease(Duration lease) {
      if (lease == null || lease.toMillis() < 1) throw new IllegalArgumentException("idempotency: lease must be at least 1ms (got " + lease + ")");
      if (retention.compareTo(lease) < 0) {
        throw new IllegalArgumentException("idempotency: lease must be at most the retention " + retention + " (got " + lease + ")");
      }
      return new Options(prefix, lease, retention, maxBody, callTimeout, registry);
    }

    /** How long a record is kept (at least the lease). */
    public Options withRetention(Duration retention) {
      if (retention == null || retention.compareTo(lease) < 0) {
        throw new IllegalArgumentException("idempotency: retention must be at least the lease " + lease + " (got " + retention + ")");
      }
      return new Options(prefix, lease, retention, maxBody, callTimeout, registry);
    }

    /** The largest response body stored; a larger one is recorded as too large to replay. */
    public Options withMaxBody(int maxBody) {
      if (maxBody < 0) throw new IllegalArgumentException("idempotency: max body must not be negative (got " + maxBody + ")");
      return new Options(prefix, lease, retention, maxBody, callTimeout, registry);
    }

    public Duration lease() {
      return lease;
    }
  }

  private final StatefulRedisConnection<byte[], byte[]> conn;
  private final RedisCommands<byte[], byte[]> cmds;
  final Options options;
  final IdempotencyMetrics metrics; // null: none

  private IdempotencyStore(StatefulRedisConnection<byte[], byte[]> conn, Options options) {
    this.conn = conn;
    this.cmds = conn.sync();
    this.options = options;
    this.metrics = options.registry == null ? null : IdempotencyMetrics.on(options.registry);
  }

  void count(java.util.function.Consumer<IdempotencyMetrics> f) {
    if (metrics != null) f.accept(metrics);
  }

  @Override
  public Duration lease() {
    return options.lease;
  }

  @Override
  public void countRequest(String outcome) {
    count(m -> m.request(outcome));
  }

  /** A store over a connection of its own to client. */
  public static IdempotencyStore create(RedisClient client, Options options) {
    Objects.requireNonNull(client, "client");
    StatefulRedisConnection<byte[], byte[]> conn = client.connect(ByteArrayCodec.INSTANCE);
    conn.setTimeout(options.callTimeout);
    return new IdempotencyStore(conn, Objects.requireNonNull(options, "options"));
  }

  public Options options() {
    return options;
  }

  /** The Redis key of key within scope. */
  public String recordKey(String scope, String key) {
    return options.prefix + ":{" + scope + ":" + key + "}";
  }

  /** Why key cannot be an idempotency key (1..255 printable ASCII characters), or null. */
  public static String checkKey(String key) {
    return IdempotencyRules.checkKey(key);
  }

  /** The request hash every adapter stores beside a key: SHA-256 (hex) of method, "\n", path, "\n", body. */
  public static String fingerprint(String method, String path, byte[] body) {
    return IdempotencyRules.fingerprint(method, path, body);
  }

  /**
   * The request hash of a request as it arrived: {@code rawPath} (the servlet's {@code
   * getRequestURI()}: no query, escapes as sent) with every {@code %XX} escape decoded to its
   * byte, as Go's {@code r.URL.Path}, so every adapter hashes a request alike
   * ({@code testdata/idempotency/requests.json}); a {@code %} without two hex digits stays.
   */
  public static String requestHash(String method, String rawPath, byte[] body) {
    return IdempotencyRules.requestHash(method, rawPath, body);
  }

  /**
   * Claims key (within scope) for a request whose fingerprint is request.
   *
   * @throws IllegalArgumentException for a key {@link #checkKey} refuses
   * @throws RedisException when Redis fails or does not answer within the call timeout
   */
  @Override
  public Claim begin(String scope, String key, String request) {
    String bad = checkKey(key);
    if (bad != null) throw new IllegalArgumentException(bad);
    String token = newToken();
    List<Object> r;
    try {
      r = RedisQueue.script(cmds, "idempotency", List.of(recordKey(scope, key)),
          List.of("begin", token, request, options.lease.toMillis(), options.retention.toMillis()));
    } catch (RuntimeException e) {
      count(m -> m.storeError("begin"));
      throw e;
    }
    String state = r.isEmpty() ? "" : text(r.get(0));
    switch (state) {
      case "started":
        if (num(r.get(1)) == 1) count(IdempotencyMetrics::leaseExpiry);
        return new Claim(State.STARTED, token, num(r.get(1)) == 1, 0, null);
      case "in_progress":
        return new Claim(State.IN_PROGRESS, null, false, num(r.get(1)), null);
      case "conflict":
        return new Claim(State.CONFLICT, null, false, 0, null);
      case "completed":
        if (r.size() == 6) {
          int status;
          try {
            status = Integer.parseInt(text(r.get(1)));
          } catch (NumberFormatException e) {
            status = 0;
          }
          return new Claim(State.COMPLETED, null, false, 0, new Response(status, IdempotencyRules.decodeHeaders(text(r.get(2))),
              Base64.getDecoder().decode(text(r.get(3))), num(r.get(4)) == 1, num(r.get(5)) == 1));
        }
        break;
      default:
    }
    throw new IllegalStateException("idempotency: begin " + key + ": unexpected reply " + r);
  }

  /**
   * Stores resp as the key's response; only the owner (token from begin)
   * may. A body over the limit is stored as too large. Headers are stored as
   * {@link #safeHeader} has them (a name that is not a token is dropped).
   *
   * @throws LeaseLostException when the caller no longer owns the key
   */
  @Override
  public void complete(String scope, String key, String token, Response resp) {
    boolean large = resp.tooLarge() || resp.body().length > options.maxBody;
    List<Object> argv = List.of("complete", token, Integer.toString(resp.status()),
        large ? "" : IdempotencyRules.encodeHeaders(IdempotencyRules.safeHeaders(resp.headers())),
        large ? "" : Base64.getEncoder().encodeToString(resp.body()), large ? "1" : "0",
        options.retention.toMillis(), resp.truncated() ? "1" : "0");
    owner("complete", key, () -> RedisQueue.script(cmds, "idempotency", List.of(recordKey(scope, key)), argv));
  }

  /**
   * Releases the key so that a retry may run; only the owner may.
   *
   * @throws LeaseLostException when the caller no longer owns the key
   */
  @Override
  public void fail(String scope, String key, String token) {
    owner("fail", key, () -> RedisQueue.script(cmds, "idempotency", List.of(recordKey(scope, key)), List.of("fail", token)));
  }

  private void owner(String op, String key, Runnable call) {
    try {
      call.run();
    } catch (RedisCommandExecutionException e) {
      if (e.getMessage() != null && e.getMessage().contains("backstop idempotency: lease lost")) {
        count(IdempotencyMetrics::leaseLost);
        throw new LeaseLostException("idempotency: " + op + " " + key + ": lease lost: " + e.getMessage());
      }
      count(m -> m.storeError(op));
      throw e;
    } catch (RuntimeException e) {
      count(m -> m.storeError(op));
      throw e;
    }
  }

  @Override
  public void close() {
    conn.close();
  }

  static String newToken() {
    return IdempotencyRules.newToken();
  }

  private static String text(Object v) {
    return v instanceof byte[] ? new String((byte[]) v, StandardCharsets.UTF_8) : String.valueOf(v);
  }

  private static long num(Object v) {
    if (v instanceof Long) return (Long) v;
    return Long.parseLong(text(v));
  }

  /**
   * The header rule every adapter applies when it stores a response and
   * again when it replays one (Go idempotency.SafeHeader, Node safeHeader,
   * Python _safe_header): null when name is not an RFC 9110 token (not
   * stored); else value with leading and trailing blanks trimmed and each
   * byte of its UTF-8 outside 0x21–0x7E written %XX, except a single space
   * or tab between two other bytes. "/orders/€42" becomes
   * "/orders/%E2%82%AC42"; visible ASCII is unchanged.
   */
  public static String safeHeader(String name, String value) {
    return IdempotencyRules.safeHeader(name, value);
  }
}
