package dev.backstop.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.GetResponse;
import dev.backstop.RabbitBroker;
import dev.backstop.RabbitDeadLetter;
import dev.backstop.SpringTestBroker;
import dev.backstop.example.notification.NotificationService;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;
import ch.qos.logback.classic.Level;
import ch.qos.logback.classic.Logger;
import ch.qos.logback.classic.spi.ILoggingEvent;
import ch.qos.logback.core.AppenderBase;
import org.slf4j.LoggerFactory;
import org.junit.jupiter.api.Test;
import org.springframework.amqp.rabbit.core.RabbitTemplate;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.test.context.DynamicPropertyRegistry;
import org.springframework.test.context.DynamicPropertySource;
import org.springframework.test.annotation.DirtiesContext;

/**
 * The notification-service scenario (issue 44): a real Spring Boot 4
 * application (NotificationService) against a real rabbitmq-server, its
 * queue declared by Spring (quorum, notification.dlx, its DLQ) and worked
 * through backstop's existing-queue mode by backstop-spring.
 */
// Metrics exported as in production (tests turn exporters off by default).
@SpringBootTest(classes = NotificationService.class, properties = "management.prometheus.metrics.export.enabled=true")
@DirtiesContext // its listeners stop with the class: SpringReadmeTest consumes the same queue
class NotificationServiceTest {
  static final String Q = NotificationService.QUEUE;

  @DynamicPropertySource
  static void broker(DynamicPropertyRegistry r) throws Exception {
    String url = SpringTestBroker.url();
    r.add("spring.rabbitmq.addresses", () -> url);
    // A retry already waiting in the delay levels when the service starts (as after a
    // restart): it must come back though no new message arrives first. The queue as
    // Spring declares it (the same arguments: Spring's declaration then matches).
    ConnectionFactory f = new ConnectionFactory();
    f.setUri(url);
    f.setVirtualHost("/");
    try (Connection c = f.newConnection(); RabbitBroker b = RabbitBroker.connect(url)) {
      c.createChannel().queueDeclare(Q, true, false, false,
          Map.of("x-queue-type", "quorum", "x-dead-letter-exchange", "notification.dlx"));
      b.existingQueue(Q, 5).enqueue("D-4", "{\"orderId\":\"D-4\",\"email\":\"d@example.com\"}"
          .getBytes(StandardCharsets.UTF_8), null, "application/json", java.time.Duration.ofSeconds(1));
    }
  }

  @Autowired RabbitTemplate template;
  @Autowired NotificationService.Provider provider;
  @Autowired NotificationService.Listener listener;
  @Autowired PrometheusMeterRegistry registry; // what /actuator/prometheus serves
  @Autowired RabbitBroker broker;

  static Path root() {
    return Path.of(System.getProperty("backstop.root", "../..")).toAbsolutePath().normalize();
  }

  /** The backstop command: -Dbackstop.cli, else built from cmd/backstop into target/. */
  static String cli() throws Exception {
    String p = System.getProperty("backstop.cli");
    if (p != null && !p.isEmpty()) return p;
    Path out = Path.of("target", "backstop").toAbsolutePath();
    run(root(), "go", "build", "-o", out.toString(), "./cmd/backstop");
    return out.toString();
  }

  /** cmd's standard output (its standard error goes to the test's). */
  static String run(Path dir, String... cmd) throws Exception {
    Process proc = new ProcessBuilder(cmd).directory(dir.toFile()).redirectError(ProcessBuilder.Redirect.INHERIT).start();
    String out = new String(proc.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertEquals(0, proc.waitFor(), String.join(" ", cmd) + ": " + out);
    return out;
  }

  /** The text /actuator/prometheus serves: Micrometer's registry, backstop's families in it. */
  String scrape() {
    return registry.scrape();
  }

  List<String> calls(String order) {
    List<String> out = new ArrayList<>();
    for (String c : provider.calls) if (c.startsWith(order + " ")) out.add(c);
    return out;
  }

  /** The dead letters of order in Spring's DLQ. */
  List<RabbitDeadLetter> deadLetters(String order) {
    return deadLetters(Q, order);
  }

  /** The dead letters of order in queue's DLQ. */
  List<RabbitDeadLetter> deadLetters(String queue, String order) {
    try {
      List<RabbitDeadLetter> out = new ArrayList<>();
      for (RabbitDeadLetter d : broker.existingQueue(queue, 5).inspect(100)) {
        if (new String(d.payload(), StandardCharsets.UTF_8).contains("\"" + order + "\"")) out.add(d);
      }
      return out;
    } catch (Exception e) {
      throw new RuntimeException(e);
    }
  }

  /** The WARN and ERROR events of Spring AMQP's loggers (its listener containers and error handlers). */
  static final class Warnings extends AppenderBase<ILoggingEvent> {
    final List<String> seen = new CopyOnWriteArrayList<>();

    @Override
    protected void append(ILoggingEvent e) {
      if (e.getLevel().isGreaterOrEqual(Level.WARN) && e.getLoggerName().startsWith("org.springframework.amqp")) {
        seen.add(e.getLevel() + " " + e.getLoggerName() + ": " + e.getFormattedMessage());
      }
    }
  }

  @Test
  void theNotificationServiceRetriesColdDeadLettersWithReasonsAndReplays() throws Exception {
    Logger root = (Logger) LoggerFactory.getLogger(org.slf4j.Logger.ROOT_LOGGER_NAME);
    Warnings warnings = new Warnings();
    warnings.start();
    root.addAppender(warnings);
    try {
      run(warnings);
    } finally {
      root.detachAppender(warnings);
    }
  }

  void run(Warnings warnings) throws Exception {
    SpringTestBroker.until("D-4, waiting in the delay levels, to run", () -> calls("D-4").size() == 1);
    assertEquals(List.of("D-4 1 -"), calls("D-4"));

    // A provider answering 503 twice then 200, published by Spring's RabbitTemplate
    // (JacksonJsonMessageConverter, no message_id, no backstop header).
    provider.answers.put("A-1", new ArrayList<>(List.of(503, 503)));
    template.convertAndSend("", Q, new NotificationService.OrderPlaced("A-1", "a@example.com"));
    SpringTestBroker.until("A-1's third call", () -> calls("A-1").size() == 3);
    // Attempt 1 as published (no header), then backstop's attempts 2 and 3 after the
    // policy's delays (initial-interval 1s, multiplier 2): cold retries through the delay levels.
    assertEquals(List.of("A-1 - -", "A-1 2 1000", "A-1 3 2000"), calls("A-1"));
    SpringTestBroker.until("A-1's success counted", () -> {
      try {
        return scrape().contains("backstop_attempts_total{job_type=\"\",outcome=\"success\",queue=\"" + Q + "\"} 2.0"); // D-4's and A-1's
      } catch (Exception e) {
        throw new RuntimeException(e);
      }
    });
    String metrics = scrape();
    assertTrue(metrics.contains("backstop_attempts_total{job_type=\"\",outcome=\"retry\",queue=\"" + Q + "\"} 2.0"), metrics);
    assertTrue(metrics.contains("backstop_retries_total{job_type=\"\",queue=\"" + Q + "\",reason=\"transient\"} 2.0"), metrics);

    // A queue with its own policy (one attempt), consumed through a listener container
    // factory the application defines itself: the same 503 is not retried there.
    provider.answers.put("S-1", new ArrayList<>(List.of(503)));
    template.convertAndSend("", NotificationService.OTHER, new NotificationService.OrderPlaced("S-1", "s@example.com"));
    SpringTestBroker.until("S-1 dead-lettered", () -> deadLetters(NotificationService.OTHER, "S-1").size() == 1);
    assertEquals("max_attempts_reached", deadLetters(NotificationService.OTHER, "S-1").get(0).reason());
    assertEquals("", deadLetters(NotificationService.OTHER, "S-1").get(0).jobType());
    assertEquals(List.of("S-1 - -"), calls("S-1"));
    int sms = listener.sms.get();

    // A job type with its own policy (one attempt): its 503 is not retried.
    provider.answers.put("C-3", new ArrayList<>(List.of(503)));
    template.convertAndSend("", Q, new NotificationService.OrderPlaced("C-3", "c@example.com"), m -> {
      m.getMessageProperties().setHeader("backstop-job-type", "send_sms");
      return m;
    });
    SpringTestBroker.until("C-3 dead-lettered", () -> deadLetters("C-3").size() == 1);
    assertEquals("max_attempts_reached", deadLetters("C-3").get(0).reason());
    assertEquals("send_sms", deadLetters("C-3").get(0).jobType());
    assertEquals(List.of("C-3 - -"), calls("C-3"));

    // A permanent error: to Spring's DLQ with backstop's reason, not retried.
    provider.answers.put("B-2", new ArrayList<>(List.of(400)));
    template.convertAndSend("", Q, new NotificationService.OrderPlaced("B-2", "b@example.com"));
    SpringTestBroker.until("B-2 dead-lettered", () -> {
      try {
        return deadLetters("B-2").size() == 1;
      } catch (Exception e) {
        throw new RuntimeException(e);
      }
    });
    List<RabbitDeadLetter> dls = deadLetters("B-2");
    assertEquals("permanent_error", dls.get(0).reason());
    assertEquals(Q, dls.get(0).destination());
    assertEquals(List.of("B-2 - -"), calls("B-2"));
    ConnectionFactory f = new ConnectionFactory();
    f.setUri(SpringTestBroker.url());
    f.setVirtualHost("/"); // the Java client reads amqp://host/ as the vhost ""
    try (Connection c = f.newConnection()) {
      Channel ch = c.createChannel();
      GetResponse g;
      do {
        g = ch.basicGet(Q + ".dlq", false); // held (unacked) until the channel closes: back in the DLQ
      } while (!new String(g.getBody(), StandardCharsets.UTF_8).contains("\"B-2\""));
      Map<String, Object> h = g.getProps().getHeaders();
      assertEquals("permanent_error", h.get("backstop-reason").toString());
      assertTrue(h.get("backstop-error").toString().contains("400"), h.toString());
      // Through Spring's own dead-letter exchange: the broker's x-death names the queue.
      List<?> deaths = (List<?>) h.get("x-death");
      assertTrue(deaths != null && !deaths.isEmpty(), "no x-death: " + h);
      Map<?, ?> death = (Map<?, ?>) deaths.get(0);
      assertEquals(Q, death.get("queue").toString(), death.toString());
      assertEquals("rejected", death.get("reason").toString(), death.toString());
      ch.basicNack(0, true, true); // every one looked at goes back
      // Spring's queue is as Spring declared it: backstop declared nothing over it.
      assertEquals(0, ch.queueDeclarePassive(Q).getMessageCount());
    }

    // The CLI reads Spring's DLQ (it has backstop's DLQ name) and its reasons.
    String seen = run(root(), cli(), "dlq", "inspect", "--amqp.url", SpringTestBroker.url(), "--queue", Q);
    assertTrue(seen.contains("permanent_error"), seen);

    // Fixed; `backstop dlq replay --limit` brings it back to the original queue only.
    String out = run(root(), cli(), "dlq", "replay", "--amqp.url", SpringTestBroker.url(), "--queue", Q, "--limit", "10", "--reason", "permanent_error");
    SpringTestBroker.until("B-2 replayed", () -> calls("B-2").size() == 2);
    assertEquals("B-2 1 -", calls("B-2").get(1), out); // afresh: attempt 1
    assertEquals(sms, listener.sms.get()); // the other queue got nothing
    assertEquals(0, deadLetters("B-2").size());
    broker.existingQueue(Q, 5).replay(100, null, false); // C-3 back (a success now): the DLQ as found
    SpringTestBroker.until("C-3 replayed", () -> calls("C-3").size() == 2);
    // B-2's and C-3's dead letters went through their queue's dead-letter exchange (rejected
    // there by backstop's advice), S-1's straight to its DLQ (a direct container's queue):
    // normal outcomes, not a warning with a stack trace per message.
    assertEquals(List.of(), warnings.seen);
  }
}
