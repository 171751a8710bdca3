package dev.backstop;

import java.math.BigInteger;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A strict JSON (RFC 8259) reader and the string writer of backstop's
 * answers, so the package needs no JSON library. Objects read as
 * {@code LinkedHashMap} (a repeated name keeps its last value, as Go and
 * JavaScript read it), arrays as {@code ArrayList}, integers without a
 * fraction or exponent as {@code Long} (or {@code BigInteger} past 64 bits:
 * the vectors have attempt 9223372036854775807), other numbers as
 * {@code Double}, {@code null} as Java null.
 */
final class Json {
  private final String s;
  private int i;

  private Json(String s) {
    this.s = s;
  }

  /** Thrown for text that is not one JSON value. */
  static final class SyntaxException extends Exception {
    private static final long serialVersionUID = 1L;

    SyntaxException(String message) {
      super(message, null, false, false);
    }
  }

  static Object parse(String text) throws SyntaxException {
    Json p = new Json(text);
    p.space();
    Object v = p.value();
    p.space();
    if (p.i != text.length()) throw p.error("unexpected text after the value");
    return v;
  }

  private SyntaxException error(String what) {
    return new SyntaxException(what + " at offset " + i);
  }

  private void space() {
    while (i < s.length()) {
      char c = s.charAt(i);
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
      i++;
    }
  }

  private Object value() throws SyntaxException {
    if (i >= s.length()) throw error("unexpected end");
    char c = s.charAt(i);
    switch (c) {
      case '{':
        return object();
      case '[':
        return array();
      case '"':
        return string();
      case 't':
        return literal("true", Boolean.TRUE);
      case 'f':
        return literal("false", Boolean.FALSE);
      case 'n':
        return literal("null", null);
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return number();
        throw error("unexpected character");
    }
  }

  private Object literal(String word, Object v) throws SyntaxException {
    if (!s.startsWith(word, i)) throw error("unexpected character");
    i += word.length();
    return v;
  }

  private Map<String, Object> object() throws SyntaxException {
    Map<String, Object> m = new LinkedHashMap<>();
    i++;
    space();
    if (i < s.length() && s.charAt(i) == '}') {
      i++;
      return m;
    }
    for (;;) {
      space();
      if (i >= s.length() || s.charAt(i) != '"') throw error("expected a name");
      String name = string();
      space();
      if (i >= s.length() || s.charAt(i) != ':') throw error("expected ':'");
      i++;
      space();
      m.put(name, value());
      space();
      if (i >= s.length()) throw error("unexpected end");
      char c = s.charAt(i++);
      if (c == '}') return m;
      if (c != ',') throw error("expected ',' or '}'");
    }
  }

  private List<Object> array() throws SyntaxException {
    List<Object> l = new ArrayList<>();
    i++;
    space();
    if (i < s.length() && s.charAt(i) == ']') {
      i++;
      return l;
    }
    for (;;) {
      space();
      l.add(value());
      space();
      if (i >= s.length()) throw error("unexpected end");
      char c = s.charAt(i++);
      if (c == ']') return l;
      if (c != ',') throw error("expected ',' or ']'");
    }
  }

  private String string() throws SyntaxException {
    i++; // the opening quote
    StringBuilder b = null;
    int start = i;
    for (;;) {
      if (i >= s.length()) throw error("unterminated string");
      char c = s.charAt(i);
      if (c == '"') {
        String out = b == null ? s.substring(start, i) : b.append(s, start, i).toString();
        i++;
        return out;
      }
      if (c < 0x20) throw error("control character in a string");
      if (c != '\\') {
        i++;
        continue;
      }
      if (b == null) b = new StringBuilder();
      b.append(s, start, i);
      if (i + 1 >= s.length()) throw error("unterminated string");
      char e = s.charAt(i + 1);
      i += 2;
      switch (e) {
        case '"': b.append('"'); break;
        case '\\': b.append('\\'); break;
        case '/': b.append('/'); break;
        case 'b': b.append('\b'); break;
        case 'f': b.append('\f'); break;
        case 'n': b.append('\n'); break;
        case 'r': b.append('\r'); break;
        case 't': b.append('\t'); break;
        case 'u': {
          if (i + 4 > s.length()) throw error("bad \\u escape");
          int v = 0;
          for (int k = 0; k < 4; k++) {
            int d = Character.digit(s.charAt(i + k), 16);
            if (d < 0) throw error("bad \\u escape");
            v = v * 16 + d;
          }
          b.append((char) v);
          i += 4;
          break;
        }
        default:
          throw error("bad escape");
      }
      start = i;
    }
  }

  private Object number() throws SyntaxException {
    int start = i;
    if (s.charAt(i) == '-') i++;
    if (i >= s.length()) throw error("bad number");
    if (s.charAt(i) == '0') {
      i++;
    } else if (s.charAt(i) >= '1' && s.charAt(i) <= '9') {
      while (i < s.length() && isDigit(s.charAt(i))) i++;
    } else {
      throw error("bad number");
    }
    boolean integral = true;
    if (i < s.length() && s.charAt(i) == '.') {
      integral = false;
      i++;
      if (i >= s.length() || !isDigit(s.charAt(i))) throw error("bad number");
      while (i < s.length() && isDigit(s.charAt(i))) i++;
    }
    if (i < s.length() && (s.charAt(i) == 'e' || s.charAt(i) == 'E')) {
      integral = false;
      i++;
      if (i < s.length() && (s.charAt(i) == '+' || s.charAt(i) == '-')) i++;
      if (i >= s.length() || !isDigit(s.charAt(i))) throw error("bad number");
      while (i < s.length() && isDigit(s.charAt(i))) i++;
    }
    String t = s.substring(start, i);
    if (!integral) return Double.parseDouble(t);
    if (t.length() <= 18) return Long.parseLong(t);
    BigInteger big = new BigInteger(t);
    return big.bitLength() < 64 ? (Object) big.longValue() : big;
  }

  private static boolean isDigit(char c) {
    return c >= '0' && c <= '9';
  }

  /**
   * Appends s as a JSON string, as Go's encoder writes it without HTML
   * escaping: control characters escaped, U+2028 and U+2029 as escapes, a
   * lone surrogate as U+FFFD.
   */
  static StringBuilder quote(StringBuilder b, String s) {
    b.append('"');
    for (int k = 0; k < s.length(); k++) {
      char c = s.charAt(k);
      switch (c) {
        case '"': b.append("\\\""); continue;
        case '\\': b.append("\\\\"); continue;
        case '\n': b.append("\\n"); continue;
        case '\r': b.append("\\r"); continue;
        case '\t': b.append("\\t"); continue;
        case '\b': b.append("\\b"); continue;
        case '\f': b.append("\\f"); continue;
        case '\u2028': b.append("\\u2028"); continue;
        case '\u2029': b.append("\\u2029"); continue;
        default:
      }
      if (c < 0x20) {
        b.append("\\u00").append(Character.forDigit(c >> 4, 16)).append(Character.forDigit(c & 0xf, 16));
      } else if (Character.isHighSurrogate(c) && k + 1 < s.length() && Character.isLowSurrogate(s.charAt(k + 1))) {
        b.append(c).append(s.charAt(++k));
      } else if (Character.isSurrogate(c)) {
        b.append('\ufffd');
      } else {
        b.append(c);
      }
    }
    return b.append('"');
  }
}
