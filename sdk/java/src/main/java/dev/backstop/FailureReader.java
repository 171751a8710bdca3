package dev.backstop;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.math.MathContext;
import java.math.RoundingMode;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

/**
 * How a failure's values are read, one converter per type of the schema
 * (contract/abi.json: int64, int32, grpc_code, string, hint, key, random,
 * bool), by the rules every host follows ({@code testdata/vectors/README.md},
 * "Field values"), with the messages every host gives. The generated
 * {@link Failure} calls them field by field.
 */
final class FailureReader {
  private static final double TWO63 = 9223372036854775808.0;

  private FailureReader() {}

  /** v as a failure object: a Map whose keys are all fields (else the least unknown one, in code point order). */
  static Map<?, ?> object(Object v, Set<String> fields) {
    if (!(v instanceof Map)) throw new InputException("failure", "must be an object (got " + describe(v) + ")");
    String unknown = null;
    for (Object k : ((Map<?, ?>) v).keySet()) {
      String name = String.valueOf(k);
      if (fields.contains(name)) continue;
      String u = wellFormed(name);
      if (unknown == null || codePointLess(u, unknown)) unknown = u;
    }
    if (unknown != null) throw new InputException(unknown, "unknown field");
    return (Map<?, ?>) v;
  }

  /** A value the field's type does not take, in the schema's words (Contract.EXPECTS). */
  private static InputException wrong(String field, String type, Object v) {
    return new InputException(field, "must be " + Contract.EXPECTS.get(type) + " (got " + describe(v) + ")");
  }

  /** An integer; a fraction is dropped when truncate (milliseconds), else refused (attempt). */
  static long int64(Object v, String field, boolean truncate) {
    if (v == null) return 0;
    if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) return ((Number) v).longValue();
    if (v instanceof BigInteger) {
      BigInteger b = (BigInteger) v;
      if (b.bitLength() > 63) throw new InputException(field, "must fit in 64 bits (got " + b + ")");
      return b.longValue();
    }
    if (v instanceof Double || v instanceof Float) {
      double d = ((Number) v).doubleValue();
      if (!Double.isFinite(d) || (!truncate && d != Math.rint(d))) {
        throw wrong(field, "int64", v);
      }
      double t = d < 0 ? Math.ceil(d) : Math.floor(d);
      if (t >= TWO63 || t < -TWO63) throw new InputException(field, "must fit in 64 bits (got " + describe(v) + ")");
      return (long) t;
    }
    throw wrong(field, "int64", v);
  }

  static int int32(Object v, String field) {
    return int32(v, field, "int32");
  }

  private static int int32(Object v, String field, String type) {
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
    throw wrong(field, type, v);
  }

  /** A gRPC code: a 32-bit integer, or a status name. */
  static int grpcCode(Object v, String field) {
    if (v instanceof String) return grpcCode((String) v, field);
    return int32(v, field, "grpc_code");
  }

  /** A gRPC status name in any ASCII letter case. */
  static int grpcCode(String name, String field) {
    boolean ascii = name.chars().allMatch(c -> c < 0x80);
    int code = ascii ? Contract.GRPC_CODE_NAMES.indexOf(name.toUpperCase(Locale.ROOT)) : -1;
    if (code < 0) throw new InputException(field, "unknown gRPC status name " + quote(name));
    return code;
  }

  /** A string: a String (as UTF-8) or bytes, null absent. */
  static byte[] string(Object v, String field) {
    if (v == null) return Failure.EMPTY;
    byte[] b;
    if (v instanceof String) {
      b = utf8((String) v);
    } else if (v instanceof byte[]) {
      b = (byte[]) v;
    } else {
      throw wrong(field, "string", v);
    }
    if (b.length > Contract.MAX_STRING) {
      throw new InputException(field, "must be at most " + Contract.MAX_STRING + " bytes (got " + b.length + ")");
    }
    return b;
  }

  /** A hint: a string or bytes, or a number written as the integer it rounds up to ("NaN", "Infinity", "-Infinity" stay malformed). */
  static byte[] hint(Object v, String field) {
    if (v instanceof Double || v instanceof Float) {
      double d = ((Number) v).doubleValue();
      if (Double.isNaN(d)) return string("NaN", field);
      if (Double.isInfinite(d)) return string(d > 0 ? "Infinity" : "-Infinity", field);
      return string(new BigDecimal(Math.ceil(d)).toBigInteger().toString(), field);
    }
    if (v instanceof Long || v instanceof Integer || v instanceof BigInteger || v instanceof Short || v instanceof Byte) {
      return string(v.toString(), field);
    }
    if (v instanceof Boolean || v instanceof Map || v instanceof List) {
      throw wrong(field, "hint", v);
    }
    return string(v, field);
  }

  /** A key: whether there is one (a non-empty string or bytes, or true). */
  static boolean key(Object v, String field) {
    if (v == null || Boolean.FALSE.equals(v)) return false;
    if (Boolean.TRUE.equals(v)) return true;
    if (v instanceof String) return !((String) v).isEmpty();
    if (v instanceof byte[]) return ((byte[]) v).length > 0;
    throw wrong(field, "key", v);
  }

  static double random(Object v, String field) {
    if (v instanceof Number) return ((Number) v).doubleValue();
    if ("NaN".equals(v)) return Double.NaN;
    if ("Infinity".equals(v) || "+Infinity".equals(v)) return Double.POSITIVE_INFINITY;
    if ("-Infinity".equals(v)) return Double.NEGATIVE_INFINITY;
    throw wrong(field, "random", v);
  }

  static boolean bool(Object v, String field) {
    if (v == null || Boolean.FALSE.equals(v)) return false;
    if (Boolean.TRUE.equals(v)) return true;
    throw wrong(field, "bool", v);
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

  /** s as UTF-8, a lone surrogate as U+FFFD (String.getBytes would write '?'). */
  static byte[] utf8(String s) {
    return wellFormed(s).getBytes(StandardCharsets.UTF_8);
  }

  /** s with each lone surrogate replaced by U+FFFD (s itself when it has none). */
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
    return java.util.Arrays.compare(a.codePoints().toArray(), b.codePoints().toArray()) < 0;
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
    double a = Math.abs(d);
    String digits = null;
    int exp = 0;
    // The exact value rounded to p digits (String.format would round
    // Double.toString's digits, which on Java 17 are not always the
    // shortest: a double rounding), for the least p that reads back.
    BigDecimal exact = new BigDecimal(a);
    for (int p = 1; p <= 17 && digits == null; p++) {
      BigDecimal r = exact.round(new MathContext(p, RoundingMode.HALF_EVEN));
      if (r.doubleValue() == a) {
        BigDecimal t = r.stripTrailingZeros();
        digits = t.unscaledValue().toString();
        exp = digits.length() - 1 - t.scale();
      }
    }
    int k = digits.length();
    int n = exp + 1; // the decimal point's position
    StringBuilder b = new StringBuilder(d < 0 ? "-" : "");
    if (k <= n && n <= 21) {
      b.append(digits).append("0".repeat(n - k));
    } else if (0 < n && n <= 21) {
      b.append(digits, 0, n).append('.').append(digits, n, k);
    } else if (-6 < n && n <= 0) {
      b.append("0.").append("0".repeat(-n)).append(digits);
    } else {
      b.append(digits.charAt(0));
      if (k > 1) b.append('.').append(digits, 1, k);
      b.append('e').append(n - 1 >= 0 ? "+" : "-").append(Math.abs(n - 1));
    }
    return b.toString();
  }
}
