package dev.backstop;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.regex.Pattern;

/**
 * The Redis queue contract (queue/redisqueue/README.md) with no I/O: the
 * scripts' sources (contract/scripts, shipped in the jar), the job read from a
 * stream entry, a plain entry's fields JSON. As Python's backstop.redis._core
 * and Node's redis.js, which the Go worker matches (testdata/queue).
 */
final class Redis {
  private Redis() {}

  static final String MALFORMED = "malformed entry: needs id, attempt >= 1 and first_enqueued_ms";
  static final List<String> SCRIPTS = List.of("enqueue", "ack", "retry", "defer", "dead_letter", "promote", "reclaim",
      "replay", "hold", "run", "discard", "idempotency");
  static final Pattern ATTEMPT = Pattern.compile("[1-9][0-9]{0,13}");
  static final Pattern DIGITS = Pattern.compile("[0-9]+");
  static final Pattern INT = Pattern.compile("[+-]?[0-9]+");
  static final Pattern ENTRY_ID = Pattern.compile("(0|[1-9][0-9]{0,19})-(0|[1-9][0-9]{0,19})");
  private static final List<String> NOT_PLAIN = List.of("id", "attempt", "first_enqueued_ms", "malformed_delayed_member");
  private static final long MAX_SAFE = (1L << 53) - 1;

  record Script(String source, String sha) {}

  private static final Map<String, Script> LOADED = new ConcurrentHashMap<>();

  /** A script as sent to Redis: lib.lua, a newline, then <name>.lua. */
  static Script script(String name) {
    if (!SCRIPTS.contains(name)) throw new IllegalArgumentException("unknown script " + name);
    return LOADED.computeIfAbsent(name, n -> {
      String src = contractFile("lib.lua") + "\n" + contractFile(n + ".lua");
      try {
        byte[] d = MessageDigest.getInstance("SHA-1").digest(src.getBytes(StandardCharsets.UTF_8));
        return new Script(src, HexFormat.of().formatHex(d));
      } catch (NoSuchAlgorithmException e) {
        throw new IllegalStateException(e);
      }
    });
  }

  /** A file of contract/scripts, as the jar ships it (the Lua scripts, and PgIdempotencyStore's idempotency.sql). */
  static String contractFile(String file) {
    try (InputStream in = Redis.class.getResourceAsStream("scripts/" + file)) {
      if (in == null) throw new IllegalStateException("dev/backstop/scripts/" + file + " is not in the jar");
      return new String(in.readAllBytes(), StandardCharsets.UTF_8);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  static byte[] bytes(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  /** Bytes as text, each byte that is not part of valid UTF-8 a U+FFFD (as Go writes them). */
  static String text(byte[] b) {
    if (b == null) return "";
    StringBuilder out = new StringBuilder(b.length);
    int i = 0;
    while (i < b.length) {
      int c = b[i] & 0xff;
      int n = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
      if (n == 0 || i + n > b.length) {
        out.append('\ufffd');
        i++;
        continue;
      }
      int cp = n == 1 ? c : c & (0xff >> (n + 1));
      boolean ok = true;
      for (int k = 1; k < n; k++) {
        int x = b[i + k] & 0xff;
        if ((x & 0xc0) != 0x80) {
          ok = false;
          break;
        }
        cp = cp << 6 | (x & 0x3f);
      }
      if (ok && n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ok = false;
      if (ok && n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ok = false;
      if (!ok) {
        out.append('\ufffd');
        i++;
        continue;
      }
      out.appendCodePoint(cp);
      i += n;
    }
    return out.toString();
  }

  /** A decimal int64 (as Go's strconv.ParseInt reads it), else null. */
  static Long whole(String s) {
    if (s == null || !INT.matcher(s).matches()) return null;
    try {
      return Long.parseLong(s.startsWith("+") ? s.substring(1) : s);
    } catch (NumberFormatException e) {
      return null;
    }
  }

  /**
   * A plain entry's payload: a JSON object of every field name to its last
   * value, names in byte order, no spaces; only \, " and bytes below 0x20
   * escaped, every other byte as it is (lib.lua's fields_json).
   */
  static byte[] fieldsJson(List<byte[]> flat) {
    TreeMap<byte[], byte[]> last = new TreeMap<>(Arrays::compareUnsigned);
    for (int i = 0; i + 1 < flat.size(); i += 2) last.put(flat.get(i), flat.get(i + 1));
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    out.write('{');
    boolean first = true;
    for (Map.Entry<byte[], byte[]> e : last.entrySet()) {
      if (!first) out.write(',');
      first = false;
      quote(out, e.getKey());
      out.write(':');
      quote(out, e.getValue());
    }
    out.write('}');
    return out.toByteArray();
  }

  private static void quote(ByteArrayOutputStream out, byte[] b) {
    String hex = "0123456789abcdef";
    out.write('"');
    for (byte x : b) {
      int c = x & 0xff;
      if (c == '\\' || c == '"') {
        out.write('\\');
        out.write(c);
      } else if (c < 0x20) {
        out.writeBytes(new byte[] {'\\', 'u', '0', '0', (byte) hex.charAt(c >> 4), (byte) hex.charAt(c & 15)});
      } else {
        out.write(c);
      }
    }
    out.write('"');
  }

  /** The job of stream entry entryId with its fields in entry order (name, value, …). */
  static RedisJob jobFrom(String entryId, List<byte[]> flat) {
    Map<String, byte[]> f = new LinkedHashMap<>();
    for (int i = 0; i + 1 < flat.size(); i += 2) f.put(text(flat.get(i)), flat.get(i + 1));
    Map<String, String> texts = new LinkedHashMap<>();
    f.forEach((k, v) -> texts.put(k, text(v)));
    String type = texts.getOrDefault("type", "");
    if (NOT_PLAIN.stream().noneMatch(f::containsKey)) {
      int dash = entryId.indexOf('-');
      Long ms = whole(dash < 0 ? entryId : entryId.substring(0, dash));
      if (ms != null && ms >= 0 && ms <= MAX_SAFE) {
        byte[] payload = f.containsKey("payload") ? f.get("payload") : fieldsJson(flat);
        return new RedisJob(entryId, entryId, 1, ms, payload, "", "", false, 0, texts, type, 0);
      }
    }
    String id = texts.getOrDefault("id", "");
    String a = texts.getOrDefault("attempt", "");
    String fe = texts.getOrDefault("first_enqueued_ms", "");
    Long attempt = whole(a);
    Long first = whole(fe);
    // The scripts' rule (retry.lua): digits only, attempt in 1..1e14.
    boolean malformed = id.isEmpty() || !ATTEMPT.matcher(a).matches() || !DIGITS.matcher(fe).matches();
    Long prev = whole(texts.get("prev_delay_ms"));
    Long due = whole(texts.get("due_ms"));
    return new RedisJob(entryId, id, attempt == null ? 0 : attempt, first == null ? 0 : first,
        f.getOrDefault("payload", new byte[0]), texts.getOrDefault("last_error", ""),
        texts.getOrDefault("last_reason", ""), malformed, prev == null ? 0 : Math.max(0, prev), texts, type,
        due == null ? 0 : due);
  }

  /** A stream entry id as the scripts want it (<ms>-<seq>); else IllegalArgumentException. */
  static String entry(String who, String id) {
    if (id == null || !ENTRY_ID.matcher(id).matches()) {
      throw new IllegalArgumentException(who + ": entry must be a stream entry id (<ms>-<seq>) (got " + id + ")");
    }
    String[] p = id.split("-");
    for (String x : p) {
      if (new java.math.BigInteger(x).bitLength() > 64) {
        throw new IllegalArgumentException(who + ": entry must be a stream entry id (<ms>-<seq>) (got " + id + ")");
      }
    }
    return id;
  }

  /** The entries of an XREADGROUP / XCLAIM reply: [[id, [f, v, …]], …]. */
  static List<RedisJob> jobs(List<?> entries) {
    List<RedisJob> out = new ArrayList<>();
    if (entries == null) return out;
    for (Object e : entries) {
      if (e instanceof List && ((List<?>) e).size() == 2 && ((List<?>) e).get(1) instanceof List) {
        List<byte[]> flat = new ArrayList<>();
        for (Object x : (List<?>) ((List<?>) e).get(1)) flat.add((byte[]) x);
        out.add(jobFrom(text((byte[]) ((List<?>) e).get(0)), flat));
      }
    }
    return out;
  }
}
