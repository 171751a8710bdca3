package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/**
 * Every shared outcome case (testdata/outcomes/cases.json) through
 * Policy.outcome: each step's answer, as the cases write it, byte for byte.
 */
class OutcomesTest {
  private static final Map<String, Object> CASES = Repo.json("testdata/outcomes/cases.json");

  @SuppressWarnings("unchecked")
  private static List<Map<String, Object>> cases() {
    return (List<Map<String, Object>>) CASES.get("cases");
  }

  @Test
  void theFileIsThisPackagesAbi() {
    assertEquals((long) Contract.ABI_VERSION, CASES.get("abi_version"));
    assertEquals((long) Contract.OPEN_POLL_MS, CASES.get("open_poll_ms"));
  }

  /** One step's answer: the outcome's JSON, or for an invalid failure its JSON and error, or an invalid event's error. */
  @SuppressWarnings("unchecked")
  private static String answer(Policy p, Map<String, Object> step) {
    Object in = step.get("failure");
    Failure f = in == null ? Failure.builder().nowMs((Long) step.getOrDefault("now_ms", 0L)).build()
        : Failure.read(in, 0L, 0.0); // absent numbers are 0
    try {
      Outcome o = p.outcome(Outcome.Event.valueOf(((String) step.get("event")).toUpperCase()), f,
          (Long) step.getOrDefault("deliveries", 0L), (Long) step.getOrDefault("max_deliveries", 0L));
      return o.toJson() + (o.invalid() ? " error: " + o.error() : "");
    } catch (InputException e) {
      return "error: " + e.getMessage();
    }
  }

  private static String expected(Map<String, Object> step) {
    if (!step.containsKey("expect")) return "error: " + step.get("error");
    String e = Repo.write(step.get("expect"));
    return step.containsKey("error") ? e + " error: " + step.get("error") : e;
  }

  @TestFactory
  Stream<DynamicTest> everyCaseCompiled() {
    return everyCase(PolicyRuntime.bundled(), "compiled");
  }

  @TestFactory
  Stream<DynamicTest> everyCaseInterpreted() {
    return everyCase(PolicyRuntime.builder().compiled(false).maxInstances(1).build(), "interpreted");
  }

  @SuppressWarnings("unchecked")
  private static Stream<DynamicTest> everyCase(PolicyRuntime rt, String how) {
    List<DynamicTest> tests = new ArrayList<>();
    int steps = 0;
    for (Map<String, Object> c : cases()) {
      List<Map<String, Object>> ss = (List<Map<String, Object>>) c.get("steps");
      steps += ss.size();
      tests.add(DynamicTest.dynamicTest(how + ": " + c.get("name"), () -> {
        // Steps run in order on one fresh policy: breaker and budget sequences.
        try (Policy p = VectorsTest.load(rt, c)) {
          assertEquals(Boolean.TRUE.equals(c.get("stateful")), p.isStateful(), "stateful");
          for (int i = 0; i < ss.size(); i++) {
            assertEquals(expected(ss.get(i)), answer(p, ss.get(i)), "step " + i + ": " + Repo.write(ss.get(i)));
          }
        }
      }));
    }
    // Guard against an empty or truncated file passing vacuously.
    assertTrue(steps > 100, "only " + steps + " outcome steps");
    return tests.stream();
  }

  @Test
  void theConveniencesAskTheSameQuestion() {
    try (Policy p = Policy.preset("default")) {
      assertEquals("{\"action\":\"run\",\"reason\":\"transient\",\"class\":\"retryable\",\"delay_ms\":0,\"pause\":false,\"count\":\"none\","
          + "\"invalid\":false}", p.outcome(Outcome.Event.BEFORE, 1L).toJson());
      Outcome ack = p.outcome(Outcome.Event.SUCCESS, 1L);
      assertEquals(Outcome.Action.ACK, ack.action());
      assertEquals(Decision.Reason.SUCCESS, ack.reason());
      assertEquals(Outcome.Count.SUCCESS, ack.count());
      Outcome bad = p.outcome(Outcome.Event.FAILURE, Failure.builder().attempt(0).build());
      assertEquals("dead_letter malformed true attempt: must be >= 1 (got 0)",
          bad.action() + " " + bad.reason() + " " + bad.invalid() + " " + bad.error());
    }
  }
}
