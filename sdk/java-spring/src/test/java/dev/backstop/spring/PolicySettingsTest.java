package dev.backstop.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;

import dev.backstop.Decision;
import dev.backstop.Failure;
import dev.backstop.Policy;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.env.YamlPropertySourceLoader;
import org.springframework.boot.test.context.runner.ApplicationContextRunner;
import org.springframework.core.env.StandardEnvironment;
import org.springframework.core.io.FileSystemResource;

/**
 * The policy application.yml names (backstop.policy: a preset or a
 * resource), and the one of its Spring retry settings: the same policy as
 * {@code backstop policy import --from spring} writes from the same file.
 */
class PolicySettingsTest {
  private final ApplicationContextRunner runner =
      new ApplicationContextRunner().withConfiguration(AutoConfigurations.of(BackstopAutoConfiguration.class));

  /** What p decides for a 503 on attempts 1..8 (no jitter draws: the draw fixed). */
  static List<String> decisions(Policy p) {
    List<String> out = new ArrayList<>();
    for (int a = 1; a <= 8; a++) {
      Decision d = p.decide(Failure.builder().attempt(a).httpStatus(503).nowMs(1_767_225_600_000L).random(0.5).build());
      out.add(d.action() + " " + d.delayMs() + " " + d.reason());
    }
    return out;
  }

  @Test
  void backstopPolicyNamesAPresetOrAResource() {
    runner.withPropertyValues("backstop.policy=classpath:policies/orders.yaml").run(ctx -> {
      try (Policy want = Policy.load(Files.readAllBytes(Path.of("src/test/resources/policies/orders.yaml")))) {
        assertEquals(decisions(want), decisions(ctx.getBean(Policy.class)));
      }
    });
    runner.withPropertyValues("backstop.policy=critical").run(ctx -> {
      try (Policy want = Policy.preset("critical")) {
        assertEquals(decisions(want), decisions(ctx.getBean(Policy.class)));
      }
    });
    runner.run(ctx -> {
      try (Policy want = Policy.preset("default")) {
        assertEquals(decisions(want), decisions(ctx.getBean(Policy.class)));
      }
    });
  }

  static String yaml(Path file) throws Exception {
    return Files.readString(file, StandardCharsets.UTF_8);
  }

  /** The artifact's policy of file's Spring retry settings, and the importer's of the same file, decide alike. */
  static void roundTrip(Path file) throws Exception {
    StandardEnvironment env = new StandardEnvironment();
    new YamlPropertySourceLoader().load("app", new FileSystemResource(file)).forEach(env.getPropertySources()::addFirst);
    String ours = SpringRetryPolicy.of(env).orElseThrow();
    String imported = NotificationServiceTest.run(NotificationServiceTest.root(), NotificationServiceTest.cli(),
        "policy", "import", "--from", "spring", file.toAbsolutePath().toString());
    try (Policy a = Policy.load(ours); Policy b = Policy.load(imported)) {
      List<String> got = decisions(a);
      assertEquals(decisions(b), got, "artifact " + ours + "\nimporter " + imported);
      assertFalse(got.get(0).startsWith("stop"), got.toString());
    }
  }

  @Test
  void theTestApplicationsRetrySettingsAreThePolicyTheImporterWrites() throws Exception {
    roundTrip(Path.of("src/test/resources/application.yml"));
  }

  @Test
  void springBootsDefaultsFillTheKeysLeftOutAsTheImportersDo(@TempDir Path dir) throws Exception {
    Path f = dir.resolve("application.yml");
    Files.writeString(f, "spring:\n  rabbitmq:\n    listener:\n      simple:\n        retry:\n          max-attempts: 6\n");
    roundTrip(f);
    Files.writeString(f, "spring.rabbitmq.listener.simple.retry:\n  initial-interval: 500\n  multiplier: 1.5\n"
        + "  max-interval: 3s\n");
    roundTrip(f);
  }
}
