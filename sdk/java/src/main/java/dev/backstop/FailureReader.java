package dev.backstop;

import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * A failure value (wasm/ABI.md, "decide_value"): the caller's value
 * written for the module when the fast path ({@link Failure.Builder}, and
 * {@link Failure#read} of plain values) does not take it. decide_value and
 * outcome_value read it with the one converter every host shares
 * ({@code testdata/vectors/README.md}, "Field values") and word its errors.
 * Java's own types keep their meaning: Long, Integer, Short, Byte and
 * BigInteger are integers, Double and Float numbers, byte[] bytes, a List
 * or an array an array, and any Number is read as a random.
 */
final class FailureReader {
  private byte[] b = new byte[128];
  private int n;
  private int members; // a failure object's
  private int lacks; // which of now_ms (1) and random (2) the object lacks

  private FailureReader() {}

  /**
   * v as a failure value, a null (or absent) now_ms and random left out for
   * decide to fill, checked at once by the module's converter (through the
   * bundled runtime), as fromMap always checked a map.
   *
   * @throws InputException naming the first invalid field
   */
  static FailureReader of(Object v) {
    FailureReader w = new FailureReader();
    if (v instanceof Map) {
      w.put(Contract.VALUE_OBJECT);
      w.u32(0);
      w.lacks = 3;
      Set<String> names = new HashSet<>();
      for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
        String k = wellFormed(String.valueOf(e.getKey()));
        Object x = e.getValue();
        int bit = k.equals("now_ms") ? 1 : k.equals("random") ? 2 : 0;
        // Two lone surrogates read as one name, and the module takes no name twice.
        if (bit != 0 && x == null || !names.add(k)) continue;
        w.lacks &= ~bit;
        w.member(k, bit == 2 && x instanceof Number ? (Object) ((Number) x).doubleValue() : x);
      }
    } else {
      w.value(v);
    }
    PolicyRuntime.bundled().pick().check(Arrays.copyOf(w.b, w.n));
    return w;
  }

  /** The value as decide sends it: with the now_ms and random it lacks (f's, else the clock and a draw). */
  byte[] filled(Failure f) {
    FailureReader w = new FailureReader();
    w.b = Arrays.copyOf(b, n + 64);
    w.n = n;
    w.members = members;
    if ((lacks & 1) != 0) w.member("now_ms", f.nowMsOrClock());
    if ((lacks & 2) != 0) w.member("random", f.randomOrDraw());
    return Arrays.copyOf(w.b, w.n);
  }

  /** Writes a member of the failure object, and its count after the tag. */
  private void member(String k, Object x) {
    bytes(utf8(k));
    value(x);
    members++;
    for (int i = 0; i < 4; i++) b[1 + i] = (byte) (members >>> 8 * i);
  }

  private void value(Object x) {
    if (x == null) {
      put(Contract.VALUE_NULL);
    } else if (x instanceof Boolean) {
      put((Boolean) x ? Contract.VALUE_TRUE : Contract.VALUE_FALSE);
    } else if (x instanceof Long || x instanceof Integer || x instanceof Short || x instanceof Byte || x instanceof BigInteger) {
      put(Contract.VALUE_INT);
      bytes(x.toString().getBytes(StandardCharsets.US_ASCII));
    } else if (x instanceof Double || x instanceof Float) {
      put(Contract.VALUE_FLOAT);
      long bits = Double.doubleToRawLongBits(((Number) x).doubleValue());
      u32((int) bits);
      u32((int) (bits >>> 32));
    } else if (x instanceof String) {
      put(Contract.VALUE_STRING);
      bytes(utf8((String) x));
    } else if (x instanceof byte[]) {
      put(Contract.VALUE_BYTES);
      bytes((byte[]) x);
    } else if (x instanceof List || x instanceof Object[]) {
      put(Contract.VALUE_ARRAY);
    } else if (x instanceof Map) {
      put(Contract.VALUE_OBJECT); // only described: "an object"
      u32(0);
    } else {
      put(Contract.VALUE_OTHER); // BigDecimal, Duration, an enum ...: what describe always called them
      bytes(utf8("an object"));
    }
  }

  private void put(int tag) {
    if (n == b.length) b = Arrays.copyOf(b, 2 * n);
    b[n++] = (byte) tag;
  }

  private void u32(int v) {
    for (int i = 0; i < 32; i += 8) put(v >>> i);
  }

  private void bytes(byte[] s) {
    u32(s.length);
    if (n + s.length > b.length) b = Arrays.copyOf(b, Math.max(2 * b.length, n + s.length));
    System.arraycopy(s, 0, b, n, s.length);
    n += s.length;
  }

  /** A string setter's check: v as UTF-8, at most MAX_STRING bytes (null: absent). */
  static byte[] string(String v, String field) {
    if (v == null) return Failure.EMPTY;
    byte[] s = utf8(v);
    if (s.length > Contract.MAX_STRING) {
      throw new InputException(field, "must be at most " + Contract.MAX_STRING + " bytes (got " + s.length + ")");
    }
    return s;
  }

  /** A gRPC status name in any ASCII letter case. */
  static int grpcCode(String name, String field) {
    boolean ascii = name.chars().allMatch(c -> c < 0x80);
    int code = ascii ? Contract.GRPC_CODE_NAMES.indexOf(name.toUpperCase(java.util.Locale.ROOT)) : -1;
    if (code < 0) throw new InputException(field, "unknown gRPC status name " + Json.quote(new StringBuilder(), name));
    return code;
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
}
