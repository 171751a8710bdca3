package dev.backstop;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.LongString;
import java.io.IOException;
import java.math.BigDecimal;
import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.Date;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.regex.Pattern;

/**
 * The RabbitMQ contract (queue/rabbitmq/README.md) with no I/O but the
 * declarations: names, the topology, the headers a job is read from and the
 * messages each outcome publishes. As Python's backstop.rabbitmq._core, which
 * the Go and Node workers match byte for byte (testdata/rabbitmq).
 */
final class Rabbit {
  private Rabbit() {}

  static final int LEVELS = 18; // backstop.delay.L0 .. L17: the routing key's bits
  static final int HOLD_LEVELS = 11; // backstop.hold.L0 .. L10: the queues movers hold delayed messages in
  static final long MAX_HOP_S = (1L << HOLD_LEVELS) - 1; // 34 min in one pass: no hold outlasts the consumer timeout
  static final String DELIVER = "backstop.delay.deliver";
  static final String ENTER = "backstop.delay.enter";
  static final String UNROUTABLE = "backstop.unroutable";
  static final int MOVE_PREFETCH = 1000;
  static final long MOVE_RETRY_MS = 10_000;
  static final long MOVE_REENTER_MS = 10_000;
  static final int MAX_MOVE_REFUSALS = 30;
  static final int ERROR_MAX = 8192;
  static final int TABLE_MAX = 65536;
  static final int DROPPED_MAX = 1024;
  static final long MAX_DUE_AHEAD_MS = 30L * 24 * 3600 * 1000;
  static final long APPLY_GRACE_MS = 10_000;
  static final int REFRESH_AT = 10;
  static final String MALFORMED =
      "malformed message: needs message_id, backstop-attempt >= 1 and backstop-first-enqueued-ms";
  static final String DUE_TOO_FAR = "malformed message: backstop-due-ms is more than 30 days ahead";

  static final String H_ATTEMPT = "backstop-attempt";
  static final String H_FIRST = "backstop-first-enqueued-ms";
  static final String H_DEST = "backstop-destination";
  static final String H_LAST_REASON = "backstop-last-reason";
  static final String H_LAST_ERROR = "backstop-last-error";
  static final String H_PREV_DELAY = "backstop-prev-delay-ms";
  static final String H_DUE = "backstop-due-ms";
  static final String H_TYPE = "backstop-job-type";
  static final String H_REASON = "backstop-reason";
  static final String H_ERROR = "backstop-error";
  static final String H_DL_MS = "backstop-dead-lettered-ms";
  static final String H_DROPPED = "backstop-dropped-headers";
  static final String H_REFUSALS = "backstop-move-refusals";
  static final String X_COUNT = "x-delivery-count";

  private static final Pattern ATTEMPT = Pattern.compile("[1-9][0-9]{0,13}");
  private static final Pattern DIGITS = Pattern.compile("[0-9]{1,18}");
  private static final SecureRandom RANDOM = new SecureRandom();

  // The broker's own headers: they describe the message's old place, and go
  // when it moves (a malformed one keeps them, for a person to read).
  private static final Set<String> BROKER = Set.of("x-death", "x-first-death-exchange", "x-first-death-queue",
      "x-first-death-reason", "x-last-death-exchange", "x-last-death-queue", "x-last-death-reason", X_COUNT);

  // -- names and routing ------------------------------------------------------

  /** Exchange L<n>, and the first topology's TTL queue of the same name. */
  static String level(int n) {
    return "backstop.delay.L" + n;
  }

  /** The queue a mover holds the messages of level n in (2^n s). */
  static String hold(int n) {
    return "backstop.hold.L" + n;
  }

  /** Where a message leaves level n for: exchange L<n-1>, the deliver exchange for L0. */
  static String nextExchange(int n) {
    return n > 0 ? level(n - 1) : DELIVER;
  }

  private static String pattern(int bit, String word) {
    StringBuilder b = new StringBuilder();
    for (int i = 0; i < LEVELS; i++) {
      if (i > 0) b.append('.');
      b.append(LEVELS - 1 - i == bit ? word : "*");
    }
    return b.toString();
  }

  private static String enterPattern(int bit) {
    StringBuilder b = new StringBuilder();
    for (int i = 0; i < LEVELS; i++) {
      if (i > 0) b.append('.');
      int at = LEVELS - 1 - i;
      b.append(at > bit ? "0" : at == bit ? "1" : "*");
    }
    return b.toString();
  }

  /**
   * The routing key of a delayed message: its delay in whole seconds,
   * rounded up (never early) and capped at 2^11 - 1 (the rest is delayed
   * again on arrival), as 18 words of 0 or 1.
   */
  static String routingKey(long delayMs) {
    long s = Math.min(MAX_HOP_S, Math.max(0, Math.floorDiv(delayMs + 999, 1000)));
    StringBuilder b = new StringBuilder();
    for (int i = 0; i < LEVELS; i++) {
      if (i > 0) b.append('.');
      b.append((s >> (LEVELS - 1 - i) & 1) == 1 ? '1' : '0');
    }
    return b.toString();
  }

  // -- topology ---------------------------------------------------------------

  private static Map<String, Object> args(Object... kv) {
    Map<String, Object> m = new LinkedHashMap<>();
    for (int i = 0; i < kv.length; i += 2) m.put((String) kv[i], kv[i + 1]);
    return m;
  }

  /** Declares the levels every work queue of a virtual host shares (idempotent). */
  static void declareShared(Channel ch) throws IOException {
    for (int n = 0; n < LEVELS; n++) ch.exchangeDeclare(level(n), "topic", true);
    ch.exchangeDeclare(DELIVER, "headers", true);
    ch.exchangeDeclare(ENTER, "topic", true);
    for (int n = 0; n < LEVELS; n++) {
      // The first topology's TTL queues stay, so that messages delayed before
      // an upgrade drain; below HOLD_LEVELS they are unbound.
      ch.queueDeclare(level(n), true, false, false, args("x-queue-type", "quorum", "x-message-ttl", 1000L << n,
          "x-dead-letter-exchange", nextExchange(n), "x-dead-letter-strategy", "at-least-once",
          "x-overflow", "reject-publish"));
    }
    for (int n = 0; n < HOLD_LEVELS; n++) ch.queueDeclare(hold(n), true, false, false, args("x-queue-type", "quorum"));
    ch.queueDeclare(UNROUTABLE, true, false, false, args("x-queue-type", "quorum"));
    // Where a run asks the movers for the delayed jobs they hold (RabbitMover).
    ch.exchangeDeclare(RUN, "fanout", true);
    for (int n = HOLD_LEVELS; n < LEVELS; n++) ch.queueBind(level(n), level(n), pattern(n, "1"));
    // Bound before the TTL queue is unbound: a message routed meanwhile goes
    // to both (a duplicate), never to neither.
    for (int n = 0; n < HOLD_LEVELS; n++) ch.queueBind(hold(n), level(n), pattern(n, "1"));
    for (int n = 0; n < LEVELS; n++) ch.exchangeBind(nextExchange(n), level(n), pattern(n, "0"));
    for (int n = 0; n < LEVELS; n++) ch.exchangeBind(level(n), ENTER, enterPattern(n));
    ch.exchangeBind(DELIVER, ENTER, routingKey(0)); // no bit set: straight to the queue
    for (int n = 0; n < HOLD_LEVELS; n++) ch.queueUnbind(level(n), level(n), pattern(n, "1"));
  }

  /** The arguments of work queue q. */
  static Map<String, Object> workArgs(String q, int maxDeliveries) {
    return args("x-queue-type", "quorum", "x-delivery-limit", (long) maxDeliveries + 2, "x-dead-letter-exchange", "",
        "x-dead-letter-routing-key", q + ".dlq", "x-dead-letter-strategy", "at-least-once",
        "x-overflow", "reject-publish");
  }

  /**
   * Works a queue someone else declared (a Spring topology: quorum or
   * classic, its own x-dead-letter-exchange): q is only checked to exist
   * (passive), never declared again, so its arguments stay as they are; its
   * DLQ q.dlq is declared (quorum) only when missing, and backstop's delay
   * exchanges q.delay and q.due are declared and bound as for any queue.
   */
  static void adoptQueue(Channel ch, String q) throws IOException {
    ch.queueDeclarePassive(q); // a missing queue closes the channel: the worker stops with the broker's 404
    boolean dlq = true;
    Channel probe = ch.getConnection().createChannel();
    try {
      probe.queueDeclarePassive(q + ".dlq");
    } catch (IOException e) {
      dlq = false;
    } finally {
      if (probe.isOpen()) {
        try {
          probe.close();
        } catch (java.util.concurrent.TimeoutException | IOException e) {
          // closed meanwhile
        }
      }
    }
    if (!dlq) ch.queueDeclare(q + ".dlq", true, false, false, args("x-queue-type", "quorum"));
    ch.exchangeDeclare(q + ".delay", "fanout", true);
    ch.exchangeDeclare(q + ".due", "fanout", true);
    ch.queueBind(q, q + ".due", "");
    ch.exchangeBind(ENTER, q + ".delay", "");
    ch.exchangeBind(q + ".due", DELIVER, "", args("x-match", "all", H_DEST, q));
  }

  /** Declares work queue q, its DLQ and its delay exchanges (after the shared levels). */
  static void declareQueue(Channel ch, String q, int maxDeliveries) throws IOException {
    ch.exchangeDeclare(q + ".delay", "fanout", true);
    ch.exchangeDeclare(q + ".due", "fanout", true);
    ch.queueDeclare(q, true, false, false, workArgs(q, maxDeliveries));
    ch.queueDeclare(q + ".dlq", true, false, false, args("x-queue-type", "quorum"));
    ch.queueBind(q, q + ".due", "");
    ch.exchangeBind(ENTER, q + ".delay", "");
    ch.exchangeBind(q + ".due", DELIVER, "", args("x-match", "all", H_DEST, q));
  }

  // -- header values ----------------------------------------------------------

  /** A header's text: a string, a byte array as UTF-8 (replaced where invalid), "" for none. */
  static String text(Object v) {
    if (v == null) return "";
    if (v instanceof LongString) return utf8(((LongString) v).getBytes());
    if (v instanceof byte[]) return utf8((byte[]) v);
    if (v instanceof Boolean) return (Boolean) v ? "1" : "0";
    return v.toString();
  }

  static String utf8(byte[] b) {
    return new String(b, StandardCharsets.UTF_8);
  }

  /** Whether b is valid UTF-8. */
  static boolean validUtf8(byte[] b) {
    CharsetDecoder d = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
        .onUnmappableCharacter(CodingErrorAction.REPORT);
    try {
      d.decode(ByteBuffer.wrap(b));
      return true;
    } catch (java.nio.charset.CharacterCodingException e) {
      return false;
    }
  }

  /** A header number: a string of decimal digits or an AMQP integer >= 0; else null (a byte array, a float). */
  static Long num(Object v) {
    if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) {
      long n = ((Number) v).longValue();
      return n >= 0 ? n : null;
    }
    if (v instanceof String || v instanceof LongString) {
      String s = v.toString();
      return DIGITS.matcher(s).matches() ? Long.parseLong(s) : null;
    }
    return null;
  }

  private static boolean isText(Object v) {
    return v instanceof String || v instanceof LongString;
  }

  /**
   * The job of a delivery; receivedMs the time of receipt (a plain message's
   * first-enqueued time without a timestamp), redelivered the delivery's flag
   * (only then is x-delivery-count the broker's).
   */
  static RabbitJob jobFrom(String queue, AMQP.BasicProperties p, byte[] body, long receivedMs, boolean redelivered) {
    Map<String, Object> h = p.getHeaders() == null ? new LinkedHashMap<>() : new LinkedHashMap<>(p.getHeaders());
    String id = p.getMessageId() == null ? "" : p.getMessageId();
    Long prevN = num(h.get(H_PREV_DELAY));
    long prev = prevN == null ? 0 : prevN;
    long attempt;
    long first;
    boolean malformed;
    if (!h.containsKey(H_ATTEMPT) && !h.containsKey(H_FIRST)) {
      // Plain: not malformed, its first attempt (no delay before it).
      attempt = 1;
      malformed = false;
      prev = 0;
      Date ts = p.getTimestamp();
      first = ts != null && ts.getTime() / 1000 > 0 ? ts.getTime() / 1000 * 1000 : receivedMs;
    } else {
      Long n = num(h.get(H_ATTEMPT));
      Long f = num(h.get(H_FIRST));
      Object a = h.get(H_ATTEMPT);
      malformed = id.isEmpty() || n == null || !ATTEMPT.matcher(Long.toString(n)).matches() || f == null
          || (isText(a) && !a.toString().equals(Long.toString(n))); // "01": a leading zero
      attempt = n == null ? 0 : n;
      first = f == null ? 0 : f;
    }
    Long c = num(h.get(X_COUNT));
    long count = redelivered && c != null ? c : 0;
    Long due = num(h.get(H_DUE));
    return new RabbitJob(id, attempt, first, body, queue, p.getContentType() == null ? "" : p.getContentType(),
        text(h.get(H_TYPE)), text(h.get(H_LAST_REASON)), text(h.get(H_LAST_ERROR)), prev, due == null ? 0 : due,
        count, malformed, h);
  }

  /** A dead letter's reason: backstop's header, else the broker's (delivery_limit shown as crash_loop). */
  static String reason(Map<String, Object> h) {
    String r = text(h.get(H_REASON));
    if (!r.isEmpty()) return r;
    Object deaths = h.get("x-death");
    if (deaths instanceof List && !((List<?>) deaths).isEmpty() && ((List<?>) deaths).get(0) instanceof Map) {
      r = text(((Map<?, ?>) ((List<?>) deaths).get(0)).get("reason"));
    }
    if (r.isEmpty()) r = text(h.get("x-first-death-reason"));
    return r.equals("delivery_limit") ? "crash_loop" : r;
  }

  static RabbitDeadLetter deadLetterFrom(AMQP.BasicProperties p, byte[] body) {
    Map<String, Object> h = new LinkedHashMap<>();
    if (p.getHeaders() != null) p.getHeaders().forEach((k, v) -> {
      if (!k.equals(X_COUNT)) h.put(k, v);
    });
    Long a = num(h.get(H_ATTEMPT));
    Long f = num(h.get(H_FIRST));
    Long d = num(h.get(H_DL_MS));
    return new RabbitDeadLetter(p.getMessageId() == null ? "" : p.getMessageId(), reason(h), text(h.get(H_ERROR)),
        a == null ? 0 : a, f == null ? 0 : f, d == null ? 0 : d, body, text(h.get(H_TYPE)), text(h.get(H_DEST)), h);
  }

  // -- bounds -------------------------------------------------------------------

  /** An error within ERROR_MAX bytes of UTF-8, a longer one cut on a character boundary and marked. */
  static String boundedError(String text) {
    byte[] b = text.getBytes(StandardCharsets.UTF_8);
    if (b.length <= ERROR_MAX) return text;
    String marker = " \u2026[truncated: " + b.length + " bytes]";
    int keep = ERROR_MAX - marker.getBytes(StandardCharsets.UTF_8).length;
    CharsetDecoder d = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.IGNORE);
    CharBuffer cb;
    try {
      cb = d.decode(ByteBuffer.wrap(b, 0, keep));
    } catch (java.nio.charset.CharacterCodingException e) {
      throw new IllegalStateException(e);
    }
    return cb.toString() + marker;
  }

  private static int valueSize(Object v) {
    if (v == null) return 1;
    if (v instanceof Boolean) return 2;
    if (v instanceof BigDecimal) return 6;
    if (v instanceof Number || v instanceof Date) return 9;
    if (v instanceof byte[]) return 5 + ((byte[]) v).length;
    if (v instanceof LongString) return 5 + ((LongString) v).getBytes().length;
    if (v instanceof Map) return 1 + tableSize((Map<?, ?>) v);
    if (v instanceof List) {
      int n = 5;
      for (Object x : (List<?>) v) n += valueSize(x);
      return n;
    }
    return 5 + text(v).getBytes(StandardCharsets.UTF_8).length;
  }

  private static int entrySize(Object k, Object v) {
    return 1 + k.toString().getBytes(StandardCharsets.UTF_8).length + valueSize(v);
  }

  /** The bytes of h encoded as an AMQP field table. */
  static int tableSize(Map<?, ?> h) {
    int n = 4;
    for (Map.Entry<?, ?> e : h.entrySet()) n += entrySize(e.getKey(), e.getValue());
    return n;
  }

  /**
   * The headers a publish sends, within the README's bounds: the errors
   * bounded; then, over TABLE_MAX bytes, foreign headers dropped, largest
   * first (ties by name), named in backstop-dropped-headers.
   */
  static Map<String, Object> fit(Map<String, Object> h) {
    Map<String, Object> out = new LinkedHashMap<>(h);
    for (String k : List.of(H_LAST_ERROR, H_ERROR)) {
      Object v = out.get(k);
      if (v instanceof String) out.put(k, boundedError((String) v));
    }
    int size = tableSize(out);
    if (size <= TABLE_MAX) return out;
    List<Map.Entry<String, Integer>> foreign = new ArrayList<>();
    for (Map.Entry<String, Object> e : out.entrySet()) {
      if (!e.getKey().startsWith("backstop-") && !e.getKey().equals("x-death")) {
        foreign.add(Map.entry(e.getKey(), entrySize(e.getKey(), e.getValue())));
      }
    }
    foreign.sort(Comparator.<Map.Entry<String, Integer>>comparingInt(e -> -e.getValue())
        .thenComparing(e -> e.getKey(), Rabbit::compareUtf8));
    List<String> dropped = new ArrayList<>();
    if (out.containsKey(H_DROPPED)) {
      Object prev = out.remove(H_DROPPED);
      size -= entrySize(H_DROPPED, prev);
      if (!text(prev).isEmpty()) dropped.add(text(prev));
    }
    int limit = TABLE_MAX - entrySize(H_DROPPED, " ".repeat(DROPPED_MAX));
    for (Map.Entry<String, Integer> f : foreign) {
      if (size <= limit) break;
      out.remove(f.getKey());
      size -= f.getValue();
      dropped.add(f.getKey());
    }
    byte[] listed = String.join(",", dropped).getBytes(StandardCharsets.UTF_8);
    if (listed.length > DROPPED_MAX) {
      int cut = 0;
      for (int i = 0; i <= DROPPED_MAX && i < listed.length; i++) if (listed[i] == ',') cut = i; // whole names only
      listed = java.util.Arrays.copyOf(listed, cut);
    }
    out.put(H_DROPPED, utf8(listed));
    return out;
  }

  private static int compareUtf8(String a, String b) {
    return java.util.Arrays.compareUnsigned(a.getBytes(StandardCharsets.UTF_8), b.getBytes(StandardCharsets.UTF_8));
  }

  // -- moves --------------------------------------------------------------------

  /** A message to publish (confirmed, mandatory) before the delivery is acked; messageId "" keeps the delivery's. */
  record Publish(String exchange, String routingKey, Map<String, Object> headers, String messageId) {}

  /** The headers a message takes to its next place: every one but the broker's. */
  static Map<String, Object> own(Map<String, Object> h) {
    Map<String, Object> out = new LinkedHashMap<>();
    h.forEach((k, v) -> {
      if (!BROKER.contains(k)) out.put(k, v);
    });
    return out;
  }

  static Map<String, Object> without(Map<String, Object> h, String name) {
    Map<String, Object> out = new LinkedHashMap<>(h);
    out.remove(name);
    return out;
  }

  /** A job's headers to its next place, with backstop's attempt and first-enqueued time (a plain message had none). */
  static Map<String, Object> jobHeaders(RabbitJob job) {
    Map<String, Object> h = own(job.headers());
    h.putIfAbsent(H_ATTEMPT, Long.toString(job.attempt()));
    h.putIfAbsent(H_FIRST, Long.toString(job.firstEnqueuedMs()));
    return h;
  }

  static Publish delayed(String q, Map<String, Object> h, long delayMs, long now, String messageId) {
    h.put(H_DEST, q);
    h.put(H_DUE, Long.toString(now + delayMs));
    return new Publish(q + ".delay", routingKey(delayMs), h, messageId);
  }

  static Publish deadLetter(String q, RabbitJob job, String reason, String error, long now) {
    // A malformed message keeps the broker's headers (x-death: where it was), never x-delivery-count.
    Map<String, Object> h = job.malformed() ? without(job.headers(), X_COUNT) : jobHeaders(job);
    h.put(H_REASON, reason);
    h.put(H_ERROR, error);
    h.put(H_DL_MS, Long.toString(now));
    if (!job.malformed()) h.putIfAbsent(H_DEST, q);
    return new Publish("", q + ".dlq", h, job.id());
  }

  /** The message a plan publishes before the ack (null for a success). */
  static Publish move(String q, RabbitJob job, QueuePlan plan, long now) {
    switch (plan.action()) {
      case ACK:
        return null;
      case DEAD_LETTER:
        return deadLetter(q, job, plan.reason().toString(), plan.error(), now);
      default:
        Map<String, Object> h = jobHeaders(job);
        h.put(H_LAST_REASON, plan.reason().toString());
        if (!plan.error().isEmpty()) h.put(H_LAST_ERROR, plan.error());
        if (plan.action() == Outcome.Action.RETRY) {
          h.put(H_ATTEMPT, Long.toString(job.attempt() + 1));
          h.put(H_PREV_DELAY, Long.toString(plan.delayMs()));
        }
        return delayed(q, h, plan.delayMs(), now, job.id());
    }
  }

  /** A job that arrived before it is due, delayed again for the rest. */
  static Publish early(String q, RabbitJob job, long now) {
    Map<String, Object> h = jobHeaders(job);
    h.put(H_DEST, q);
    return new Publish(q + ".delay", routingKey(job.dueMs() - now), h, job.id());
  }

  /** A plain message without a message id, published again to q with an id of its own. */
  static Publish adopted(String q, RabbitJob job) {
    byte[] r = new byte[16];
    RANDOM.nextBytes(r);
    return new Publish("", q, without(job.headers(), X_COUNT), "amqp-" + HexFormat.of().formatHex(r));
  }

  static String crashLoopError(RabbitJob job, int maxDeliveries) {
    return "crash loop: delivered " + (job.deliveryCount() + 1) + " times without an outcome (max deliveries "
        + maxDeliveries + ")";
  }

  /** A dead letter sent back to its queue: afresh (attempt 1, a new first-enqueued time), or its attempt kept. */
  static Publish replayed(String q, RabbitDeadLetter d, boolean keepAttempts, long now) {
    Map<String, Object> h = own(d.headers());
    for (String k : List.of(H_REASON, H_ERROR, H_DL_MS, H_DUE, H_PREV_DELAY, H_LAST_ERROR)) h.remove(k);
    if (!keepAttempts) {
      h.put(H_ATTEMPT, "1");
      h.put(H_FIRST, Long.toString(now));
    }
    if (!d.reason().isEmpty()) h.put(H_LAST_REASON, d.reason());
    String dest = d.destination().isEmpty() ? q : d.destination();
    h.put(H_DEST, dest);
    return new Publish("", dest, h, "");
  }

  /** Whether dead letters looked at go back as fresh copies (one was looked at REFRESH_AT times or more). */
  static boolean refresh(List<Map<String, Object>> headers) {
    for (Map<String, Object> h : headers) {
      Long n = h == null ? null : num(h.get(X_COUNT));
      if (n != null && n >= REFRESH_AT) return true;
    }
    return false;
  }

  static Publish enqueued(String q, String jobId, String jobType, long delayMs, long now) {
    Map<String, Object> h = new LinkedHashMap<>();
    h.put(H_ATTEMPT, "1");
    h.put(H_FIRST, Long.toString(now));
    h.put(H_DEST, q);
    if (jobType != null) h.put(H_TYPE, jobType);
    return delayMs > 0 ? delayed(q, h, delayMs, now, jobId) : new Publish("", q, h, jobId);
  }

  // -- the mover ------------------------------------------------------------------

  /** The value in seconds of the routing key's bits below n; -1 for a key that is not 18 words of 0 or 1. */
  static long lowSeconds(int n, String key) {
    String[] words = key.split("\\.", -1);
    if (words.length != LEVELS) return -1;
    long v = 0;
    for (int i = 0; i < LEVELS; i++) {
      if (!words[i].equals("0") && !words[i].equals("1")) return -1;
      if (i >= LEVELS - n) v = v * 2 + (words[i].equals("1") ? 1 : 0);
    }
    return v;
  }

  /** When a delivery of hold.L<n> received at receivedMs leaves its level. */
  static long releaseMs(int n, String key, Map<String, Object> headers, long receivedMs) {
    long at = receivedMs + (1000L << n);
    Object dv = headers == null ? null : headers.get(H_DUE);
    if (dv instanceof byte[]) dv = utf8((byte[]) dv);
    Long due = num(dv);
    long low = lowSeconds(n, key);
    if (due == null || due == 0 || low < 0) return at;
    return Math.min(at, due - low * 1000);
  }

  // -- force run (queue/rabbitmq/run.go) ------------------------------------------

  /** The fanout exchange where a run asks every mover for the delayed jobs it holds. */
  static final String RUN = "backstop.run";
  static final String H_RUN_OP = "backstop-run-op"; // "count" (every mover) or "take" (one mover)
  static final String H_RUN_QUEUE = "backstop-run-queue";
  static final String H_RUN_ID = "backstop-run-id";
  static final String H_RUN_BEFORE = "backstop-run-due-before-ms";
  static final String H_RUN_LIMIT = "backstop-run-limit";
  static final String H_RUN_MATCHED = "backstop-run-matched";
  static final String H_RUN_MOVED = "backstop-run-moved";
  static final String H_RUN_MOVER = "backstop-run-mover"; // the mover's command queue: where a take goes

  /** A run's command to the movers: count the held deliveries it selects, or take at most limit of them. */
  record RunCommand(String queue, String jobId, Long beforeMs, boolean take, long limit) {
    /** Whether a held delivery is one it selects: of its queue, with its job id or due at or before its bound. */
    boolean selects(String messageId, Map<String, Object> headers) {
      Map<String, Object> h = headers == null ? Map.of() : headers;
      if (!text(h.get(H_DEST)).equals(queue)) return false;
      if (!jobId.isEmpty()) return jobId.equals(messageId);
      Long due = num(h.get(H_DUE));
      return beforeMs != null && (due == null ? 0 : due) <= beforeMs;
    }
  }

  static RunCommand runCommand(Map<String, Object> headers) {
    Map<String, Object> h = headers == null ? Map.of() : headers;
    boolean take = text(h.get(H_RUN_OP)).equals("take");
    Long limit = num(h.get(H_RUN_LIMIT));
    return new RunCommand(text(h.get(H_RUN_QUEUE)), text(h.get(H_RUN_ID)), num(h.get(H_RUN_BEFORE)), take,
        take && limit != null ? limit : 0);
  }

  /** A mover's answer to a run's command. */
  static Map<String, Object> runAnswer(long matched, long moved, String mover) {
    Map<String, Object> h = new LinkedHashMap<>();
    h.put(H_RUN_MATCHED, Long.toString(matched));
    h.put(H_RUN_MOVED, Long.toString(moved));
    h.put(H_RUN_MOVER, mover);
    return h;
  }

  /**
   * A held delivery run now: to its work queue (the default exchange), its
   * attempt and every header kept but its due time (the worker would delay
   * it again), its move refusals and the broker's.
   */
  static Publish runNow(Map<String, Object> headers) {
    Map<String, Object> h = own(headers == null ? Map.of() : headers);
    h.remove(H_DUE);
    h.remove(H_REFUSALS);
    return new Publish("", text(h.get(H_DEST)), h, "");
  }

  static Publish moved(int n, String key, Map<String, Object> headers) {
    return new Publish(nextExchange(n), key, without(headers == null ? Map.of() : headers, X_COUNT), "");
  }

  private static List<Publish> moveDeadLetters(Map<String, Object> headers, String error, long now) {
    Map<String, Object> h = own(headers);
    h.remove(H_REFUSALS);
    h.put(H_REASON, "unroutable");
    h.put(H_ERROR, error);
    h.put(H_DL_MS, Long.toString(now));
    String dest = text(h.get(H_DEST));
    List<Publish> out = new ArrayList<>();
    if (!dest.isEmpty()) out.add(new Publish("", dest + ".dlq", h, ""));
    out.add(new Publish("", UNROUTABLE, new LinkedHashMap<>(h), ""));
    return out;
  }

  static List<Publish> moveReturned(Map<String, Object> headers, long now) {
    String dest = text(headers.get(H_DEST));
    String err = dest.isEmpty() ? "no route for a delayed message without backstop-destination"
        : "no route to queue \"" + dest + "\": it was deleted or never declared";
    return moveDeadLetters(headers, err, now);
  }

  static List<Publish> moveRefused(Map<String, Object> headers, long now) {
    Map<String, Object> h = without(headers, X_COUNT);
    Long r = num(h.get(H_REFUSALS));
    long n = (r == null ? 0 : r) + 1;
    if (n >= MAX_MOVE_REFUSALS) {
      return moveDeadLetters(h, "the broker refused the delayed message's move " + n
          + " times (a full queue or delay level): rabbitmq: the broker rejected the message", now);
    }
    Long d = num(h.get(H_DUE));
    long due = Math.max(d == null ? 0 : d, now + MOVE_REENTER_MS);
    h.put(H_REFUSALS, Long.toString(n));
    h.put(H_DUE, Long.toString(due));
    return List.of(new Publish(ENTER, routingKey(due - now), h, ""));
  }

  /**
   * What a mover of hold.L<n> publishes next after pub was returned or
   * refused; null: hold the message and try its move again after
   * MOVE_RETRY_MS.
   */
  static List<Publish> afterMove(int n, Publish pub, boolean returned, Map<String, Object> headers, long now) {
    Map<String, Object> h = headers == null ? Map.of() : headers;
    if (pub.exchange().equals(nextExchange(n))) return returned ? moveReturned(h, now) : moveRefused(h, now);
    return returned ? List.of() : null;
  }

  /** Pause before a delivery whose outcome the broker refused n times in a row is handed back (ms). */
  static long refusedPauseMs(int n) {
    long d = Math.min(5000, 20L << Math.min(n - 1, 10));
    return d / 2 + (long) (Math.random() * d / 2);
  }
}
