package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.sync.RedisCommands;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/**
 * testdata/idempotency/cases.json (README.md there): every shared case,
 * replayed through IdempotencyStore against a real redis-server, gives the
 * replies and the record the Go store gives. Its runner ({@link #replay})
 * replays them through PgIdempotencyStore too (PgIdempotencyCasesTest).
 */
class IdempotencyCasesTest {
  static RedisClient client;
  static StatefulRedisConnection<String, String> raw;
  static RedisCommands<String, String> r;

  @BeforeAll
  static void start() throws Exception {
    client = RedisClient.create(RedisServer.get().url);
    raw = client.connect();
    r = raw.sync();
  }

  @AfterAll
  static void stop() {
    raw.close();
    client.shutdown();
  }

  /** Maps with their keys sorted, all the way down: JSON objects compared as Go writes them. */
  static Object canon(Object v) {
    if (v instanceof Map) {
      Map<String, Object> out = new TreeMap<>();
      ((Map<?, ?>) v).forEach((k, x) -> out.put((String) k, canon(x)));
      return out;
    }
    if (v instanceof List) return ((List<?>) v).stream().map(IdempotencyCasesTest::canon).toList();
    if (v instanceof Integer) return ((Integer) v).longValue();
    return v;
  }

  static long serverMs() {
    List<String> t = r.time();
    return Long.parseLong(t.get(0)) * 1000 + Long.parseLong(t.get(1)) / 1000;
  }

  /**
   * What the runner does under the store (README.md there, "Steps"): on the
   * Redis hash here, on the row for PostgreSQL (PgIdempotencyCasesTest).
   */
  interface Raw {
    /** Removes the record: a case starts without one. */
    void reset() throws Exception;

    /** lapse: the owner's lease ended a second ago. */
    void lapse() throws Exception;

    /** expire: the retention has run out. */
    void expire() throws Exception;

    /** write: the record as another adapter (or a version before the header rule) stored it. */
    void write(Map<String, String> fields) throws Exception;

    /** The record after, as the cases compare it; null when absent. */
    Map<String, Object> record(Map<String, String> tokens) throws Exception;
  }

  /** The store's options the file sets (lease, retention, max body). */
  static IdempotencyStore.Options options(Map<String, Object> file) {
    return IdempotencyStore.Options.defaults().withRetention(Duration.ofMillis((Long) file.get("retention_ms")))
        .withLease(Duration.ofMillis((Long) file.get("lease_ms"))).withMaxBody(((Long) file.get("max_body")).intValue());
  }

  /** testdata/idempotency/cases.json, checked to hold the cases. */
  @SuppressWarnings("unchecked")
  static Map<String, Object> file() {
    Map<String, Object> file = Repo.json("testdata/idempotency/cases.json");
    List<Map<String, Object>> cases = (List<Map<String, Object>>) file.get("cases");
    assertTrue(cases.size() >= 30, cases.size() + " cases");
    return file;
  }

  @TestFactory
  Stream<DynamicTest> everySharedCase() {
    Map<String, Object> file = file();
    IdempotencyStore store = IdempotencyStore.create(client, options(file));
    String rk = store.recordKey((String) file.get("scope"), (String) file.get("key"));
    long retention = (Long) file.get("retention_ms");
    return replay(file, store, new Raw() {
      @Override
      public void reset() {
        r.del(rk);
      }

      @Override
      public void lapse() {
        r.hset(rk, "lease_until", Long.toString(serverMs() - 1000));
      }

      @Override
      public void expire() {
        r.del(rk);
      }

      @Override
      public void write(Map<String, String> fields) {
        r.hset(rk, fields);
        r.pexpire(rk, retention);
      }

      @Override
      public Map<String, Object> record(Map<String, String> tokens) throws Exception {
        return IdempotencyCasesTest.record(rk, tokens);
      }
    });
  }

  /** Every case of file through store, raw reaching under it; each a test of its own. */
  @SuppressWarnings("unchecked")
  static Stream<DynamicTest> replay(Map<String, Object> file, IdempotencyBackend store, Raw raw) {
    List<Map<String, Object>> cases = (List<Map<String, Object>>) file.get("cases");
    String scope = (String) file.get("scope");
    String key = (String) file.get("key");
    return cases.stream().map(c -> DynamicTest.dynamicTest((String) c.get("name"), () -> {
      raw.reset();
      Map<String, String> tokens = new HashMap<>();
      List<Object> replies = new ArrayList<>();
      for (Map<String, Object> st : (List<Map<String, Object>>) c.get("steps")) {
        String op = (String) st.get("op");
        String caller = (String) st.get("caller");
        switch (op) {
          case "begin": {
            IdempotencyStore.Claim cl = store.begin(scope, key, (String) st.get("request"));
            Map<String, Object> m = new TreeMap<>();
            m.put("state", cl.state().toString());
            switch (cl.state()) {
              case STARTED:
                tokens.put(caller, cl.token());
                m.put("taken_over", cl.takenOver());
                break;
              case IN_PROGRESS:
                m.put("retry_after_s", cl.retryAfterSeconds());
                break;
              case COMPLETED:
                m.put("status", (long) cl.response().status());
                m.put("headers", cl.response().headers());
                m.put("too_large", cl.response().tooLarge());
                m.put("body_b64", Base64.getEncoder().encodeToString(cl.response().body()));
                if (cl.response().truncated()) m.put("truncated", true);
                break;
              default:
            }
            replies.add(m);
            break;
          }
          case "complete":
          case "fail": {
            String tok = tokens.getOrDefault(caller, "never-begun-" + caller);
            try {
              if (op.equals("complete")) {
                Map<String, List<String>> h = (Map<String, List<String>>) (Object) st.getOrDefault("headers", Map.of());
                byte[] body = Base64.getDecoder().decode((String) st.getOrDefault("body_b64", ""));
                store.complete(scope, key, tok, new IdempotencyStore.Response(((Long) st.get("status")).intValue(), h, body,
                    false, Boolean.TRUE.equals(st.get("truncated"))));
              } else {
                store.fail(scope, key, tok);
              }
              replies.add(Map.of("ok", true));
            } catch (IdempotencyStore.LeaseLostException e) {
              replies.add(Map.of("error", "lease_lost"));
            }
            break;
          }
          case "lapse":
            raw.lapse();
            break;
          case "expire":
            raw.expire();
            break;
          case "write":
            raw.write((Map<String, String>) (Object) st.get("fields"));
            break;
          default:
            throw new AssertionError("unknown op " + op);
        }
      }
      assertEquals(Repo.write(canon(c.get("replies"))), Repo.write(canon(replies)), "replies");
      assertEquals(Repo.write(canon(c.get("final"))), Repo.write(canon(raw.record(tokens))), "the record after");
    }));
  }

  /** The record as the cases compare it (README.md there, "The record after"). */
  static Map<String, Object> record(String rk, Map<String, String> tokens) throws Exception {
    Map<String, String> h = r.hgetall(rk);
    if (h.isEmpty()) return null;
    long now = serverMs();
    Map<String, Object> out = new TreeMap<>(h);
    tokens.forEach((caller, tok) -> {
      if (tok.equals(h.get("token"))) out.put("token", "{" + caller + "}");
    });
    if (h.containsKey("lease_until")) {
      long s = Math.round((Long.parseLong(h.get("lease_until")) - now) / 1000.0);
      out.put("lease_until", "{now" + (s >= 0 ? "+" : "") + s + "s}");
    }
    if (h.containsKey("headers") && !h.get("headers").isEmpty()) out.put("headers", Json.parse(h.get("headers")));
    out.put("ttl_s", Math.round(r.pttl(rk) / 1000.0));
    return out;
  }
}
