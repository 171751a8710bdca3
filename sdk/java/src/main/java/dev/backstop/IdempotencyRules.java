package dev.backstop;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;

/**
 * What every idempotency store and the filter share, without a client: the
 * key rule, the request hash, the owner's token, the header rule and the
 * stored headers' JSON. Apart from {@link IdempotencyStore} (which imports
 * Lettuce) so that PgIdempotencyStore and IdempotencyFilter run without
 * lettuce-core on the classpath; IdempotencyStore's public statics delegate
 * here.
 */
final class IdempotencyRules {
  static final int MAX_KEY_LENGTH = 255;

  private static final SecureRandom RANDOM = new SecureRandom();
  private static final Set<String> DROPPED = ConcurrentHashMap.newKeySet();

  private IdempotencyRules() {}

  /** Why key cannot be an idempotency key (1..255 printable ASCII characters), or null. */
  static String checkKey(String key) {
    if (key == null || key.isEmpty()) return "idempotency: key must not be empty";
    if (key.length() > MAX_KEY_LENGTH) {
      return "idempotency: key must be at most " + MAX_KEY_LENGTH + " bytes, got " + key.getBytes(StandardCharsets.UTF_8).length;
    }
    for (int i = 0; i < key.length(); i++) {
      char c = key.charAt(i);
      if (c < 0x20 || c > 0x7e) return "idempotency: key must be printable ASCII, character " + i + " is " + String.format("%#x", (int) c);
    }
    return null;
  }

  /** The request hash every adapter stores beside a key: SHA-256 (hex) of method, "\n", path, "\n", body. */
  static String fingerprint(String method, String path, byte[] body) {
    return fingerprint(method, path.getBytes(StandardCharsets.UTF_8), body);
  }

  /**
   * The request hash of a request as it arrived: {@code rawPath} (the servlet's {@code
   * getRequestURI()}: no query, escapes as sent) with every {@code %XX} escape decoded to its
   * byte, as Go's {@code r.URL.Path}, so every adapter hashes a request alike
   * ({@code testdata/idempotency/requests.json}); a {@code %} without two hex digits stays.
   */
  static String requestHash(String method, String rawPath, byte[] body) {
    byte[] in = rawPath.getBytes(StandardCharsets.UTF_8);
    java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream(in.length);
    for (int i = 0; i < in.length; i++) {
      int hi = i + 2 < in.length && in[i] == '%' ? Character.digit(in[i + 1], 16) : -1;
      int lo = hi >= 0 ? Character.digit(in[i + 2], 16) : -1;
      if (lo >= 0) {
        out.write(hi << 4 | lo);
        i += 2;
      } else {
        out.write(in[i]);
      }
    }
    return fingerprint(method, out.toByteArray(), body);
  }

  private static String fingerprint(String method, byte[] path, byte[] body) {
    try {
      MessageDigest h = MessageDigest.getInstance("SHA-256");
      h.update((method + "\n").getBytes(StandardCharsets.UTF_8));
      h.update(path);
      h.update((byte) '\n');
      h.update(body);
      return HexFormat.of().formatHex(h.digest());
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }

  /**
   * What once and onceTx give for a claim: the first call's result when it
   * is completed, or ConflictException, InProgressException,
   * TooLargeException; null when the caller owns the key (started). Counted
   * in the store's requests by outcome.
   */
  static byte[] onceAnswer(IdempotencyBackend store, IdempotencyStore.Claim c, String key) {
    switch (c.state()) {
      case CONFLICT:
        store.countRequest("conflict");
        throw new IdempotencyStore.ConflictException(key);
      case IN_PROGRESS:
        store.countRequest("in_progress");
        throw new IdempotencyStore.InProgressException(key, c.retryAfterSeconds());
      case COMPLETED:
        if (c.response().tooLarge()) {
          store.countRequest("too_large");
          throw new IdempotencyStore.TooLargeException(key);
        }
        store.countRequest("replayed");
        return c.response().body();
      default:
        store.countRequest("first_run");
        return null;
    }
  }

  static String newToken() {
    byte[] b = new byte[16];
    RANDOM.nextBytes(b);
    return HexFormat.of().formatHex(b);
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
  static String safeHeader(String name, String value) {
    if (!isToken(name)) return null;
    byte[] v = (value == null ? "" : value).getBytes(StandardCharsets.UTF_8);
    int from = 0;
    int to = v.length;
    while (from < to && blank(v[from])) from++;
    while (to > from && blank(v[to - 1])) to--;
    StringBuilder b = new StringBuilder(to - from);
    String hex = "0123456789ABCDEF";
    for (int i = from; i < to; i++) {
      int c = v[i] & 0xff;
      if (c >= 0x21 && c <= 0x7e) {
        b.append((char) c);
      } else if (blank(v[i]) && !blank(v[i - 1]) && !blank(v[i + 1])) { // trimmed: never at either end
        b.append((char) c);
      } else {
        b.append('%').append(hex.charAt(c >> 4)).append(hex.charAt(c & 15));
      }
    }
    return b.toString();
  }

  private static boolean blank(byte c) {
    return c == ' ' || c == '\t';
  }

  static boolean isToken(String s) {
    if (s == null || s.isEmpty()) return false;
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (!(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || "!#$%&'*+-.^_`|~".indexOf(c) >= 0)) {
        return false;
      }
    }
    return true;
  }

  /** Every header of h under the rule; the names it drops are not stored. */
  static Map<String, List<String>> safeHeaders(Map<String, List<String>> h) {
    Map<String, List<String>> out = new TreeMap<>();
    h.forEach((name, values) -> {
      if (!isToken(name)) {
        if (DROPPED.size() < 1024 && DROPPED.add(name)) { // once per name, as Go logs it
          System.getLogger("dev.backstop.idempotency").log(System.Logger.Level.WARNING,
              "idempotency: response header not stored: its name is not an HTTP token: name="
                  + Json.quote(new StringBuilder(), name));
        }
        return;
      }
      List<String> safe = new ArrayList<>();
      for (String v : values) safe.add(safeHeader(name, v));
      out.put(name, safe);
    });
    return out;
  }

  /** Headers as every adapter stores them: a JSON object of name → list of values. */
  static String encodeHeaders(Map<String, List<String>> h) {
    StringBuilder b = new StringBuilder("{");
    h.forEach((name, values) -> {
      if (b.length() > 1) b.append(',');
      Json.quote(b, name).append(":[");
      for (int i = 0; i < values.size(); i++) {
        if (i > 0) b.append(',');
        Json.quote(b, values.get(i));
      }
      b.append(']');
    });
    return b.append('}').toString();
  }

  /** Stored headers read back under the rule (a record stored before it, or by any adapter, may hold any). */
  @SuppressWarnings("unchecked")
  static Map<String, List<String>> decodeHeaders(String json) {
    if (json.isEmpty()) return Map.of();
    Object v;
    try {
      v = Json.parse(json);
    } catch (Json.SyntaxException e) {
      throw new IllegalStateException("idempotency: stored headers are not a JSON object of lists: " + e.getMessage(), e);
    }
    if (!(v instanceof Map)) throw new IllegalStateException("idempotency: stored headers are not a JSON object of lists: " + json);
    Map<String, List<String>> out = new TreeMap<>();
    for (Map.Entry<String, Object> e : ((Map<String, Object>) v).entrySet()) {
      if (!isToken(e.getKey()) || !(e.getValue() instanceof List)) continue;
      List<String> safe = new ArrayList<>();
      for (Object x : (List<Object>) e.getValue()) {
        if (x instanceof String) safe.add(safeHeader(e.getKey(), (String) x));
      }
      out.put(e.getKey(), safe);
    }
    return out;
  }
}
