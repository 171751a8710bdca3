package dev.backstop;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** The repository the tests read (testdata/, the READMEs), and JSON helpers. */
final class Repo {
  private Repo() {}

  /** The repository root: the backstop.root property surefire sets, else ../.. from sdk/java. */
  static Path root() {
    String r = System.getProperty("backstop.root");
    return Path.of(r != null ? r : "../..").toAbsolutePath().normalize();
  }

  static String read(String path) {
    try {
      return Files.readString(root().resolve(path), StandardCharsets.UTF_8);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  @SuppressWarnings("unchecked")
  static Map<String, Object> json(String path) {
    try {
      return (Map<String, Object>) Json.parse(read(path));
    } catch (Json.SyntaxException e) {
      throw new AssertionError(path + ": " + e.getMessage(), e);
    }
  }

  /** v as JSON (objects, arrays, strings, numbers, booleans, null). */
  static String write(Object v) {
    StringBuilder b = new StringBuilder();
    write(b, v);
    return b.toString();
  }

  private static void write(StringBuilder b, Object v) {
    if (v == null) {
      b.append("null");
    } else if (v instanceof String) {
      Json.quote(b, (String) v);
    } else if (v instanceof Map) {
      b.append('{');
      boolean first = true;
      for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
        if (!first) b.append(',');
        first = false;
        Json.quote(b, (String) e.getKey()).append(':');
        write(b, e.getValue());
      }
      b.append('}');
    } else if (v instanceof List) {
      b.append('[');
      boolean first = true;
      for (Object x : (List<?>) v) {
        if (!first) b.append(',');
        first = false;
        write(b, x);
      }
      b.append(']');
    } else {
      b.append(v); // Boolean, Long, BigInteger, Double (Java's 1.0E-5 is JSON too)
    }
  }

  /** The library-only values a line cannot hold: {"$bytes": hex}, {"$float": "NaN"}, {"$int": digits}. */
  static Object revive(Object v) {
    if (v instanceof List) return ((List<?>) v).stream().map(Repo::revive).toList();
    if (!(v instanceof Map)) return v;
    Map<?, ?> m = (Map<?, ?>) v;
    if (m.size() == 1 && m.containsKey("$bytes")) return HexFormat.of().parseHex((String) m.get("$bytes"));
    if (m.size() == 1 && m.containsKey("$float")) {
      String f = (String) m.get("$float");
      return f.equals("NaN") ? Double.NaN : f.equals("Infinity") ? Double.POSITIVE_INFINITY
          : f.equals("-Infinity") ? Double.NEGATIVE_INFINITY : Double.parseDouble(f);
    }
    if (m.size() == 1 && m.containsKey("$int")) {
      BigInteger b = new BigInteger((String) m.get("$int"));
      return b.bitLength() < 64 ? (Object) b.longValue() : b;
    }
    Map<String, Object> out = new LinkedHashMap<>();
    m.forEach((k, x) -> out.put((String) k, revive(x)));
    return out;
  }
}
