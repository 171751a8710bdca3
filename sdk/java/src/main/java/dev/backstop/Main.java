package dev.backstop;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.DoubleSupplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * {@code java -jar backstop-policy.jar decide [--policy FILE|PRESET] [--random draw|X]}:
 * failures in (JSON lines, the vector {@code input} shape), decisions out
 * (one JSON line each, in order), like the Go {@code backstop decide}, the
 * Node.js {@code backstop-decide} and {@code python -m backstop decide}: for
 * the same input all write the same bytes (testdata/vectors/README.md,
 * "Input lines"). Every input line gets exactly one output line; a bad line
 * gets {@code {"error": "..."}} and the stream goes on. A line without
 * random gets a uniform draw (or --random's X); an absent now_ms is 0. A
 * line's duration_ms (how long the call took) is recorded before its
 * failure is decided, for a slow-call-rate breaker.
 */
public final class Main {
  /** The presets' names, from the schema (contract/abi.json). */
  private static final List<String> PRESETS = Contract.PRESET_NAMES;
  private static final int MAX_LINE_BYTES = 4 << 20;
  private static final int MAX_DEPTH = 32;
  private static final int MAX_NUMBER_CHARS = 32;
  private static final String USAGE =
      "usage: backstop-decide [--policy FILE|PRESET] [--random draw|X] < failures.jsonl > decisions.jsonl";
  private static final Pattern FLAG = Pattern.compile("^--?(policy|random)(=|$)");
  private static final Pattern NUMBER = Pattern.compile("^[-+]?(\\d+\\.?\\d*|\\.\\d+)([eE][-+]?\\d+)?$");

  private Main() {}

  /** Exits with a message: status 1 for a failure, 2 for a usage error. */
  private static final class Exit extends RuntimeException {
    private static final long serialVersionUID = 1L;
    final int status;

    Exit(String message, int status) {
      super(message, null, false, false);
      this.status = status;
    }
  }

  public static void main(String[] args) throws IOException {
    int status;
    try {
      status = run(args, System.in, System.out);
    } catch (Exit e) {
      System.err.println("backstop-decide: " + e.getMessage());
      status = e.status;
    }
    System.out.flush();
    System.exit(status);
  }

  static int run(String[] args, InputStream in, PrintStream stdout) throws IOException {
    int from = args.length > 0 && args[0].equals("decide") ? 1 : 0;
    String policyArg = "default";
    String randomArg = "draw";
    for (int i = from; i < args.length; i++) {
      String a = args[i];
      Matcher m = FLAG.matcher(a);
      if (a.equals("-h") || a.equals("--help")) {
        stdout.println(USAGE);
        return 0;
      } else if (m.find()) {
        String value;
        if (a.contains("=")) {
          value = a.substring(a.indexOf('=') + 1);
        } else if (i + 1 < args.length) {
          value = args[++i];
        } else {
          throw new Exit("--" + m.group(1) + " needs a value\n" + USAGE, 2);
        }
        if (m.group(1).equals("policy")) {
          policyArg = value;
        } else {
          randomArg = value;
        }
      } else {
        throw new Exit("unexpected argument " + Json.quote(new StringBuilder(), a) + "\n" + USAGE, 2);
      }
    }
    DoubleSupplier absentRandom = absentRandom(randomArg);
    Policy policy;
    try {
      policy = PRESETS.contains(policyArg) && !Files.exists(Path.of(policyArg))
          ? Policy.preset(policyArg) : Policy.load(readFile(policyArg));
    } catch (PolicyException e) {
      throw new Exit(policyArg + ": " + e.getMessage(), 1);
    }
    try (policy) {
      stream(policy, absentRandom, in, stdout);
    }
    return 0;
  }

  private static DoubleSupplier absentRandom(String flag) {
    if (flag.equals("draw")) return () -> ThreadLocalRandom.current().nextDouble();
    double r = NUMBER.matcher(flag).matches() ? Double.parseDouble(flag) : Double.NaN;
    if (!(r >= 0 && r < 1)) {
      throw new Exit("--random must be draw or a number in [0, 1), got " + Json.quote(new StringBuilder(), flag)
          + "\n" + USAGE, 2);
    }
    return () -> r;
  }

  private static byte[] readFile(String arg) {
    try {
      return Files.readAllBytes(Path.of(arg));
    } catch (NoSuchFileException e) {
      throw new Exit("open " + arg + ": no such file or directory (and " + Json.quote(new StringBuilder(), arg)
          + " is not a preset: " + String.join(", ", PRESETS) + ")", 1);
    } catch (IOException | RuntimeException e) {
      throw new Exit(e.getMessage() + " (and " + Json.quote(new StringBuilder(), arg) + " is not a preset: "
          + String.join(", ", PRESETS) + ")", 1);
    }
  }

  /**
   * Answers each line of in. One write (and flush) per chunk read, so a
   * process that writes one line and waits gets its answer.
   */
  static void stream(Policy policy, DoubleSupplier absentRandom, InputStream in, OutputStream out) throws IOException {
    byte[] chunk = new byte[64 << 10];
    ByteArrayOutputStream line = new ByteArrayOutputStream();
    long size = 0;
    boolean tooLong = false;
    StringBuilder answers = new StringBuilder();
    for (int n; (n = in.read(chunk)) >= 0; ) {
      for (int start = 0; ; ) {
        int nl = indexOf(chunk, (byte) '\n', start, n);
        int end = nl < 0 ? n : nl;
        if (end > start && (size += end - start) > MAX_LINE_BYTES) {
          tooLong = true;
          line.reset();
        } else if (end > start && !tooLong) {
          line.write(chunk, start, end - start);
        }
        if (nl < 0) break;
        answers.append(answer(policy, line.toByteArray(), tooLong, absentRandom)).append('\n');
        line.reset();
        size = 0;
        tooLong = false;
        start = nl + 1;
      }
      if (answers.length() > 0) {
        out.write(answers.toString().getBytes(StandardCharsets.UTF_8));
        out.flush();
        answers.setLength(0);
      }
    }
    if (size > 0 || tooLong) {
      out.write((answer(policy, line.toByteArray(), tooLong, absentRandom) + "\n").getBytes(StandardCharsets.UTF_8));
    }
    out.flush();
  }

  private static int indexOf(byte[] b, byte c, int from, int to) {
    for (int i = from; i < to; i++) {
      if (b[i] == c) return i;
    }
    return -1;
  }

  private static String bad(String reason) {
    return error("invalid input line: " + reason);
  }

  private static String error(String message) {
    return Json.quote(new StringBuilder("{\"error\":"), message).append('}').toString();
  }

  /** The answer to one line (its bytes without the "\n"), as a JSON line without the "\n". */
  static String answer(Policy policy, byte[] line, boolean tooLong, DoubleSupplier absentRandom) {
    if (tooLong) return bad("longer than " + MAX_LINE_BYTES + " bytes");
    boolean blank = true;
    for (byte b : line) {
      if (b != ' ' && b != '\t' && b != '\r') {
        blank = false;
        break;
      }
    }
    if (blank) return bad("empty");
    String text;
    try {
      text = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
          .onUnmappableCharacter(CodingErrorAction.REPORT).decode(ByteBuffer.wrap(line)).toString();
    } catch (CharacterCodingException e) {
      return bad("not UTF-8");
    }
    int[] scan = scan(text);
    if (scan[0] > MAX_DEPTH) return bad("nested deeper than " + MAX_DEPTH + " levels");
    if (scan[1] != 0) return bad("a number longer than " + MAX_NUMBER_CHARS + " characters");
    Object input;
    try {
      input = Json.parse(text);
    } catch (Json.SyntaxException e) {
      return bad("not valid JSON");
    }
    if (!(input instanceof Map)) return bad("expected a JSON object");
    try {
      // duration_ms is the line's, not the failure's: how long the call
      // took, recorded (at a valid now_ms) before the failure is decided,
      // as a loop does (internal/vector/line.go, DecodeCallLine).
      Map<Object, Object> m = new LinkedHashMap<>((Map<?, ?>) input);
      Object duration = m.remove("duration_ms");
      // An unknown name first, as every command: Failure.read reports it.
      if (duration != null && Failure.FIELDS.containsAll(m.keySet())) {
        long ms = durationMs(duration);
        if (ms < 0) throw new InputException("duration_ms", "must be >= 0 (got " + ms + ")");
        Object now = m.get("now_ms");
        if (now == null || now instanceof Long) {
          policy.recordDuration(now == null ? 0 : (Long) now, ms);
        } else if (now instanceof Double && (Double) now >= -0x1p63 && (Double) now < 0x1p63) {
          policy.recordDuration((long) (double) (Double) now, ms); // a fraction dropped; else the failure's error says so
        }
      }
      Failure f = Failure.read(m, 0L, null);
      if (f.random == null) f = f.toBuilder().random(absentRandom.getAsDouble()).build();
      return policy.decide(f).toJson();
    } catch (InputException e) {
      return error(e.getMessage()); // "field: reason", as Go prints it
    }
  }

  /** A line's duration_ms, by attempt's rule (an integer, within 64 bits) and in its words. */
  private static long durationMs(Object v) {
    if (v instanceof Long) return (Long) v;
    if (v instanceof Double && (Double) v == Math.rint((Double) v) && (Double) v >= -0x1p63 && (Double) v < 0x1p63) {
      return (long) (double) (Double) v;
    }
    try {
      Failure.fromMap(Collections.singletonMap("attempt", v));
    } catch (InputException e) {
      throw new InputException("duration_ms", e.reason());
    }
    throw new IllegalStateException("duration_ms " + v + " broke no rule of attempt");
  }

  /**
   * The deepest nesting of brackets outside strings, and whether a run of
   * number characters outside strings is longer than MAX_NUMBER_CHARS
   * (internal/vector/line.go, scanLine).
   */
  private static int[] scan(String s) {
    int depth = 0;
    int d = 0;
    int run = 0;
    int longNumber = 0;
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (c == '"') {
        for (i++; i < s.length() && s.charAt(i) != '"'; i++) {
          if (s.charAt(i) == '\\') i++;
        }
        run = 0;
      } else if (c == '[' || c == '{') {
        if (++d > depth) depth = d;
        run = 0;
      } else if (c == ']' || c == '}') {
        d--;
        run = 0;
      } else if ((c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E') {
        if (++run > MAX_NUMBER_CHARS) longNumber = 1;
      } else {
        run = 0;
      }
    }
    return new int[] {depth, longNumber};
  }
}
