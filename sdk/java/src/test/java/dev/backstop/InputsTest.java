package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * testdata/vectors/inputs.json: bad (and odd) inputs, and the answer every
 * backstop host gives, byte for byte, through Failure.fromMap + decide and
 * through the command's line reader. None of them traps the module.
 */
class InputsTest {
  private static final Map<String, Object> FILE = Repo.json("testdata/vectors/inputs.json");

  @SuppressWarnings("unchecked")
  private static List<Map<String, Object>> cases() {
    return (List<Map<String, Object>>) FILE.get("cases");
  }

  /** A failure as the command decides it: absent (or null) random and now_ms are 0. */
  private static Object failure(Object v) {
    if (!(v instanceof Map)) return v;
    Map<String, Object> m = new LinkedHashMap<>();
    ((Map<?, ?>) v).forEach((k, x) -> m.put((String) k, x));
    if (m.get("random") == null) m.put("random", 0L);
    if (m.get("now_ms") == null) m.put("now_ms", 0L);
    return m;
  }

  private static String answer(Policy p, Object value) {
    try {
      return p.decide(Failure.read(value, null, null)).toJson();
    } catch (InputException e) {
      return Json.quote(new StringBuilder("{\"error\":"), e.getMessage()).append('}').toString();
    }
  }

  @Test
  void libraryGivesEveryValueItsAnswer() throws Exception {
    PolicyRuntime rt = PolicyRuntime.builder().maxInstances(1).build();
    try (rt; Policy p = rt.load((String) FILE.get("policy"))) {
      int n = 0;
      for (Map<String, Object> c : cases()) {
        String out = (String) c.get("output");
        Object value;
        if (c.containsKey("value")) {
          value = Repo.revive(c.get("value"));
        } else if (c.containsKey("line") && !c.containsKey("cli") && !out.startsWith("{\"error\":\"invalid input line: ")) {
          value = Json.parse((String) c.get("line"));
        } else {
          continue;
        }
        n++;
        assertEquals(out, answer(p, failure(value)), c.get("note") + ": " + String.valueOf(c.get("line")));
      }
      assertTrue(n > 200, n + " library cases");
      assertNull(rt.slot(0).dead, "a bad input trapped the module");
    }
  }

  @Test
  void commandGivesEveryLineItsAnswer() {
    try (Policy p = Policy.load((String) FILE.get("policy"))) {
      int n = 0;
      for (Map<String, Object> c : cases()) {
        byte[] line;
        if (c.containsKey("line")) {
          line = ((String) c.get("line")).getBytes(StandardCharsets.UTF_8);
        } else if (c.containsKey("line_hex")) {
          line = HexFormat.of().parseHex((String) c.get("line_hex"));
        } else {
          continue;
        }
        n++;
        assertEquals(c.get("output"), Main.answer(p, line, false, () -> 0), c.get("note") + ": " + c.get("line"));
      }
      assertTrue(n > 240, n + " line cases");
    }
  }

  /**
   * A line's duration_ms is recorded before its failure is decided: three
   * slow calls that fail permanently, and the fourth, a 503, finds the
   * breaker opened by the slow-call rate (without durations it retries).
   */
  @Test
  void commandRecordsALinesDurationBeforeDeciding() {
    try (Policy p = Policy.load("circuit_breaker: {type: failure_rate, slow_call_rate_threshold: 50, slow_call_duration_threshold: 100ms, "
        + "sliding_window: {type: count, size: 4}, minimum_calls: 4, open_for: 30s}")) {
      long[][] calls = {{400, 500}, {400, 500}, {400, -1}, {400, 500}, {503, 500}};
      String[] got = new String[calls.length];
      for (int i = 0; i < calls.length; i++) {
        String line = "{\"attempt\":1,\"http_status\":" + calls[i][0] + ",\"now_ms\":" + (1000 + i) + ",\"duration_ms\":" + calls[i][1] + "}";
        got[i] = Main.answer(p, line.getBytes(StandardCharsets.UTF_8), false, () -> 0);
      }
      assertEquals("{\"error\":\"duration_ms: must be >= 0 (got -1)\"}", got[2]);
      assertEquals("{\"action\":\"dead_letter\",\"delay_ms\":0,\"reason\":\"circuit_open\",\"class\":\"retryable\"}", got[4]);
    }
  }
}
