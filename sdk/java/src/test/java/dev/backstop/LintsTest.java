package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** A policy's lints (docs/policy.md, "Lints"): bits from the module, texts from the schema, a warning at load. */
class LintsTest {
  private final List<LogRecord> logged = new ArrayList<>();
  private final Handler handler = new Handler() {
    @Override
    public void publish(LogRecord r) {
      logged.add(r);
    }

    @Override
    public void flush() {}

    @Override
    public void close() {}
  };
  // System.Logger goes to java.util.logging when nothing else is installed.
  private final Logger jul = Logger.getLogger("dev.backstop");

  @BeforeEach
  void listen() {
    Policy.resetLintWarnings();
    jul.addHandler(handler);
  }

  @AfterEach
  void stop() {
    jul.removeHandler(handler);
  }

  @Test
  void jitterNoneWarnsWithBp002() {
    try (Policy p = Policy.load("{\"jitter\": {\"mode\": \"none\"}}")) {
      assertEquals(1, p.lints().size(), p.lints().toString());
      Lint l = p.lints().get(0);
      assertEquals("BP002", l.code());
      assertEquals("jitter.mode", l.field());
      assertTrue(l.message().contains("backoff without jitter"), l.message());
      assertEquals(1, logged.size());
      assertEquals(Level.WARNING, logged.get(0).getLevel());
      String msg = java.text.MessageFormat.format(logged.get(0).getMessage(), logged.get(0).getParameters());
      assertTrue(msg.contains("jitter.mode: BP002: jitter none"), msg);
    }
  }

  /** A lint text is logged once per JVM however often a policy is loaded; lints() stays complete. */
  @Test
  void aLintIsLoggedOncePerJvm() {
    for (int i = 0; i < 3; i++) {
      try (Policy p = Policy.load("{\"jitter\": {\"mode\": \"none\"}}")) {
        assertEquals(List.of("BP002"), p.lints().stream().map(Lint::code).toList());
      }
    }
    assertEquals(1, logged.size(), logged.toString());
  }

  @Test
  void anIgnoredLintIsSilent() {
    try (Policy p = Policy.load("{\"jitter\": {\"mode\": \"none\"}, \"lint_ignore\": {\"BP002\": \"a test of the herd\"}}");
        Policy batch = Policy.preset("batch")) {
      assertEquals(List.of(), p.lints());
      assertEquals(List.of(), batch.lints());
      assertEquals(List.of(), logged);
    }
  }

  @Test
  void severalLintsInCodeOrder() {
    try (Policy p = Policy.load("{\"max_attempts\": 30, \"backoff\": {\"strategy\": \"none\"}}")) {
      assertEquals(List.of("BP001", "BP003"), p.lints().stream().map(Lint::code).toList());
    }
  }

  /** Every policy of testdata/lints/cases.json reports exactly its lints (code, field, message), in order. */
  @Test
  @SuppressWarnings("unchecked")
  void theSharedLintCases() {
    List<Map<String, Object>> cases = (List<Map<String, Object>>) Repo.json("testdata/lints/cases.json").get("cases");
    assertTrue(cases.size() > 0);
    for (Map<String, Object> c : cases) {
      Object pol = c.get("policy");
      try (Policy p = pol instanceof String ? Policy.load((String) pol) : Policy.load(Repo.write(pol))) {
        List<Map<String, Object>> want = (List<Map<String, Object>>) c.get("lints");
        List<Map<String, Object>> got = p.lints().stream()
            .map(l -> Map.<String, Object>of("code", l.code(), "field", l.field(), "message", l.message())).toList();
        assertEquals(want, got, (String) c.get("name"));
      }
    }
  }
}
