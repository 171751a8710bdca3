package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.GetResponse;
import com.rabbitmq.client.LongString;
import io.prometheus.metrics.expositionformats.PrometheusTextFormatWriter;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.math.BigDecimal;
import java.net.ConnectException;
import java.net.SocketTimeoutException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Date;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.BooleanSupplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/**
 * The shared RabbitMQ cases (testdata/rabbitmq/cases.json, see its README)
 * replayed through the Java worker (RabbitQueue.work, RabbitQueue.replay)
 * against a real rabbitmq-server, as Go's cases_test.go, Node's
 * rabbitmq-cases.test.js and Python's test_rabbitmq_cases.py do: each case's
 * delivery is published, the worker runs it with the case's policy (behind a
 * spy) and handler, then the work queue, the DLQ and the delay levels are
 * drained and compared with what the Go worker left.
 */
class RabbitCasesTest {
  static final Map<String, Object> FILE = Repo.json("testdata/rabbitmq/cases.json");
  static final Pattern NOW = Pattern.compile("\\{now([+-][0-9]+)?\\}");
  static final Pattern MS = Pattern.compile("\\b[0-9]{13}\\b");
  static final Pattern ADOPTED = Pattern.compile("amqp-[0-9a-f]{32}");
  static final long DEADLINE_MS = 50;
  static final String Q = (String) FILE.get("queue");

  /** A case handler's failure, classified by its fields. */
  static final class CaseError extends Exception {
    private static final long serialVersionUID = 1L;
    final transient Map<String, Object> spec;

    CaseError(Map<String, Object> spec) {
      super((String) spec.get("message"));
      this.spec = spec;
    }
  }

  static Failure.Builder classify(Throwable t) {
    if (!(t instanceof CaseError)) return null; // the built-in classification, for native errors
    Map<String, Object> s = ((CaseError) t).spec;
    Failure.Builder b = Failure.builder();
    if (s.get("http_status") != null) b.httpStatus(((Number) s.get("http_status")).intValue());
    if (s.get("grpc_code") != null) b.grpcCode(((Number) s.get("grpc_code")).intValue());
    if (s.get("error_kind") != null) b.errorKind((String) s.get("error_kind"));
    if (s.get("retry_after") != null) b.retryAfter((String) s.get("retry_after"));
    if (s.get("method") != null) b.method((String) s.get("method"));
    return b;
  }

  static Throwable caseError(Map<String, Object> spec) {
    String message = (String) spec.get("message");
    if (spec.get("inner_retry") != null) {
      Map<String, Object> rest = new LinkedHashMap<>(spec);
      rest.remove("inner_retry");
      Throwable last = caseError(rest);
      Decision.Reason reason = reasonOf((String) spec.get("inner_retry"));
      // circuit_open: refused before any call, as Retry throws it.
      return new RetryException(reason, reason == Decision.Reason.CIRCUIT_OPEN ? 0 : 1, last, null, null, 0);
    }
    if (spec.get("native") != null) {
      switch ((String) spec.get("native")) {
        case "connection_refused":
          return new ConnectException(message);
        case "timeout":
          return new SocketTimeoutException(message);
        case "connect_timeout":
          return new java.net.http.HttpConnectTimeoutException(message);
        case "connection_reset":
          return new java.net.SocketException(message);
        case "dns_not_found":
          return new java.net.UnknownHostException(message);
        case "dns_temporary":
          return new java.net.UnknownHostException(message + ": Temporary failure in name resolution");
        default:
          throw new AssertionError("native " + spec.get("native"));
      }
    }
    return new CaseError(spec);
  }

  static Decision.Reason reasonOf(String name) {
    for (Decision.Reason r : Decision.Reason.values()) if (r.toString().equals(name)) return r;
    throw new AssertionError("reason " + name);
  }

  // -- header values as the README writes them ---------------------------------

  interface Res {
    String apply(String s);
  }

  @SuppressWarnings("unchecked")
  static Object toAmqp(Object v, Res res) {
    if (v instanceof String) return res.apply((String) v);
    if (v instanceof Map) {
      Map.Entry<String, Object> e = ((Map<String, Object>) v).entrySet().iterator().next();
      Object x = e.getValue();
      switch (e.getKey()) {
        case "int":
          return Long.parseLong(res.apply((String) x));
        case "float":
          return ((Number) x).doubleValue();
        case "bytes":
          return Base64.getDecoder().decode((String) x);
        case "timestamp":
          return new Date(((Number) x).longValue() * 1000);
        case "table": {
          Map<String, Object> m = new LinkedHashMap<>();
          ((Map<String, Object>) x).forEach((k, y) -> m.put(k, toAmqp(y, res)));
          return m;
        }
        case "array": {
          List<Object> l = new ArrayList<>();
          for (Object y : (List<Object>) x) l.add(toAmqp(y, res));
          return l;
        }
        default:
          throw new AssertionError("unknown header type " + e.getKey());
      }
    }
    return v; // Boolean, null
  }

  static Object fromAmqp(Object v) {
    if (v == null || v instanceof Boolean || v instanceof String) return v;
    if (v instanceof LongString) return new String(((LongString) v).getBytes(), StandardCharsets.UTF_8);
    if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) {
      return Map.of("int", v.toString());
    }
    if (v instanceof Double || v instanceof Float || v instanceof BigDecimal) return Map.of("float", ((Number) v).doubleValue());
    if (v instanceof byte[]) return Map.of("bytes", Base64.getEncoder().encodeToString((byte[]) v));
    if (v instanceof Date) return Map.of("timestamp", ((Date) v).getTime() / 1000);
    if (v instanceof Map) {
      Map<String, Object> m = new TreeMap<>();
      ((Map<?, ?>) v).forEach((k, y) -> m.put(k.toString(), fromAmqp(y)));
      return Map.of("table", m);
    }
    if (v instanceof List) {
      List<Object> l = new ArrayList<>();
      for (Object y : (List<?>) v) l.add(fromAmqp(y));
      return Map.of("array", l);
    }
    throw new AssertionError("unknown header value " + v.getClass());
  }

  static Map<String, Object> messageJson(AMQP.BasicProperties p, byte[] body) {
    Map<String, Object> out = new TreeMap<>();
    put(out, "message_id", p.getMessageId());
    put(out, "content_type", p.getContentType());
    put(out, "content_encoding", p.getContentEncoding());
    if (p.getDeliveryMode() != null && p.getDeliveryMode() != 0) out.put("delivery_mode", (long) p.getDeliveryMode());
    if (p.getPriority() != null && p.getPriority() != 0) out.put("priority", (long) p.getPriority());
    put(out, "correlation_id", p.getCorrelationId());
    put(out, "reply_to", p.getReplyTo());
    put(out, "expiration", p.getExpiration());
    put(out, "type", p.getType());
    put(out, "user_id", p.getUserId());
    put(out, "app_id", p.getAppId());
    Map<String, Object> h = new TreeMap<>();
    if (p.getHeaders() != null) p.getHeaders().forEach((k, v) -> {
      if (!k.equals("x-delivery-count")) h.put(k, fromAmqp(v));
    });
    if (!h.isEmpty()) out.put("headers", h);
    if (Rabbit.validUtf8(body)) {
      out.put("body", new String(body, StandardCharsets.UTF_8));
    } else {
      out.put("body_base64", Base64.getEncoder().encodeToString(body));
    }
    return out;
  }

  private static void put(Map<String, Object> m, String k, String v) {
    if (v != null && !v.isEmpty()) m.put(k, v);
  }

  @SuppressWarnings("unchecked")
  static AMQP.BasicProperties propsFrom(Map<String, Object> spec, Res res) {
    AMQP.BasicProperties.Builder b = new AMQP.BasicProperties.Builder();
    if (spec.containsKey("message_id")) b.messageId((String) spec.get("message_id"));
    if (spec.containsKey("content_type")) b.contentType((String) spec.get("content_type"));
    if (spec.containsKey("content_encoding")) b.contentEncoding((String) spec.get("content_encoding"));
    if (spec.containsKey("delivery_mode")) b.deliveryMode(((Number) spec.get("delivery_mode")).intValue());
    if (spec.containsKey("priority")) b.priority(((Number) spec.get("priority")).intValue());
    if (spec.containsKey("correlation_id")) b.correlationId((String) spec.get("correlation_id"));
    if (spec.containsKey("reply_to")) b.replyTo((String) spec.get("reply_to"));
    if (spec.containsKey("expiration")) b.expiration((String) spec.get("expiration"));
    if (spec.containsKey("type")) b.type((String) spec.get("type"));
    if (spec.containsKey("user_id")) b.userId((String) spec.get("user_id"));
    if (spec.containsKey("app_id")) b.appId((String) spec.get("app_id"));
    if (spec.get("timestamp") != null) b.timestamp(new Date(((Number) spec.get("timestamp")).longValue() * 1000));
    if (spec.containsKey("headers")) {
      Map<String, Object> h = new LinkedHashMap<>();
      ((Map<String, Object>) spec.get("headers")).forEach((k, v) -> h.put(k, toAmqp(v, res)));
      b.headers(h);
    }
    return b.build();
  }

  static byte[] bodyFrom(Map<String, Object> spec) {
    if (spec.containsKey("body_base64")) return Base64.getDecoder().decode((String) spec.get("body_base64"));
    return ((String) spec.getOrDefault("body", "")).getBytes(StandardCharsets.UTF_8);
  }

  // -- the spy ---------------------------------------------------------------------

  /** The case's policy, reporting what it was asked and answered; its breaker refuses when the case says so. */
  static final class Spy implements QueueRunner.Asker {
    final Map<String, Object> refuse;
    volatile Map<String, Object> asked;
    volatile Map<String, Object> decision;

    Spy(Map<String, Object> refuse) {
      this.refuse = refuse;
    }

    @Override
    public Outcome ask(Policy p, Outcome.Event e, Failure f, long deliveries, long max) {
      if (e == Outcome.Event.BEFORE && refuse != null) {
        long in = ((Number) refuse.getOrDefault("retry_in_ms", 0L)).longValue();
        return new Outcome(Outcome.Action.DEFER, Decision.Reason.CIRCUIT_OPEN, Decision.FailureClass.RETRYABLE, in, true,
            Outcome.Count.REFUSED, false, null);
      }
      Outcome o = p.outcome(e, f, deliveries, max);
      if (e == Outcome.Event.FAILURE) {
        Map<String, Object> a = new TreeMap<>();
        if (f.attempt != 0) a.put("attempt", f.attempt);
        if (f.httpStatus != 0) a.put("http_status", (long) f.httpStatus);
        if (f.grpcCode != 0) a.put("grpc_code", (long) f.grpcCode);
        if (f.errorKind.length > 0) a.put("error_kind", new String(f.errorKind, StandardCharsets.UTF_8));
        if (f.retryAfter.length > 0) a.put("retry_after", new String(f.retryAfter, StandardCharsets.UTF_8));
        if (f.prevDelayMs != 0) a.put("prev_delay_ms", f.prevDelayMs);
        if (f.retriedDownstream) a.put("retried_downstream", true);
        if (f.serverDeclined) a.put("server_declined", true);
        asked = a;
        Map<String, Object> d = new TreeMap<>();
        d.put("action", o.action() == Outcome.Action.RETRY ? "retry" : "dead_letter");
        d.put("reason", o.reason().toString());
        if (o.action() == Outcome.Action.RETRY) d.put("delay_ms", o.delayMs());
        decision = d;
      }
      return o;
    }
  }

  // -- one case --------------------------------------------------------------------

  static void until(String what, BooleanSupplier cond) throws InterruptedException {
    long end = System.nanoTime() + 30_000_000_000L;
    while (!cond.getAsBoolean()) {
      if (System.nanoTime() > end) throw new AssertionError("timed out waiting for " + what);
      Thread.sleep(10); // bounded polling for a condition
    }
  }

  static List<String> levels() {
    List<String> out = new ArrayList<>();
    for (int n = 0; n < Rabbit.HOLD_LEVELS; n++) out.add(Rabbit.hold(n));
    for (int n = 0; n < Rabbit.LEVELS; n++) out.add(Rabbit.level(n));
    return out;
  }

  static Channel fresh(Connection conn, Channel ch) throws IOException {
    return ch != null && ch.isOpen() ? ch : conn.createChannel();
  }

  static void setup(Connection conn) throws IOException {
    Channel ch = conn.createChannel();
    ch.queueDelete(Q);
    ch.queueDelete(Q + ".dlq");
    ch.exchangeDelete(Q + ".delay");
    ch.exchangeDelete(Q + ".due");
    for (String name : levels()) {
      try {
        ch.queuePurge(name);
      } catch (IOException e) {
        ch = fresh(conn, null); // not declared yet
      }
    }
    if (ch.isOpen()) ch.abort();
  }

  static List<GetResponse> drain(Channel ch, String name) throws IOException {
    List<GetResponse> out = new ArrayList<>();
    for (GetResponse g; (g = ch.basicGet(name, true)) != null; ) out.add(g);
    return out;
  }

  static long count(Channel ch, String name) {
    try {
      return ch.queueDeclarePassive(name).getMessageCount();
    } catch (IOException e) {
      throw new AssertionError(e);
    }
  }

  @SuppressWarnings("unchecked")
  static Object runCase(String url, Map<String, Object> c, long lateMs) throws Exception {
    ConnectionFactory f = new ConnectionFactory();
    f.setUri(url);
    f.setVirtualHost("/");
    try (Connection conn = f.newConnection("cases"); RabbitBroker b = RabbitBroker.connect(url)) {
      long base = System.currentTimeMillis() - lateMs;
      TreeSet<Long> known = new TreeSet<>(List.of(0L));
      Res res = s -> {
        Matcher m = NOW.matcher(s);
        StringBuilder out = new StringBuilder();
        while (m.find()) {
          long off = m.group(1) == null ? 0 : Long.parseLong(m.group(1));
          known.add(off);
          m.appendReplacement(out, Long.toString(base + off));
        }
        m.appendTail(out);
        return out.toString();
      };
      setup(conn);
      RabbitQueue q = b.queue(Q, ((Number) FILE.get("max_deliveries")).intValue());
      q.declare();
      Channel ch = conn.createChannel();
      ch.confirmSelect();
      // A copy of every message the worker delays.
      String tap = ch.queueDeclare().getQueue();
      ch.queueBind(tap, Rabbit.ENTER, "#");
      List<Map<String, Object>> dlq = (List<Map<String, Object>>) c.getOrDefault("dlq", List.of());
      for (Map<String, Object> spec : dlq) ch.basicPublish("", Q + ".dlq", propsFrom(spec, res), bodyFrom(spec));
      ch.waitForConfirmsOrDie(30_000);
      Map<String, Object> ev = (Map<String, Object>) c.get("event");
      Map<String, String> texts = new LinkedHashMap<>();
      Map<String, Object> reply = new TreeMap<>();
      Map<String, Object> counters = new TreeMap<>();
      String ownDue = null;
      if (ev.get("type").equals("handle")) {
        Map<String, Object> d = (Map<String, Object>) c.get("delivery");
        Map<String, Object> spec = (Map<String, Object>) d.get("message");
        AMQP.BasicProperties props = propsFrom(spec, res);
        Object due = props.getHeaders() == null ? null : props.getHeaders().get("backstop-due-ms");
        ownDue = due instanceof String ? (String) due : null;
        ch.basicPublish("", Q, props, bodyFrom(spec));
        ch.waitForConfirmsOrDie(30_000);
        long returns = ((Number) d.getOrDefault("returns", 0L)).longValue();
        for (long i = 0; i < returns; i++) {
          GetResponse g;
          while ((g = ch.basicGet(Q, false)) == null) Thread.sleep(5); // bounded by the published message
          ch.basicNack(g.getEnvelope().getDeliveryTag(), false, true);
        }
        Map<String, Object> error = (Map<String, Object>) ev.get("error");
        boolean deadline = Boolean.TRUE.equals(ev.get("deadline"));
        AtomicBoolean ran = new AtomicBoolean();
        CountDownLatch release = new CountDownLatch(1);
        QueueHandler<RabbitJob> handler = job -> {
          ran.set(true);
          if (deadline) {
            // It overruns the worker's deadline, ignoring its interrupt.
            texts.put(QueueRunner.errorText(new TimeoutException("handler deadline exceeded after " + DEADLINE_MS
                + " ms")), "{deadline_error}");
            while (true) {
              try {
                release.await();
                return;
              } catch (InterruptedException e) {
                // ignored, as a handler that does not look at its interrupt
              }
            }
          }
          if (error != null) {
            Throwable t = caseError(error);
            texts.put(QueueRunner.errorText(t), (String) error.get("message"));
            texts.put(Rabbit.boundedError(QueueRunner.errorText(t)), Rabbit.boundedError((String) error.get("message")));
            if (t instanceof Exception) throw (Exception) t;
            throw new AssertionError(t);
          }
        };
        Map<String, Object> refuse = (Map<String, Object>) ev.get("refuse");
        if (refuse != null) known.add(((Number) refuse.getOrDefault("retry_in_ms", 0L)).longValue());
        PrometheusRegistry reg = new PrometheusRegistry();
        Spy spy = new Spy(refuse);
        WorkOptions o = WorkOptions.defaults().withPrefetch(1).withMetrics(reg, "cases")
            .withClassifier(RabbitCasesTest::classify).withoutMover().withAsker(spy);
        if (deadline) o = o.withHandlerTimeout(java.time.Duration.ofMillis(DEADLINE_MS));
        try (Policy policy = Policy.load(Repo.write(FILE.get("policy")))) {
          RabbitWorker w = q.work(policy, handler, o);
          Channel look = conn.createChannel();
          long before = dlq.size();
          until("the worker to do something with the delivery",
              () -> ran.get() || count(look, Q + ".dlq") + count(look, tap) != before);
          w.close(); // graceful: the delivery in hand is finished first
          release.countDown();
          look.close();
        }
        reply.put("ran", ran.get());
        if (spy.asked != null) {
          reply.put("failure", spy.asked);
          reply.put("decision", spy.decision);
          if (spy.decision.containsKey("delay_ms")) known.add((Long) spy.decision.get("delay_ms"));
        }
        counters = samples(reg);
      } else {
        try {
          int limit = ((Number) ev.getOrDefault("limit", 0L)).intValue();
          reply.put("replayed", (long) q.replay(limit, (String) ev.get("reason"),
              Boolean.TRUE.equals(ev.get("keep_attempts"))));
        } catch (IllegalArgumentException e) {
          reply.put("refused", true);
        }
      }
      long end = System.currentTimeMillis();
      Map<String, Object> state = new TreeMap<>();
      List<Object> work = new ArrayList<>();
      for (GetResponse g : drain(ch, Q)) work.add(messageJson(g.getProps(), g.getBody()));
      List<Object> dead = new ArrayList<>();
      for (GetResponse g : drain(ch, Q + ".dlq")) dead.add(messageJson(g.getProps(), g.getBody()));
      long delayedN = count(ch, tap);
      List<Object[]> got = new ArrayList<>();
      until("the delayed messages in the levels", () -> {
        try {
          for (String name : levels()) for (GetResponse g : drain(ch, name)) got.add(new Object[] {name, g});
        } catch (IOException e) {
          throw new AssertionError(e);
        }
        return got.size() >= delayedN;
      });
      List<Object> delayed = new ArrayList<>();
      for (Object[] x : got) {
        GetResponse g = (GetResponse) x[1];
        Map<String, Object> entry = new TreeMap<>();
        entry.put("queue", x[0]);
        entry.put("routing_key", g.getEnvelope().getRoutingKey());
        entry.put("message", messageJson(g.getProps(), g.getBody()));
        Object due = g.getProps().getHeaders() == null ? null : g.getProps().getHeaders().get("backstop-due-ms");
        String dueS = due == null ? null : due.toString();
        if (dueS != null && dueS.equals(ownDue) && dueKeyFits(g.getEnvelope().getRoutingKey(), (String) x[0], dueS, base, end)) {
          entry.put("queue", "{due}");
          entry.put("routing_key", "{due}");
        }
        delayed.add(entry);
      }
      state.put("work", sorted(work));
      state.put("dlq", sorted(dead));
      state.put("delayed", sorted(delayed));
      state.put("counters", counters);
      state.put("reply", reply);
      ch.abort();
      return normalise(state, base, end, known, texts);
    }
  }

  static boolean dueKeyFits(String key, String level, String due, long base, long end) {
    String[] words = key.split("\\.", -1);
    if (!due.matches("[0-9]{13}") || words.length != Rabbit.LEVELS) return false;
    long s = 0;
    for (String w : words) {
      if (!w.equals("0") && !w.equals("1")) return false;
      s = s * 2 + (w.equals("1") ? 1 : 0);
    }
    long dueMs = Long.parseLong(due);
    long lo = Math.min(-Math.floorDiv(end - dueMs, 1000), Rabbit.MAX_HOP_S);
    long hi = Math.min(-Math.floorDiv(base - dueMs, 1000), Rabbit.MAX_HOP_S);
    return s > 0 && s <= Rabbit.MAX_HOP_S && lo <= s && s <= hi
        && level.equals(Rabbit.hold(63 - Long.numberOfLeadingZeros(s)));
  }

  @SuppressWarnings("unchecked")
  static List<Object> sorted(List<Object> l) {
    List<Object> out = new ArrayList<>(l);
    out.sort((a, b) -> {
      Map<String, Object> ma = (Map<String, Object>) a;
      Map<String, Object> mb = (Map<String, Object>) b;
      Map<String, Object> msgA = ma.containsKey("message") ? (Map<String, Object>) ma.get("message") : ma;
      Map<String, Object> msgB = mb.containsKey("message") ? (Map<String, Object>) mb.get("message") : mb;
      int c = ((String) msgA.getOrDefault("message_id", "")).compareTo((String) msgB.getOrDefault("message_id", ""));
      return c != 0 ? c : Repo.write(a).compareTo(Repo.write(b));
    });
    return out;
  }

  static Map<String, Object> samples(PrometheusRegistry reg) throws IOException {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    PrometheusTextFormatWriter.create().write(out, reg.scrape());
    Map<String, String> types = new LinkedHashMap<>();
    Map<String, Object> s = new TreeMap<>();
    Pattern sample = Pattern.compile("^([^{ ]+)(?:\\{(.*)\\})? (\\S+)$");
    for (String line : out.toString(StandardCharsets.UTF_8).split("\n")) {
      if (line.startsWith("# TYPE ")) {
        String[] p = line.split(" ");
        types.put(p[2], p[3]);
        continue;
      }
      if (line.startsWith("#") || line.isEmpty()) continue;
      Matcher m = sample.matcher(line);
      if (!m.matches()) continue;
      String name = m.group(1);
      String fam = types.keySet().stream().filter(name::startsWith).reduce("", (x, y) -> y.length() > x.length() ? y : x);
      String type = types.getOrDefault(fam, "");
      if (!type.equals("counter") && !type.equals("histogram")) continue;
      if (name.endsWith("_created") || (type.equals("histogram") && !name.endsWith("_count") && !name.endsWith("_sum"))) continue;
      if (fam.endsWith("_seconds")) continue;
      double v = Double.parseDouble(m.group(3));
      if (v == 0) continue;
      TreeSet<String> labels = new TreeSet<>();
      if (m.group(2) != null && !m.group(2).isEmpty()) {
        Matcher lm = Pattern.compile("([a-zA-Z_]+)=\"((?:[^\"\\\\]|\\\\.)*)\"").matcher(m.group(2));
        while (lm.find()) labels.add(lm.group(1) + "=\"" + lm.group(2) + "\"");
      }
      s.put(name + "{" + String.join(",", labels) + "}", v == Math.rint(v) ? (Object) (long) v : (Object) v);
    }
    return s;
  }

  // -- normalising ---------------------------------------------------------------------

  @SuppressWarnings("unchecked")
  static Object walk(Object v, java.util.function.UnaryOperator<String> f) {
    if (v instanceof String) return f.apply((String) v);
    if (v instanceof Map) {
      Map<String, Object> out = new TreeMap<>();
      ((Map<String, Object>) v).forEach((k, x) -> out.put(f.apply(k), walk(x, f)));
      return out;
    }
    if (v instanceof List) {
      List<Object> out = new ArrayList<>();
      for (Object x : (List<Object>) v) out.add(walk(x, f));
      return out;
    }
    return v;
  }

  static Object normalise(Object state, long base, long end, TreeSet<Long> known, Map<String, String> texts) {
    Object s = walk(state, x -> ADOPTED.matcher(x).replaceAll("{adopted_id}"));
    s = walk(s, x -> {
      for (Map.Entry<String, String> e : texts.entrySet()) x = x.replace(e.getKey(), e.getValue());
      return x;
    });
    return walk(s, x -> relativeTimes(x, base, end, known));
  }

  /**
   * Writes each unix-ms time in x that falls in base..end after one of the
   * known offsets as {now}, {now+d} or {now-d}, so a state compares
   * whenever the case ran (the Redis cases read the same way).
   */
  static String relativeTimes(String x, long base, long end, TreeSet<Long> known) {
    Matcher m = MS.matcher(x);
    StringBuilder out = new StringBuilder();
    while (m.find()) {
      long n = Long.parseLong(m.group());
      String r = m.group();
      for (long d : known) {
        if (base <= n - d && n - d <= end) {
          r = d == 0 ? "{now}" : d > 0 ? "{now+" + d + "}" : "{now" + d + "}";
          break;
        }
      }
      m.appendReplacement(out, Matcher.quoteReplacement(r));
    }
    m.appendTail(out);
    return out.toString();
  }

  static Object canonical(Object v) {
    return walk(v, x -> x);
  }

  // -- the tests -----------------------------------------------------------------------

  @SuppressWarnings("unchecked")
  static List<Map<String, Object>> cases() {
    return (List<Map<String, Object>>) FILE.get("cases");
  }

  @Test
  void theCasesAreThere() {
    // Written by `make rabbitmq-cases` (Go); a missing file is a failure, not a skip.
    assertTrue(cases().size() >= 60, "testdata/rabbitmq/cases.json has " + cases().size() + " cases");
  }

  @TestFactory
  Stream<DynamicTest> everyCase() throws Exception {
    String url = RabbitServer.get().url;
    return cases().stream().map(c -> DynamicTest.dynamicTest((String) c.get("name"), () -> {
      Object got = runCase(url, c, 0);
      assertEquals(Repo.write(canonical(c.get("expect"))), Repo.write(canonical(got)));
    }));
  }

  @TestFactory
  Stream<DynamicTest> earlyCasesWithTheWorkerLate() throws Exception {
    // The worker reaching the delivery more than a second late (a loaded
    // machine): the remainder it re-delays for is a second shorter, and the
    // case must still hold.
    String url = RabbitServer.get().url;
    return cases().stream().filter(c -> ((String) c.get("name")).startsWith("early/"))
        .map(c -> DynamicTest.dynamicTest((String) c.get("name") + " (late)", () -> {
          Object got = runCase(url, c, 1500);
          assertEquals(Repo.write(canonical(c.get("expect"))), Repo.write(canonical(got)));
        }));
  }
}
