package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.prometheus.metrics.core.metrics.Counter;
import io.prometheus.metrics.expositionformats.PrometheusTextFormatWriter;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.io.ByteArrayOutputStream;
import java.net.SocketTimeoutException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

/**
 * The process metrics: the shared sequence (testdata/metrics/sequence.json)
 * replayed through the retry loop on a fake clock gives the exposition Go
 * gives (testdata/metrics/expected.prom): the same family names, types,
 * help, series and values.
 */
class MetricsTest {
  private static final Pattern SAMPLE = Pattern.compile("^([^{ ]+)(?:\\{(.*)\\})? (.*)$");
  private static final Pattern LABEL = Pattern.compile("[a-z_]+=\"[^\"]*\"");

  static String scrape(PrometheusRegistry registry) throws Exception {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    PrometheusTextFormatWriter.create().write(out, registry.scrape());
    return out.toString(StandardCharsets.UTF_8);
  }

  /** Fails unless registry's exposition has each of lines, whole. */
  static void assertExposes(PrometheusRegistry registry, String... lines) throws Exception {
    String text = scrape(registry);
    for (String line : lines) assertTrue(text.contains(line + "\n"), line + " in\n" + text);
  }

  /** The samples of an exposition, labels sorted, values as doubles, sorted: the clients order them differently. */
  static List<String> samples(String text) {
    List<String> out = new ArrayList<>();
    for (String line : text.split("\n")) {
      if (line.isEmpty() || line.startsWith("# HELP")) continue;
      Matcher m = SAMPLE.matcher(line);
      if (line.startsWith("#") || !m.matches()) {
        out.add(line);
        continue;
      }
      List<String> labels = new ArrayList<>();
      Matcher l = LABEL.matcher(m.group(2) == null ? "" : m.group(2));
      while (l.find()) labels.add(normalizeLe(l.group()));
      labels.sort(null);
      out.add(m.group(1) + "{" + String.join(",", labels) + "} " + Double.parseDouble(m.group(3)));
    }
    out.sort(null);
    return out;
  }

  /**
   * A bucket bound as a number: the Java client writes le="1.0" where Go
   * writes le="1"; Prometheus reads both as the same bound (it parses le as
   * a float, and normalizes it on scrape since 3.0).
   */
  private static String normalizeLe(String label) {
    if (!label.startsWith("le=\"") || label.equals("le=\"+Inf\"")) return label;
    return "le=\"" + Double.parseDouble(label.substring(4, label.length() - 1)) + "\"";
  }

  /** The "# TYPE" and "# HELP" lines: the families, their types and help. */
  static List<String> families(String text) {
    return Arrays.stream(text.split("\n")).filter(l -> l.startsWith("# TYPE ") || l.startsWith("# HELP ")).sorted()
        .collect(Collectors.toList());
  }

  @Test
  @SuppressWarnings("unchecked")
  void theSharedSequenceGivesTheSeriesGoGives() throws Exception {
    Map<String, Object> seq = Repo.json("testdata/metrics/sequence.json");
    PrometheusRegistry registry = new PrometheusRegistry();
    RetryMetrics metrics = BackstopMetrics.recorder(registry, (String) seq.get("policy_name"), (String) seq.get("target"));
    FakeTicker clock = new FakeTicker((Long) seq.get("start_ms"));
    try (Policy policy = Policy.load((String) seq.get("policy"))) {
      List<Map<String, Object>> calls = (List<Map<String, Object>>) seq.get("calls");
      for (int i = 0; i < calls.size(); i++) {
        Map<String, Object> call = calls.get(i);
        if (call.containsKey("advance_ms")) clock.advance((Long) call.get("advance_ms"));
        List<String> outcomes = (List<String>) call.get("outcomes");
        int[] n = {0};
        int at = i;
        String got = "ok";
        try {
          Backstop.retrying(policy).withMetrics(metrics).withTicker(clock).call(() -> {
            assertTrue(n[0] < outcomes.size(), "call " + at + ": attempt " + (n[0] + 1) + " made, " + outcomes.size() + " scripted");
            String o = outcomes.get(n[0]++);
            if (o.equals("ok")) return "ok";
            if (o.equals("timeout")) throw new SocketTimeoutException("timed out");
            String[] p = o.split(":");
            throw new HttpStatusException(Integer.parseInt(p[1]), p.length > 2 ? p[2] : null);
          });
        } catch (RetryException e) {
          got = e.reason().toString();
        }
        assertEquals(call.get("want"), got, "call " + i);
        assertEquals(outcomes.size(), n[0], "call " + i + ": attempts");
      }
    }
    String java = scrape(registry);
    String go = Repo.read("testdata/metrics/expected.prom");
    assertEquals(samples(go), samples(java), java);
    assertEquals(families(go), families(java), "family names, types and help");
  }

  @Test
  void aSecondRecorderOnARegistryReusesItsFamilies() throws Exception {
    PrometheusRegistry registry = new PrometheusRegistry();
    BackstopMetrics.recorder(registry, "a", "api").attempt("success");
    BackstopMetrics.recorder(registry, "a", "api").attempt("success");
    assertTrue(scrape(registry).contains("backstop_client_attempts_total{outcome=\"success\",policy=\"a\",target=\"api\"} 2"),
        scrape(registry));
  }

  @Test
  void badInputGetsAClearError() {
    PrometheusRegistry other = new PrometheusRegistry();
    Counter.builder().name("backstop_client_attempts_total").help("not ours").register(other);
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> BackstopMetrics.recorder(other, "payments", "api"));
    assertTrue(e.getMessage().contains("holds other metrics"), e.getMessage());
    assertThrows(IllegalArgumentException.class, () -> BackstopMetrics.recorder(new PrometheusRegistry(), "", "api"));
    RetryMetrics m = BackstopMetrics.recorder(new PrometheusRegistry(), "p", "t");
    assertThrows(IllegalArgumentException.class, () -> m.attempt("maybe"));
  }
}
