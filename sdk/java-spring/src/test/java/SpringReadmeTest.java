import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.backstop.RabbitBroker;
import dev.backstop.RabbitDeadLetter;
import dev.backstop.SpringTestBroker;
import io.prometheus.metrics.expositionformats.PrometheusTextFormatWriter;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.io.ByteArrayOutputStream;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;
import org.springframework.amqp.core.Binding;
import org.springframework.amqp.core.BindingBuilder;
import org.springframework.amqp.core.DirectExchange;
import org.springframework.amqp.core.Queue;
import org.springframework.amqp.core.QueueBuilder;
import org.springframework.amqp.rabbit.core.RabbitTemplate;
import org.springframework.amqp.support.converter.JacksonJsonMessageConverter;
import org.springframework.amqp.support.converter.MessageConverter;
import org.springframework.boot.SpringBootConfiguration;
import org.springframework.boot.autoconfigure.EnableAutoConfiguration;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.context.annotation.Bean;
import org.springframework.context.support.GenericApplicationContext;

/**
 * The Spring snippets of README.md and sdk/java/README.md (the blocks marked
 * {@code <!-- snippet: spring -->}: an application.yml and a listener) run as
 * written: the listener compiled with javac, booted with the yml as the
 * application's configuration in a Spring Boot application that declares
 * notification.order-placed the usual Spring way, against the tests' real
 * rabbitmq-server; a 503 is retried cold and succeeds, a 400 is
 * dead-lettered with backstop's reason.
 */
class SpringReadmeTest {
  static final List<String> FILES = List.of("README.md", "sdk/java/README.md");
  static final String Q = "notification.order-placed";
  private static final Pattern FENCE = Pattern.compile("^```(\\S*)\\s*$");
  private static final Pattern MARKER = Pattern.compile("^<!--\\s*snippet:\\s*spring\\s*-->$");
  private static final Pattern CLASS = Pattern.compile("public class (\\w+)");

  /** The e-mail provider the snippet's listener calls: scripted statuses per order, the calls taken. */
  static final Map<String, List<Integer>> ANSWERS = new ConcurrentHashMap<>();
  static final List<String> CALLS = new CopyOnWriteArrayList<>();

  @SpringBootConfiguration(proxyBeanMethods = false)
  @EnableAutoConfiguration
  static class App {
    @Bean
    Queue orderPlaced() {
      return QueueBuilder.durable(Q).quorum().deadLetterExchange("notification.dlx").build();
    }

    @Bean
    DirectExchange notificationDlx() {
      return new DirectExchange("notification.dlx");
    }

    @Bean
    Queue orderPlacedDlq() {
      return QueueBuilder.durable(Q + ".dlq").quorum().build();
    }

    @Bean
    Binding orderPlacedDlqBinding() {
      return BindingBuilder.bind(orderPlacedDlq()).to(notificationDlx()).with(Q);
    }

    @Bean
    MessageConverter jsonConverter() {
      return new JacksonJsonMessageConverter();
    }

    @Bean
    PrometheusRegistry prometheusRegistry() {
      return new PrometheusRegistry();
    }

    @Bean
    EmailProvider emailProvider() {
      return event -> {
        CALLS.add(event.orderId());
        List<Integer> a = ANSWERS.get(event.orderId());
        return a == null || a.isEmpty() ? 200 : a.remove(0);
      };
    }
  }

  record Snippet(String file, int line, String lang, String body) {}

  static List<Snippet> snippets(String file) throws Exception {
    Path root = Path.of(System.getProperty("backstop.root", "../..")).toAbsolutePath().normalize();
    String[] lines = Files.readString(root.resolve(file), StandardCharsets.UTF_8).split("\n", -1);
    List<Snippet> out = new ArrayList<>();
    for (int i = 1; i < lines.length; i++) {
      Matcher f = FENCE.matcher(lines[i].trim());
      if (!f.matches() || !MARKER.matcher(lines[i - 1].trim()).matches()) continue;
      int start = i;
      StringBuilder body = new StringBuilder();
      for (i++; i < lines.length && !lines[i].trim().equals("```"); i++) body.append(lines[i]).append('\n');
      out.add(new Snippet(file, start + 1, f.group(1), body.toString()));
    }
    return out;
  }

  @TestFactory
  Stream<DynamicTest> theSpringSnippetsRunAsWritten() throws Exception {
    List<DynamicTest> tests = new ArrayList<>();
    for (String file : FILES) {
      List<Snippet> s = snippets(file);
      assertEquals(List.of("yaml", "java"), s.stream().map(Snippet::lang).toList(), file + ": its spring blocks");
      tests.add(DynamicTest.dynamicTest(file + ":" + s.get(1).line(), () -> run(s.get(0), s.get(1))));
    }
    return tests.stream();
  }

  static String scrape(PrometheusRegistry r) throws Exception {
    ByteArrayOutputStream b = new ByteArrayOutputStream();
    new PrometheusTextFormatWriter(false).write(b, r.scrape());
    return b.toString(StandardCharsets.UTF_8);
  }

  static void run(Snippet yml, Snippet listener) throws Exception {
    Path dir = Files.createTempDirectory("backstop-spring-readme");
    Path config = dir.resolve("application.yml");
    Files.writeString(config, yml.body());
    Matcher m = CLASS.matcher(listener.body());
    assertTrue(m.find(), listener.file() + ":" + listener.line() + ": no public class");
    String name = m.group(1);
    Path src = dir.resolve(name + ".java");
    Files.writeString(src, listener.body());
    JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
    assertNotNull(javac, "no javac: run the tests on a JDK");
    String cp = System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
    ByteArrayOutputStream errs = new ByteArrayOutputStream();
    int rc = javac.run(null, errs, errs, "-cp", cp, "-d", dir.toString(), "-Xlint:none", src.toString());
    assertEquals(0, rc, listener.file() + ":" + listener.line() + " does not compile:\n" + errs.toString(StandardCharsets.UTF_8));

    String tag = listener.file().replaceAll("\\W", "_") + "-";
    ANSWERS.put(tag + "ok", new ArrayList<>(List.of(503)));
    ANSWERS.put(tag + "bad", new ArrayList<>(List.of(400)));
    try (URLClassLoader loader = new URLClassLoader(new URL[] {dir.toUri().toURL()}, SpringReadmeTest.class.getClassLoader())) {
      Class<?> cls = loader.loadClass(name);
      try (ConfigurableApplicationContext ctx = new SpringApplicationBuilder(App.class)
          .properties("spring.config.location=file:" + config, "spring.rabbitmq.addresses=" + SpringTestBroker.url())
          .initializers(c -> ((GenericApplicationContext) c).registerBean(cls))
          .run()) {
        RabbitTemplate template = ctx.getBean(RabbitTemplate.class);
        template.convertAndSend("", Q, new OrderPlaced(tag + "ok", "a@example.com"));
        template.convertAndSend("", Q, new OrderPlaced(tag + "bad", "b@example.com"));
        // The 503 retried through the delay levels, then a success; the 400 not retried.
        SpringTestBroker.until("the retried order to succeed", () -> CALLS.stream().filter((tag + "ok")::equals).count() == 2);
        RabbitBroker broker = ctx.getBean(RabbitBroker.class);
        SpringTestBroker.until("the 400 dead-lettered", () -> {
          try {
            return broker.existingQueue(Q, 5).inspect(100).stream().anyMatch(d -> reasonOf(d, tag + "bad") != null);
          } catch (Exception e) {
            throw new RuntimeException(e);
          }
        });
        assertEquals("permanent_error", broker.existingQueue(Q, 5).inspect(100).stream()
            .map(d -> reasonOf(d, tag + "bad")).filter(r -> r != null).findFirst().orElseThrow());
        assertEquals(1, CALLS.stream().filter((tag + "bad")::equals).count());
        String metrics = scrape(ctx.getBean(PrometheusRegistry.class));
        assertTrue(metrics.contains("backstop_attempts_total{job_type=\"\",outcome=\"retry\",queue=\"" + Q + "\"} 1.0"), metrics);
        // Leave the shared broker's DLQ as found.
        ctx.getBean(org.springframework.amqp.core.AmqpAdmin.class).purgeQueue(Q + ".dlq", false);
      }
    }
  }

  static String reasonOf(RabbitDeadLetter d, String order) {
    return new String(d.payload(), StandardCharsets.UTF_8).contains("\"" + order + "\"") ? d.reason() : null;
  }
}
