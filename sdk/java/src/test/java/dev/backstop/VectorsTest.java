package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/** Every shared vector (testdata/vectors/vectors.json) through this host, with the identical answer. */
class VectorsTest {
  private static final Map<String, Object> VECTORS = Repo.json("testdata/vectors/vectors.json");

  @Test
  void abiVersion() {
    assertEquals(1L, VECTORS.get("abi_version"));
    assertEquals(Contract.ABI_VERSION, ((Long) VECTORS.get("abi_version")).intValue());
  }

  @SuppressWarnings("unchecked")
  static List<Map<String, Object>> groups() {
    return (List<Map<String, Object>>) VECTORS.get("groups");
  }

  /** A vector's input as decide reads it: absent random and now_ms are 0, not a draw and the clock. */
  static Failure failure(Map<String, Object> input) {
    Map<String, Object> m = new LinkedHashMap<>(input);
    m.putIfAbsent("random", 0L);
    m.putIfAbsent("now_ms", 0L);
    return Failure.fromMap(m);
  }

  static String expected(Map<?, ?> e) {
    if (e.containsKey("error")) return "error: " + e.get("error");
    return e.get("action") + " " + e.get("delay_ms") + " " + e.get("reason") + " " + e.get("class");
  }

  static String actual(Policy p, Failure f) {
    try {
      Decision d = p.decide(f);
      return d.action() + " " + d.delayMs() + " " + d.reason() + " " + d.failureClass();
    } catch (InputException e) {
      return "error: " + e.getMessage();
    }
  }

  static Policy load(PolicyRuntime rt, Map<String, Object> group) {
    Object preset = group.get("preset");
    return preset != null ? rt.preset((String) preset) : rt.load(Repo.write(group.get("policy")));
  }

  /** Through the bundled runtime: the module compiled to JVM bytecode when the jar was built. */
  @TestFactory
  Stream<DynamicTest> everyGroupCompiled() {
    return everyGroup(PolicyRuntime.bundled(), "compiled");
  }

  /** Through Chicory's interpreter: the same answers. */
  @TestFactory
  Stream<DynamicTest> everyGroupInterpreted() {
    return everyGroup(INTERPRETED, "interpreted");
  }

  /**
   * The decisions of the stateless groups again, through decideMany
   * (decide_batch, many records a call): the same, null where the input is
   * invalid, and the first invalid one named with its index.
   */
  @TestFactory
  @SuppressWarnings("unchecked")
  Stream<DynamicTest> statelessGroupsThroughDecideMany() {
    List<DynamicTest> tests = new ArrayList<>();
    for (Map<String, Object> group : groups()) {
      if (Boolean.TRUE.equals(group.get("stateful"))) continue;
      tests.add(DynamicTest.dynamicTest("decideMany: " + group.get("name"), () -> {
        List<Failure> failures = new ArrayList<>();
        List<String> want = new ArrayList<>();
        String firstError = null;
        for (Map<String, Object> c : (List<Map<String, Object>>) group.get("cases")) {
          if (!c.containsKey("input")) continue;
          Map<?, ?> e = (Map<?, ?>) c.get("expect");
          if (e.containsKey("error") && firstError == null) firstError = "failures[" + failures.size() + "]: " + e.get("error");
          failures.add(failure((Map<String, Object>) c.get("input")));
          want.add(e.containsKey("error") ? "null" : expected(e));
        }
        List<Decision> got;
        try (Policy p = load(PolicyRuntime.bundled(), group)) {
          try {
            got = p.decideMany(failures);
            assertEquals(null, firstError, "no InputException");
          } catch (InputException e) {
            assertEquals(firstError, e.getMessage());
            assertEquals(firstError, "failures[" + e.index() + "]: " + e.field() + ": " + e.reason());
            got = e.decisions().orElseThrow();
          }
        }
        List<String> gotText = new ArrayList<>();
        for (Decision d : got) {
          gotText.add(d == null ? "null" : d.action() + " " + d.delayMs() + " " + d.reason() + " " + d.failureClass());
        }
        assertEquals(want, gotText);
      }));
    }
    return tests.stream();
  }

  private static final PolicyRuntime INTERPRETED = PolicyRuntime.builder().compiled(false).maxInstances(1).build();

  /** Through a module given as bytes, compiled by Chicory's runtime compiler: the same answers. */
  @TestFactory
  Stream<DynamicTest> everyGroupRuntimeCompiled() {
    return everyGroup(PolicyRuntime.builder().wasm(PolicyRuntime.bundledWasm()).maxInstances(1).build(), "runtime-compiled");
  }

  @SuppressWarnings("unchecked")
  private static Stream<DynamicTest> everyGroup(PolicyRuntime rt, String how) {
    List<DynamicTest> tests = new ArrayList<>();
    List<Map<String, Object>> groups = groups();
    int total = 0;
    for (int gi = 0; gi < groups.size(); gi++) {
      Map<String, Object> group = groups.get(gi);
      List<Map<String, Object>> cases = (List<Map<String, Object>>) group.get("cases");
      total += cases.size();
      tests.add(DynamicTest.dynamicTest(how + ": " + group.get("name") + " (#" + gi + ")", () -> {
        // Cases run in order on one fresh policy: budget and breaker sequences.
        try (Policy p = load(rt, group)) {
          assertEquals(Boolean.TRUE.equals(group.get("stateful")), p.isStateful(), "stateful");
          for (int i = 0; i < cases.size(); i++) {
            Map<String, Object> c = cases.get(i);
            Object op = c.get("op");
            if ("success".equals(op)) {
              p.recordSuccess((Long) c.get("now_ms"));
            } else if ("duration".equals(op)) {
              p.recordDuration((Long) c.get("now_ms"), (Long) c.getOrDefault("duration_ms", 0L));
            } else if ("acquire".equals(op)) {
              Map<String, Object> want = (Map<String, Object>) c.get("permit");
              Permit got = p.acquire((Long) c.get("now_ms"));
              assertEquals(want.get("allowed") + " " + want.get("retry_in_ms") + " " + want.get("state"),
                  got.allowed() + " " + got.retryInMs() + " " + got.state(), "case " + i + ": acquire");
            } else if ("connect_timeout".equals(op)) {
              long want = (Long) c.get("timeout_ms");
              assertEquals(want == 0 ? java.util.Optional.empty() : java.util.Optional.of(java.time.Duration.ofMillis(want)),
                  p.connectTimeout(), "case " + i + ": connect_timeout");
            } else if ("attempt_timeout".equals(op)) {
              long elapsed = (Long) c.getOrDefault("elapsed_ms", 0L); // left out when 0
              String got;
              try {
                got = "timeout " + p.attemptTimeout(elapsed);
              } catch (InputException e) {
                got = "error: " + e.getMessage();
              }
              String want = c.containsKey("error") ? "error: " + c.get("error") : "timeout " + c.get("timeout_ms");
              assertEquals(want, got, "case " + i + ": attempt_timeout at " + elapsed);
            } else {
              Map<String, Object> input = (Map<String, Object>) c.get("input");
              assertEquals(expected((Map<?, ?>) c.get("expect")), actual(p, failure(input)),
                  "case " + i + ": " + Repo.write(input));
            }
          }
        }
      }));
    }
    // Guard against an empty or truncated file passing vacuously.
    assertEquals(true, total > 4000, "only " + total + " vector cases");
    return tests.stream();
  }
}
