package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.protocol.CommandType;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.TimeoutException;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/**
 * The shared queue cases (testdata/queue/cases.json, see its README)
 * replayed through the Java Redis worker's path against a real redis-server:
 * the job as the reader makes it, the failure classified, decided by
 * backstop.wasm and applied through the scripts (RedisQueue.apply), then every
 * key compared with what the Go worker left; as Python's test_queue_cases.py.
 */
class RedisCasesTest {
  static final Map<String, Object> FILE = Repo.json("testdata/queue/cases.json");
  static final Pattern NOW = Pattern.compile("\\{now([+-][0-9]+)?\\}");
  static final Pattern NEW_ID = Pattern.compile("\\b[0-9]{13}-[0-9]+\\b");
  static RedisClient client;

  @AfterAll
  static void shutdown() {
    if (client != null) client.shutdown();
  }

  static RedisQueue queue() throws Exception {
    synchronized (RedisCasesTest.class) {
      if (client == null) {
        client = RedisClient.create(RedisServer.get().url);
        // RESP2 and raw replies, as the Python replay: RESP3 gives scores as doubles.
        client.setOptions(io.lettuce.core.ClientOptions.builder()
            .protocolVersion(io.lettuce.core.protocol.ProtocolVersion.RESP2).build());
      }
    }
    return RedisQueue.create(client, (String) FILE.get("queue"), RedisQueue.Keys.of((String) FILE.get("queue")),
        (String) FILE.get("group"));
  }

  static byte[] b(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  static Object cmd(RedisQueue q, String name, Object... args) {
    List<byte[]> a = new ArrayList<>();
    String[] words = name.split(" ");
    for (int i = 1; i < words.length; i++) a.add(b(words[i]));
    for (Object x : args) a.add(x instanceof byte[] ? (byte[]) x : b(String.valueOf(x)));
    return q.call(CommandType.valueOf(words[0]), a);
  }

  static String text(Object v) {
    return v instanceof byte[] ? Redis.text((byte[]) v) : String.valueOf(v);
  }

  @SuppressWarnings("unchecked")
  static List<Object> list(Object v) {
    return (List<Object>) v;
  }

  static String res(String s, long base, TreeSet<Long> known) {
    Matcher m = NOW.matcher(s);
    StringBuilder out = new StringBuilder();
    while (m.find()) {
      long off = m.group(1) == null ? 0 : Long.parseLong(m.group(1));
      known.add(off);
      m.appendReplacement(out, Long.toString(base + off));
    }
    m.appendTail(out);
    return out.toString();
  }

  @SuppressWarnings("unchecked")
  static void setup(RedisQueue q, Map<String, Object> state, long base, TreeSet<Long> known) {
    RedisQueue.Keys k = q.keys();
    for (Map<String, Object> e : (List<Map<String, Object>>) state.getOrDefault("jobs", List.of())) {
      List<Object> a = new ArrayList<>(List.of(k.jobs(), res((String) e.get("id"), base, known)));
      for (Object f : (List<Object>) e.get("fields")) a.add(res((String) f, base, known));
      cmd(q, "XADD", a.toArray());
    }
    cmd(q, "XGROUP CREATE", k.jobs(), FILE.get("group"), "0", "MKSTREAM");
    for (Map<String, Object> e : (List<Map<String, Object>>) state.getOrDefault("jobs", List.of())) {
      Map<String, Object> p = (Map<String, Object>) e.get("pending");
      if (p != null) {
        cmd(q, "XCLAIM", k.jobs(), FILE.get("group"), p.get("consumer"), 0, res((String) e.get("id"), base, known),
            "IDLE", p.get("idle_ms"), "RETRYCOUNT", p.get("deliveries"), "FORCE", "JUSTID");
      }
    }
    for (Map<String, Object> e : (List<Map<String, Object>>) state.getOrDefault("dlq", List.of())) {
      List<Object> a = new ArrayList<>(List.of(k.dlq(), res((String) e.get("id"), base, known)));
      for (Object f : (List<Object>) e.get("fields")) a.add(res((String) f, base, known));
      cmd(q, "XADD", a.toArray());
    }
    for (Map<String, Object> m : (List<Map<String, Object>>) state.getOrDefault("delayed", List.of())) {
      cmd(q, "ZADD", k.delayed(), res((String) m.get("score"), base, known), res((String) m.get("member"), base, known));
    }
    for (Map.Entry<String, Object> f : ((Map<String, Object>) state.getOrDefault("stats", Map.of())).entrySet()) {
      cmd(q, "HSET", k.stats(), f.getKey(), res((String) f.getValue(), base, known));
    }
    for (List<Object> raw : (List<List<Object>>) state.getOrDefault("raw", List.of())) {
      Object[] a = new Object[raw.size() - 1];
      for (int i = 1; i < raw.size(); i++) a[i - 1] = res((String) raw.get(i), base, known);
      String c = (String) raw.get(0);
      // Lettuce names a few commands apart (SET is SET; a subcommand goes in the words).
      cmd(q, c.toUpperCase(), a);
    }
  }

  static Map<String, Object> dump(RedisQueue q) {
    RedisQueue.Keys k = q.keys();
    Map<String, String> names = Map.of(k.jobs(), "jobs", k.delayed(), "delayed", k.dlq(), "dlq", k.stats(), "stats");
    Map<String, Object> out = new TreeMap<>();
    TreeSet<String> keys = new TreeSet<>();
    for (Object x : list(cmd(q, "KEYS", "*"))) keys.add(text(x));
    for (String key : keys) {
      String name = names.getOrDefault(key, key);
      String typ = text(list(cmd(q, "TYPE", key)).get(0));
      Map<String, Object> v = new TreeMap<>();
      v.put("type", typ);
      if (typ.equals("stream")) {
        List<Object> entries = new ArrayList<>();
        for (Object e : list(cmd(q, "XRANGE", key, "-", "+"))) {
          List<Object> fs = new ArrayList<>();
          for (Object f : list(list(e).get(1))) fs.add(text(f));
          entries.add(List.of(text(list(e).get(0)), fs));
        }
        List<Object> groups = new ArrayList<>();
        for (Object g : list(cmd(q, "XINFO GROUPS", key))) {
          List<Object> gl = list(g);
          Map<String, Object> gm = new LinkedHashMap<>();
          for (int i = 0; i + 1 < gl.size(); i += 2) gm.put(text(gl.get(i)), gl.get(i + 1));
          List<Object> pend = new ArrayList<>();
          for (Object p : list(cmd(q, "XPENDING", key, text(gm.get("name")), "-", "+", 10000))) {
            List<Object> pl = list(p);
            pend.add(List.of(text(pl.get(0)), text(pl.get(1)), (Long) pl.get(3)));
          }
          Map<String, Object> gg = new TreeMap<>();
          gg.put("name", text(gm.get("name")));
          gg.put("last_delivered_id", text(gm.get("last-delivered-id")));
          gg.put("pending", pend);
          groups.add(gg);
        }
        v.put("entries", entries);
        v.put("groups", groups);
      } else if (typ.equals("zset")) {
        List<Object> ms = new ArrayList<>();
        List<Object> z = list(cmd(q, "ZRANGE", key, 0, -1, "WITHSCORES"));
        for (int i = 0; i + 1 < z.size(); i += 2) ms.add(List.of(text(z.get(i)), text(z.get(i + 1))));
        v.put("members", ms);
      } else if (typ.equals("hash")) {
        Map<String, Object> fs = new TreeMap<>();
        List<Object> h = list(cmd(q, "HGETALL", key));
        for (int i = 0; i + 1 < h.size(); i += 2) fs.put(text(h.get(i)), text(h.get(i + 1)));
        v.put("fields", fs);
      } else if (typ.equals("string")) {
        v.put("value", text(list(cmd(q, "GET", key)).get(0)));
      }
      out.put(name, v);
    }
    return out;
  }

  /** The policy, reporting the failure it was asked about. */
  static final class Spy implements QueueRunner.Asker {
    volatile Map<String, Object> asked;

    @Override
    public Outcome ask(Policy p, Outcome.Event e, Failure f, long deliveries, long max) {
      if (e == Outcome.Event.FAILURE) {
        Map<String, Object> a = new TreeMap<>();
        if (f.httpStatus != 0) a.put("http_status", (long) f.httpStatus);
        if (f.grpcCode != 0) a.put("grpc_code", (long) f.grpcCode);
        if (f.errorKind.length > 0) a.put("error_kind", new String(f.errorKind, StandardCharsets.UTF_8));
        if (f.retryAfter.length > 0) a.put("retry_after", new String(f.retryAfter, StandardCharsets.UTF_8));
        if (f.method.length > 0) a.put("method", new String(f.method, StandardCharsets.UTF_8));
        if (f.retriedDownstream) a.put("retried_downstream", true);
        if (f.serverDeclined) a.put("server_declined", true);
        asked = a;
      }
      return p.outcome(e, f, deliveries, max);
    }
  }

  @SuppressWarnings("unchecked")
  static Object run(RedisQueue q, Policy policy, Map<String, Object> c) {
    cmd(q, "FLUSHALL");
    long base = q.serverTimeMs();
    TreeSet<Long> known = new TreeSet<>(List.of(0L));
    setup(q, (Map<String, Object>) c.get("state"), base, known);
    Map<String, Object> ev = new LinkedHashMap<>((Map<String, Object>) c.get("event"));
    if (ev.containsKey("entry")) ev.put("entry", res((String) ev.get("entry"), base, known));
    if (ev.containsKey("entries")) {
      List<String> es = new ArrayList<>();
      for (Object e : (List<Object>) ev.get("entries")) es.add(res((String) e, base, known));
      ev.put("entries", es);
    }
    Map<String, Object> spec = (Map<String, Object>) ev.get("error");
    Throwable exc = spec == null ? null : RabbitCasesTest.caseError(spec);
    Map<String, String> texts = new LinkedHashMap<>();
    if (exc != null) texts.put(QueueRunner.errorText(exc), (String) spec.get("message"));
    if (Boolean.TRUE.equals(ev.get("deadline"))) {
      exc = new TimeoutException("handler deadline exceeded after 50 ms");
      texts.clear();
      texts.put(QueueRunner.errorText(exc), "{deadline_error}");
    }
    Throwable failure = exc;
    WorkOptions o = WorkOptions.defaults().withClassifier(RabbitCasesTest::classify);
    java.util.function.Function<RedisJob, Object> apply = job -> {
      Spy spy = new Spy();
      QueueRunner runner = new QueueRunner(q.name(), policy, o.withAsker(spy), Redis.MALFORMED);
      QueuePlan plan = runner.plan(policy, job.attempt(), job.id(), job.firstEnqueuedMs(), job.prevDelayMs(),
          job.malformed(), job.malformed() ? null : failure, System.currentTimeMillis());
      RedisQueue.Applied a;
      try {
        a = q.apply(job, plan);
      } catch (RedisCommandExecutionException e) {
        return Map.of("refused", true);
      }
      Map<String, Object> reply = new TreeMap<>();
      reply.put("action", a.action());
      reply.put("reason", a.reason());
      reply.put("applied", a.applied());
      if (spy.asked != null) reply.put("failure", spy.asked);
      if (a.action().equals("retry")) {
        reply.put("delay_ms", plan.delayMs());
        known.add(plan.delayMs());
      }
      return reply;
    };
    Object reply;
    try {
      switch ((String) ev.get("type")) {
        case "handle":
        case "read": {
          List<Object> got = list(cmd(q, "XRANGE", q.keys().jobs(), ev.get("entry"), ev.get("entry")));
          List<Object> e = list(got.get(0));
          List<byte[]> flat = new ArrayList<>();
          for (Object f : list(e.get(1))) flat.add((byte[]) f);
          RedisJob job = Redis.jobFrom(text(e.get(0)), flat);
          reply = ev.get("type").equals("handle") ? apply.apply(job) : Map.of("job", readReply(job));
          break;
        }
        case "defer": {
          long delay = ((Number) ev.getOrDefault("delay_ms", 0L)).longValue();
          known.add(delay);
          long due = q.defer((String) ev.get("entry"), delay, (String) ev.getOrDefault("reason", ""),
              (String) ev.getOrDefault("last_error", ""));
          reply = Map.of("action", "defer", "reason", ev.getOrDefault("reason", ""), "applied", due != 0, "delay_ms", delay);
          break;
        }
        case "promote": {
          RedisQueue.Promoted p = q.promote(((Number) ev.getOrDefault("limit", 0L)).intValue());
          reply = Map.of("moved", p.moved(), "next_due", p.nextDueMs() >= 0);
          break;
        }
        case "reclaim": {
          RedisQueue.Reclaimed r = q.reclaim((String) FILE.get("consumer"),
              ((Number) ev.getOrDefault("min_idle_ms", 0L)).longValue(), ((Number) ev.getOrDefault("count", 0L)).intValue(),
              ((Number) ev.getOrDefault("max_deliveries", 0L)).longValue());
          List<Object> claimed = new ArrayList<>();
          List<Object> outcomes = new ArrayList<>();
          for (RedisJob j : r.jobs()) claimed.add(j.entryId());
          for (RedisJob j : r.jobs()) outcomes.add(apply.apply(j));
          List<Object> skipped = new ArrayList<>();
          for (String[] s : r.skipped()) skipped.add(List.of(s[0], s[1]));
          reply = Map.of("dead_lettered", r.deadLettered(), "claimed", claimed, "skipped", skipped, "outcomes", outcomes);
          break;
        }
        case "run": {
          RedisQueue.Ran ran = ev.get("before") != null
              ? q.runDueBefore(Long.parseLong(res((String) ev.get("before"), base, known)),
                  ((Number) ev.getOrDefault("limit", 0L)).intValue())
              : q.run((String) ev.getOrDefault("job_id", ""));
          reply = Map.of("moved", ran.moved(), "left", ran.left());
          break;
        }
        case "replay": {
          String reason = (String) ev.get("reason");
          String type = (String) ev.get("job_type");
          reply = Map.of("replayed", q.replay(((Number) ev.getOrDefault("limit", 0L)).longValue(),
              reason == null || reason.isEmpty() ? null : reason, type == null || type.isEmpty() ? null : type));
          break;
        }
        case "hold":
          reply = Map.of("held", q.hold((String) ev.get("consumer"), (List<String>) ev.get("entries")));
          break;
        case "enqueue": {
          String type = (String) ev.get("job_type");
          reply = Map.of("entry", q.enqueue((String) ev.getOrDefault("job_id", ""),
              b((String) ev.getOrDefault("payload", "")), type == null || type.isEmpty() ? null : type));
          break;
        }
        default:
          throw new AssertionError("unknown event " + ev.get("type"));
      }
    } catch (RedisCommandExecutionException | IllegalArgumentException e) {
      reply = Map.of("refused", true);
    }
    long end = q.serverTimeMs();
    return normalise(List.of(reply, dump(q)), base, end, known, texts);
  }

  static Map<String, Object> readReply(RedisJob job) {
    if (job.malformed()) return Map.of("malformed", true);
    Map<String, Object> r = new TreeMap<>();
    r.put("id", job.id());
    r.put("attempt", Long.toString(job.attempt()));
    r.put("first_enqueued_ms", Long.toString(job.firstEnqueuedMs()));
    r.put("payload", Redis.text(job.payload()));
    r.put("type", job.jobType());
    r.put("last_error", job.lastError());
    r.put("last_reason", job.lastReason());
    r.put("prev_delay_ms", Long.toString(job.prevDelayMs()));
    r.put("malformed", false);
    return r;
  }

  static String esc(String t) {
    String q = Repo.write(t);
    return q.substring(1, q.length() - 1);
  }

  static Object normalise(Object v, long base, long end, TreeSet<Long> known, Map<String, String> texts) {
    String s = Repo.write(RabbitCasesTest.canonical(v));
    for (Map.Entry<String, String> t : texts.entrySet()) {
      s = s.replace(esc(esc(t.getKey())), esc(esc(t.getValue()))).replace(esc(t.getKey()), esc(t.getValue()));
    }
    Map<String, String> ids = new LinkedHashMap<>();
    Matcher m = NEW_ID.matcher(s);
    StringBuilder out = new StringBuilder();
    while (m.find()) m.appendReplacement(out, ids.computeIfAbsent(m.group(), x -> "new:" + (ids.size() + 1)));
    m.appendTail(out);
    try {
      return RabbitCasesTest.canonical(Json.parse(RabbitCasesTest.relativeTimes(out.toString(), base, end, known)));
    } catch (Json.SyntaxException e) {
      throw new AssertionError(e);
    }
  }

  @SuppressWarnings("unchecked")
  static List<Map<String, Object>> cases() {
    return (List<Map<String, Object>>) FILE.get("cases");
  }

  @Test
  void atLeast200Cases() {
    assertTrue(cases().size() >= 200);
  }

  @TestFactory
  Stream<DynamicTest> everyCase() throws Exception {
    RedisQueue q = queue();
    Policy policy = Policy.load(Repo.write(FILE.get("policy")));
    return cases().stream().map(c -> DynamicTest.dynamicTest((String) c.get("name"), () -> {
      Object got = run(q, policy, c);
      Map<String, Object> expect = (Map<String, Object>) c.get("expect");
      Object want = RabbitCasesTest.canonical(List.of(expect.get("reply"), expect.get("state")));
      assertEquals(Repo.write(want), Repo.write(got));
    }));
  }
}
