package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The Policy API: loading, presets, errors, state, closing. */
class PolicyTest {
  private static final String STATEFUL = "{\"max_attempts\": 8,"
      + " \"retry_budget\": {\"type\": \"token_bucket\", \"max_tokens\": 6, \"token_ratio\": 0.5},"
      + " \"circuit_breaker\": {\"failure_threshold\": 2, \"open_for\": \"2s\", \"half_open_successes\": 1}}";
  private static final long NOW = 1_700_000_000_000L;
  private static final Failure F503 = Failure.builder().attempt(1).httpStatus(503).random(0.5).nowMs(NOW).build();

  @Test
  void presetsLoadByNameAndBareWordsArePresets() {
    for (String name : List.of("default", "critical", "batch", "fast-transient")) {
      try (Policy a = Policy.preset(name); Policy b = Policy.load(name)) {
        assertEquals(a.decide(F503), b.decide(F503), name);
      }
    }
    PolicyException e = assertThrows(PolicyException.class, () -> Policy.load("defualt"));
    assertTrue(e.getMessage().contains("unknown preset"), e.getMessage());
  }

  @Test
  void jsonYamlAndBytesLoadTheSamePolicy() {
    try (Policy json = Policy.load("{\"max_attempts\": 2}");
        Policy yaml = Policy.load("max_attempts: 2\n");
        Policy bytes = Policy.load("{\"max_attempts\": 2}".getBytes(StandardCharsets.UTF_8))) {
      Failure second = F503.toBuilder().attempt(2).build();
      for (Policy p : List.of(json, yaml, bytes)) {
        assertEquals(Decision.Reason.MAX_ATTEMPTS_REACHED, p.decide(second).reason());
        assertFalse(p.isStateful());
      }
    }
  }

  @Test
  void anInvalidPolicyNamesEveryField() {
    PolicyException e = assertThrows(PolicyException.class,
        () -> Policy.load("{\"max_attempts\": 0, \"backoff\": {\"base\": \"1s\", \"cap\": \"100ms\"}}"));
    assertTrue(e.getMessage().startsWith("invalid policy: "), e.getMessage());
    assertEquals(e.problems().get(0).field(), e.field());
    assertTrue(e.problems().size() >= 2, e.problems().toString());
    assertTrue(e.problems().stream().anyMatch(p -> p.field().equals("max_attempts")), e.problems().toString());
    assertTrue(e.problems().stream().anyMatch(p -> p.field().equals("backoff.cap")), e.problems().toString());
  }

  @Test
  void anInvalidFailureChangesNoStateAndNamesItsField() {
    try (Policy p = Policy.load(STATEFUL)) {
      InputException e = assertThrows(InputException.class, () -> p.decide(F503.toBuilder().attempt(0).build()));
      assertEquals("attempt: must be >= 1 (got 0)", e.getMessage());
      assertEquals("attempt", e.field());
      e = assertThrows(InputException.class, () -> Failure.builder().method("x".repeat(70_000)));
      assertEquals("method: must be at most 65535 bytes (got 70000)", e.getMessage());
      assertThrows(InputException.class, () -> p.acquire(-1));
      assertThrows(InputException.class, () -> p.attemptTimeout(-1));
      assertEquals(CircuitState.CLOSED, p.circuitState(NOW));
    }
  }

  @Test
  void eachPolicyHasItsOwnBreakerAndBudget() {
    try (Policy a = Policy.load(STATEFUL); Policy b = Policy.load(STATEFUL)) {
      assertTrue(a.isStateful());
      assertEquals(6.0, a.budgetTokens(NOW).orElseThrow());
      a.decide(F503);
      a.decide(F503);
      assertEquals(CircuitState.OPEN, a.circuitState(NOW));
      Permit refused = a.acquire(NOW);
      assertFalse(refused.allowed());
      assertEquals(CircuitState.OPEN, refused.state());
      assertEquals(2000, refused.retryInMs());
      assertEquals(CircuitState.CLOSED, b.circuitState(NOW));
      assertTrue(b.acquire(NOW).allowed());
      // Half-open after open_for: one trial, then a success closes the breaker.
      Permit trial = a.acquire(NOW + 2000);
      assertTrue(trial.allowed());
      assertEquals(CircuitState.HALF_OPEN, trial.state());
      a.recordSuccess(NOW + 2001);
      assertEquals(CircuitState.CLOSED, a.circuitState(NOW + 2001));
    }
    try (Policy p = Policy.preset("default")) {
      assertTrue(p.budgetTokens(NOW).isEmpty());
      assertEquals(0, p.attemptTimeout(0));
      assertEquals(OnOpen.DEFER, p.onOpen());
    }
    try (Policy p = Policy.load("{\"on_open\": \"dead_letter\"}")) {
      assertEquals("dead_letter", p.onOpen().toString()); // the name Go's OnOpen(), Node's onOpen and Python's on_open give
    }
  }

  @Test
  void aClosedPolicyRefusesCallsAndClosingTwiceIsFine() {
    Policy p = Policy.preset("default");
    p.close();
    p.close();
    IllegalStateException e = assertThrows(IllegalStateException.class, () -> p.decide(F503));
    assertEquals("backstop: the policy is closed", e.getMessage());
  }

  @Test
  void decisionsReadAsTheOtherHostsWriteThem() {
    try (Policy p = Policy.preset("default")) {
      Decision d = p.decide(F503);
      assertTrue(d.isRetry());
      assertEquals("{\"action\":\"retry\",\"delay_ms\":" + d.delayMs() + ",\"reason\":\"transient\",\"class\":\"retryable\"}",
          d.toJson());
      // Unset now and random: the clock and a draw, within full jitter's range.
      Decision drawn = p.decide(Failure.builder().attempt(1).httpStatus(503).build());
      assertTrue(drawn.delayMs() >= 0 && drawn.delayMs() < 1000, drawn.toString());
      assertEquals(14, Failure.builder().grpcCode("unavailable").build().grpcCode());
    }
  }

  @Test
  void messagesShowNumbersAsJavaScriptPrintsThem() {
    String[][] cases = {{"2.0390160703272852e18", "2039016070327285200"}, {"1e21", "1e+21"}, {"1.5e-7", "1.5e-7"},
        {"0.000001", "0.000001"}, {"123", "123"}, {"-0.5", "-0.5"}, {"5e-324", "5e-324"},
        {"1.7976931348623157e308", "1.7976931348623157e+308"}, {"0.1", "0.1"}, {"100", "100"}};
    for (String[] c : cases) {
      InputException e = assertThrows(InputException.class,
          () -> Failure.fromMap(java.util.Map.of("attempt", 1L, "error_kind", Double.parseDouble(c[0]))));
      assertEquals("error_kind: must be a string (got " + c[1] + ")", e.getMessage(), c[0]);
    }
    InputException e = assertThrows(InputException.class,
        () -> Failure.fromMap(java.util.Map.of("attempt", 1L, "http_status", 1.5)));
    assertEquals("http_status: must be a 32-bit integer (got 1.5)", e.getMessage());
  }
}
