package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * Failure.read's two paths: a map of plain values becomes a typed failure
 * here, anything else goes to the module as a failure value (checked at
 * once, then decide_value, outcome_value), with Java's own types read as
 * they always were.
 */
class FailureValueTest {
  private static final long NOW = 1_767_225_600_000L;

  private static Map<String, Object> map(Object... kv) {
    Map<String, Object> m = new LinkedHashMap<>();
    for (int i = 0; i < kv.length; i += 2) m.put((String) kv[i], kv[i + 1]);
    return m;
  }

  private static String answer(Policy p, Failure f) {
    try {
      return p.decide(f).toJson();
    } catch (InputException e) {
      return e.getMessage();
    }
  }

  private static String error(Object v) {
    return assertThrows(InputException.class, () -> Failure.read(v, null, null)).getMessage();
  }

  @Test
  void plainMapsAreReadHereAndOthersByTheModule() {
    Failure f = Failure.fromMap(map("attempt", 2L, "http_status", 503, "method", "GET", "retry_after", 7L,
        "idempotency_key", "k", "now_ms", NOW, "random", 0.5, "retried_downstream", true));
    assertNull(f.value);
    assertEquals(2, f.attempt());
    assertEquals(503, f.httpStatus());
    assertEquals("7", f.retryAfter());
    assertEquals(true, f.hasIdempotencyKey());
    for (Object x : new Object[] {BigInteger.TWO, 2.0, (short) 2, null, 2, 2L}) {
      boolean plain = x == null || x instanceof Integer || x instanceof Long;
      assertEquals(plain, Failure.fromMap(map("attempt", 1L, "http_status", x)).value == null, String.valueOf(x));
    }
    assertEquals("bogus: unknown field", error(map("attempt", 1L, "bogus", 1L)));
    assertEquals("method: must be at most 65535 bytes (got 65536)", error(map("method", "x".repeat(Contract.MAX_STRING + 1))));
  }

  private static Failure.Builder typed() {
    return Failure.builder().attempt(2).nowMs(NOW).random(0.25);
  }

  /** Each map decides as the typed failure beside it, through decide_value. */
  @Test
  @SuppressWarnings("unchecked")
  void javasOwnTypesKeepTheirMeaning() {
    Object[][] cases = {
      {map("attempt", BigInteger.TWO, "http_status", (short) 503), typed().httpStatus(503)},
      {map("attempt", 2.0, "grpc_code", "unavailable", "elapsed_ms", 1200.9f), typed().grpcCode(14).elapsedMs(1200)},
      {map("attempt", (byte) 2, "error_kind", "timeout".getBytes(), "method", "PUT".getBytes()), typed().errorKind("timeout").method("PUT")},
      {map("attempt", 2L, "http_status", 429, "retry_after", 2.2), typed().httpStatus(429).retryAfter("3")},
      {map("attempt", 2L, "http_status", 503, "random", new BigDecimal("0.25"), "idempotency_key", new byte[] {1}),
          typed().httpStatus(503).idempotencyKey(true)},
    };
    try (Policy p = Policy.preset("default")) {
      for (Object[] c : cases) {
        Map<String, Object> m = (Map<String, Object>) c[0];
        m.putIfAbsent("now_ms", BigInteger.valueOf(NOW));
        m.putIfAbsent("random", 0.25);
        Failure f = Failure.fromMap(m);
        assertNotNull(f.value, m.toString());
        assertEquals(p.decide(((Failure.Builder) c[1]).build()).toJson(), answer(p, f), m.toString());
      }
    }
  }

  /** At once, as fromMap always did: the module's converter and its words. */
  @Test
  @SuppressWarnings("unchecked")
  void theModuleWordsEveryError() {
    Object[][] cases = {
      {map("attempt", new BigDecimal("1")), "attempt: must be an integer (got an object)"},
      {map("attempt", 1L, "method", Duration.ofSeconds(1)), "method: must be a string (got an object)"},
      {map("attempt", 1L, "retry_after", new Object[] {1}), "retry_after: must be a string or a number (got an array)"},
      {map("attempt", 1L, "retry_after", 'x'), "retry_after: must be a string or a number (got an object)"},
      {map("attempt", 1L, "http_status", 1.5f), "http_status: must be a 32-bit integer (got 1.5)"},
      {map("attempt", BigInteger.TWO.pow(64)), "attempt: must fit in 64 bits (got 18446744073709551616)"},
      {map("attempt", 1L, "random", true), "random: must be a number, \"NaN\", \"Infinity\" or \"-Infinity\" (got true)"},
      {map("zeta", 1L, "\ud800", 1L, "\udc00", 1L, "attempt", "x"), "zeta: unknown field"},
      {map("\ud800", 1L, "\udc00", 1L), "\ufffd: unknown field"},
      {map("attempt", 1L, "grpc_code", "nope\n"), "grpc_code: unknown gRPC status name \"nope\\n\""},
      {List.of(1), "failure: must be an object (got an array)"},
      {null, "failure: must be an object (got null)"},
    };
    for (Object[] c : cases) assertEquals(c[1], error(c[0]), c[1].toString());
    try (Policy p = Policy.preset("default")) {
      // The module's range checks come at decide, as for a typed failure.
      assertEquals("attempt: must be >= 1 (got 0)", answer(p, Failure.fromMap(map("attempt", 0L, "http_status", 2.0))));
      p.close(); // a wrong type first, then the closed policy (one_call.json's order)
      assertThrows(InputException.class, () -> p.decide(Failure.fromMap(map("attempt", "x"))));
      assertThrows(IllegalStateException.class, () -> p.decide(Failure.fromMap(map("attempt", BigInteger.ONE))));
    }
  }

  /** now_ms and random absent (or null): the caller's defaults, else the clock and a draw at decide. */
  @Test
  void decideFillsTheClockAndADraw() {
    try (Policy p = Policy.preset("default")) {
      Failure typed = Failure.builder().attempt(3).httpStatus(503).nowMs(7).random(0.75).build();
      Map<String, Object> m = map("attempt", BigInteger.valueOf(3), "http_status", 503, "now_ms", null);
      assertEquals(p.decide(typed).toJson(), answer(p, Failure.read(m, 7L, 0.75)));
      Failure drawn = Failure.read(m, null, null);
      assertEquals(p.decide(typed).toJson(), answer(p, drawn.toBuilder().random(0.75).build()));
      long delay = p.decide(drawn).delayMs(); // full jitter of 4 s: a draw in [0, 1)
      assertEquals(true, delay >= 0 && delay < 4000, String.valueOf(delay));
    }
  }

  /**
   * decideMany decides a value alone, in its place: a stateful policy counts
   * it as decide does, and the first error keeps its index.
   */
  @Test
  void aBatchDecidesAValueAloneInOrder() {
    String policy = "{\"circuit_breaker\": {\"failure_threshold\": 3, \"open_for\": \"30s\"}}";
    Failure f503 = Failure.builder().attempt(1).httpStatus(503).nowMs(NOW).random(0.5).build();
    List<Failure> batch = Arrays.asList(f503, Failure.fromMap(map("attempt", BigInteger.ONE, "http_status", 503, "now_ms", NOW,
        "random", 0.5)), Failure.fromMap(map("attempt", BigInteger.ZERO)), Failure.builder().attempt(0).build(), f503, f503);
    try (Policy many = Policy.load(policy); Policy one = Policy.load(policy)) {
      InputException e = assertThrows(InputException.class, () -> many.decideMany(batch));
      assertEquals("failures[2]: attempt: must be >= 1 (got 0)", e.getMessage());
      assertEquals(2, e.index());
      List<String> want = new ArrayList<>();
      for (Failure f : batch) {
        String a = answer(one, f); // one by one, the invalid ones skipped as the batch skips them
        want.add(a.startsWith("{") ? a : "null");
      }
      List<String> got = new ArrayList<>();
      for (Decision d : e.decisions().orElseThrow()) got.add(d == null ? "null" : d.toJson());
      assertEquals(want, got);
      assertEquals(Decision.Reason.CIRCUIT_OPEN, e.decisions().orElseThrow().get(5).reason(), "the value was counted");
    }
  }

  @Test
  void outcomeReadsAValue() {
    try (Policy p = Policy.preset("default")) {
      Failure typed = Failure.builder().attempt(2).httpStatus(503).nowMs(NOW).random(0.5).build();
      Failure value = Failure.fromMap(map("attempt", 2.0, "http_status", 503, "now_ms", NOW, "random", 0.5));
      assertEquals(p.outcome(Outcome.Event.FAILURE, typed).toJson(), p.outcome(Outcome.Event.FAILURE, value).toJson());
      Outcome bad = p.outcome(Outcome.Event.FAILURE, Failure.fromMap(map("attempt", BigInteger.ZERO, "now_ms", NOW)));
      assertEquals(true, bad.invalid());
      assertEquals("attempt: must be >= 1 (got 0)", bad.error());
    }
  }
}
