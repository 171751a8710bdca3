package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.GetResponse;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * The Java RabbitMQ worker beyond one delivery (the shared cases): the delay
 * levels moved by its mover, per-type policies, the outcome hook, a graceful
 * stop with a job in hand, a long job under short heartbeats, the mover's
 * dead letters of a delayed message with no queue, and the argument checks;
 * each against a real rabbitmq-server.
 */
class RabbitWorkerTest {
  static final String FAST = "{\"max_attempts\": 3, \"backoff\": {\"strategy\": \"constant\", \"base\": \"1s\"},"
      + " \"jitter\": {\"mode\": \"none\"}}";

  static String url() throws Exception {
    return RabbitServer.get().url;
  }

  static Connection raw() throws Exception {
    ConnectionFactory f = new ConnectionFactory();
    f.setUri(url());
    f.setVirtualHost("/");
    return f.newConnection("test");
  }

  static void fresh(String q) throws Exception {
    try (Connection c = raw()) {
      Channel ch = c.createChannel();
      ch.queueDelete(q);
      ch.queueDelete(q + ".dlq");
      ch.exchangeDelete(q + ".delay");
      ch.exchangeDelete(q + ".due");
    }
  }

  record Told(String action, String reason, long attempt, String failureClass, long delayMs) {}

  @Test
  void aFailedJobIsRetriedThroughTheDelayLevelsAndSucceeds() throws Exception {
    fresh("jretry");
    try (RabbitBroker b = RabbitBroker.connect(url()); Policy p = Policy.load(FAST)) {
      RabbitQueue q = b.queue("jretry");
      q.enqueue("order-1", "{}".getBytes(StandardCharsets.UTF_8), "send_email");
      List<Told> told = Collections.synchronizedList(new ArrayList<>());
      CountDownLatch done = new CountDownLatch(1);
      PrometheusRegistry reg = new PrometheusRegistry();
      WorkOptions o = WorkOptions.defaults().withMetrics(reg, "default")
          .<RabbitJob>withOnOutcome(out -> {
            told.add(new Told(out.action(), out.reason(), out.job().attempt(), out.failureClass(), out.delayMs()));
            assertEquals("jretry", out.queue());
            if (out.action().equals("ack")) done.countDown();
          });
      try (RabbitWorker w = q.work(p, job -> {
        if (job.attempt() == 1) throw new HttpStatusException(503);
        assertEquals("transient", job.lastReason());
        assertEquals("send_email", job.jobType());
      }, o)) {
        assertTrue(done.await(30, java.util.concurrent.TimeUnit.SECONDS), "the retry came back: " + told);
      }
      assertEquals(List.of(new Told("retry", "transient", 1, "retryable", 1000), new Told("ack", "success", 2, "", 0)), told);
      String text = MetricsTest.scrape(reg);
      assertTrue(text.contains("backstop_attempts_total{job_type=\"send_email\",outcome=\"retry\",queue=\"jretry\"} 1"), text);
      assertTrue(text.contains("backstop_job_attempts_count{job_type=\"send_email\",outcome=\"success\",queue=\"jretry\"} 1"), text);
      RabbitQueue.Stats st = q.stats();
      assertEquals(0, st.ready());
      assertEquals(0, st.dlq());
    }
  }

  @Test
  void aJobTypeRunsWithItsOwnPolicy() throws Exception {
    fresh("jtyped");
    try (RabbitBroker b = RabbitBroker.connect(url()); Policy p = Policy.load(FAST);
        Policy once = Policy.load("{\"max_attempts\": 1}")) {
      RabbitQueue q = b.queue("jtyped");
      q.enqueue("a", new byte[0], "charge");
      CountDownLatch done = new CountDownLatch(1);
      WorkOptions o = WorkOptions.defaults().withPolicies(Map.of("charge", once))
          .withOnOutcome(out -> done.countDown());
      try (RabbitWorker w = q.work(p, job -> {
        throw new HttpStatusException(503);
      }, o)) {
        assertTrue(done.await(30, java.util.concurrent.TimeUnit.SECONDS));
      }
      List<RabbitDeadLetter> dls = q.inspect(10);
      assertEquals(1, dls.size());
      assertEquals("max_attempts_reached", dls.get(0).reason());
      assertEquals("a", dls.get(0).id());
      // RabbitMQ counts requeued messages a moment late.
      RabbitCasesTest.until("inspect to give it back", () -> dlq(q) == 1);
      assertEquals(1, q.replay(10, "max_attempts_reached", false));
      RabbitCasesTest.until("the replayed job to leave the DLQ", () -> dlq(q) == 0);
    }
  }

  static long ready(RabbitQueue q) {
    try {
      return q.stats().ready();
    } catch (Exception e) {
      throw new AssertionError(e);
    }
  }

  static long dlq(RabbitQueue q) {
    try {
      return q.stats().dlq();
    } catch (Exception e) {
      throw new AssertionError(e);
    }
  }

  @Test
  void closeFinishesTheJobInHand() throws Exception {
    fresh("jstop");
    try (RabbitBroker b = RabbitBroker.connect(url()); Policy p = Policy.load(FAST)) {
      RabbitQueue q = b.queue("jstop");
      q.enqueue("slow", new byte[0], null);
      CountDownLatch started = new CountDownLatch(1);
      AtomicInteger finished = new AtomicInteger();
      RabbitWorker w = q.work(p, job -> {
        started.countDown();
        Thread.sleep(500); // the job in hand while the worker stops
        finished.incrementAndGet();
      }, WorkOptions.defaults());
      assertTrue(started.await(30, java.util.concurrent.TimeUnit.SECONDS));
      w.close();
      assertEquals(1, finished.get());
      assertTrue(!w.isRunning());
      RabbitQueue.Stats st = q.stats();
      assertEquals(0, st.ready(), "acked before the connection closed");
      assertEquals(0, st.consumers());
    }
  }

  @Test
  void aLongJobUnderShortHeartbeatsRunsOnce() throws Exception {
    fresh("jlong");
    try (RabbitBroker b = RabbitBroker.connect(url()); Policy p = Policy.load(FAST)) {
      b.factory.setRequestedHeartbeat(1); // the worker's connection: a missed heartbeat would close it in ~2 s
      RabbitQueue q = b.queue("jlong");
      q.enqueue("long", new byte[0], null);
      AtomicInteger runs = new AtomicInteger();
      CountDownLatch done = new CountDownLatch(1);
      try (RabbitWorker w = q.work(p, job -> {
        runs.incrementAndGet();
        Thread.sleep(3500); // longer than the heartbeat timeout
      }, WorkOptions.defaults().withOnOutcome(out -> done.countDown()))) {
        assertTrue(done.await(30, java.util.concurrent.TimeUnit.SECONDS));
      }
      assertEquals(1, runs.get());
      assertEquals(0, q.stats().ready());
    }
  }

  @Test
  void aDelayedMessageWithNoQueueIsDeadLetteredUnroutable() throws Exception {
    fresh("jgone");
    try (RabbitBroker b = RabbitBroker.connect(url()); Policy p = Policy.load(FAST); Connection c = raw()) {
      RabbitQueue q = b.queue("jgone");
      q.declare();
      Channel ch = c.createChannel();
      ch.queuePurge(Rabbit.UNROUTABLE);
      ch.confirmSelect();
      // Delayed for 1 s towards a queue that does not exist.
      Map<String, Object> h = Map.of(Rabbit.H_ATTEMPT, "2", Rabbit.H_FIRST, "1700000000000",
          Rabbit.H_DEST, "jgone-nowhere", Rabbit.H_DUE, Long.toString(System.currentTimeMillis() + 1000));
      ch.basicPublish(Rabbit.ENTER, Rabbit.routingKey(1000), new AMQP.BasicProperties.Builder().messageId("lost")
          .headers(h).deliveryMode(2).build(), new byte[0]);
      ch.waitForConfirmsOrDie(10_000);
      try (RabbitWorker w = q.work(p, job -> {}, WorkOptions.defaults())) {
        GetResponse[] got = new GetResponse[1];
        RabbitCasesTest.until("the unroutable dead letter", () -> {
          try {
            return (got[0] = ch.basicGet(Rabbit.UNROUTABLE, true)) != null;
          } catch (java.io.IOException e) {
            throw new AssertionError(e);
          }
        });
        Map<String, Object> dh = got[0].getProps().getHeaders();
        assertEquals("unroutable", dh.get(Rabbit.H_REASON).toString());
        assertEquals("no route to queue \"jgone-nowhere\": it was deleted or never declared", dh.get(Rabbit.H_ERROR).toString());
        assertEquals("lost", got[0].getProps().getMessageId());
      }
    }
  }

  @Test
  void argumentsAreCheckedNamingTheOption() throws Exception {
    try (RabbitBroker b = RabbitBroker.connect(url())) {
      RabbitQueue q = b.queue("jargs");
      assertThrows(IllegalArgumentException.class, () -> b.queue("", 5));
      assertThrows(IllegalArgumentException.class, () -> b.queue("x", 0));
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
          () -> q.enqueue("j", new byte[0], null, null, Duration.ofDays(31)));
      assertTrue(e.getMessage().contains("delay must be at most 30 days"), e.getMessage());
      assertThrows(IllegalArgumentException.class, () -> q.enqueue("j", new byte[0], "bad:type"));
      assertThrows(IllegalArgumentException.class, () -> WorkOptions.defaults().withHandlerTimeout(Duration.ZERO));
      assertThrows(IllegalArgumentException.class, () -> WorkOptions.defaults().withPrefetch(0));
      assertThrows(IllegalArgumentException.class, () -> q.replay(0, null, false));
    }
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> RabbitBroker.connect("http://user:s3cret@host/"));
    assertTrue(!e.getMessage().contains("s3cret"), "the URL's password is not repeated");
  }

  @Test
  void aQueueDeclaredWithOtherArgumentsStopsTheWorker() throws Exception {
    fresh("jother");
    try (Connection c = raw(); RabbitBroker b = RabbitBroker.connect(url()); Policy p = Policy.load(FAST)) {
      c.createChannel().queueDeclare("jother", true, false, false, Map.of("x-queue-type", "quorum"));
      RabbitWorker w = b.queue("jother").work(p, job -> {}, WorkOptions.defaults().withoutMover());
      w.await();
      assertTrue(w.failure().isPresent());
      assertTrue(w.failure().get().toString().contains("PRECONDITION_FAILED"), w.failure().get().toString());
    }
  }

  @Test
  void aQueueSpringDeclaredIsWorkedWithoutDeclaringItAgain() throws Exception {
    // As a Spring Boot application declares it: quorum, its own dead-letter
    // exchange and DLQ (QueueBuilder.durable(...).quorum().deadLetterExchange(...)).
    String q = "jspring.order-placed";
    fresh(q);
    try (Connection c = raw(); RabbitBroker b = RabbitBroker.connect(url()); Policy p = Policy.load(FAST)) {
      Channel ch = c.createChannel();
      ch.exchangeDeclare("jspring.dlx", "direct", true);
      ch.queueDeclare(q, true, false, false, Map.of("x-queue-type", "quorum", "x-dead-letter-exchange", "jspring.dlx"));
      ch.queueDeclare(q + ".dlq", true, false, false, Map.of("x-queue-type", "quorum"));
      ch.queueBind(q + ".dlq", "jspring.dlx", q);
      // What a Spring RabbitTemplate sends: no backstop headers, no message_id.
      ch.basicPublish("", q, new AMQP.BasicProperties.Builder().contentType("application/json").deliveryMode(2).build(),
          "{\"order\":1}".getBytes(StandardCharsets.UTF_8));
      ch.basicPublish("", q, new AMQP.BasicProperties.Builder().messageId("bad-1").deliveryMode(2).build(),
          "{\"order\":2}".getBytes(StandardCharsets.UTF_8));
      List<Told> told = Collections.synchronizedList(new ArrayList<>());
      CountDownLatch done = new CountDownLatch(3);
      RabbitQueue queue = b.existingQueue(q, 5);
      try (RabbitWorker w = queue.work(p, job -> {
        if (job.payloadText().contains("2")) throw new HttpStatusException(400);
        if (job.attempt() == 1) throw new HttpStatusException(503);
      }, WorkOptions.defaults().<RabbitJob>withOnOutcome(out -> {
        told.add(new Told(out.action(), out.reason(), out.job().attempt(), out.failureClass(), out.delayMs()));
        done.countDown();
      }))) {
        assertTrue(done.await(30, java.util.concurrent.TimeUnit.SECONDS), "outcomes: " + told + " " + w.failure());
        assertTrue(w.failure().isEmpty());
      }
      assertTrue(told.contains(new Told("dead_letter", "permanent_error", 1, "permanent", 0)), told.toString());
      assertTrue(told.contains(new Told("retry", "transient", 1, "retryable", 1000)), told.toString());
      assertTrue(told.contains(new Told("ack", "success", 2, "", 0)), told.toString());
      List<RabbitDeadLetter> dls = queue.inspect(10);
      assertEquals(1, dls.size());
      assertEquals("permanent_error", dls.get(0).reason());
      assertEquals("bad-1", dls.get(0).id());
      // Its arguments are Spring's still.
      assertEquals(0, ch.queueDeclarePassive(q).getMessageCount());
    }
  }
}
