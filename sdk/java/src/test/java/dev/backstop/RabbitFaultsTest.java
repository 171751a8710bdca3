package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.GetResponse;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * The Java RabbitMQ worker's kept outcomes, as Go's worker_test.go
 * (TestOutcomeKeptAcrossLostConnection, TestRefusedOutcomeIsRetriedWithoutRunningAgain)
 * and Node's and Python's fault tests pin them, against a real
 * rabbitmq-server: an outcome decided while the broker restarts, and one the
 * broker refuses (a full DLQ), are applied when the delivery comes back,
 * without running the job again.
 */
class RabbitFaultsTest {
  static final String ONCE = "{\"max_attempts\": 3}";

  @Test
  void anOutcomeDecidedWhileTheBrokerRestartsIsKeptAndAppliedWithoutRunningAgain() throws Exception {
    RabbitServer server = RabbitServer.get();
    RabbitWorkerTest.fresh("jkept");
    try (RabbitBroker b = RabbitBroker.connect(server.url); Policy p = Policy.load(ONCE)) {
      RabbitQueue q = b.queue("jkept");
      q.enqueue("job-k", new byte[0], null);
      AtomicInteger runs = new AtomicInteger();
      CountDownLatch started = new CountDownLatch(1);
      CountDownLatch release = new CountDownLatch(1);
      List<String> told = Collections.synchronizedList(new ArrayList<>());
      List<String> errors = Collections.synchronizedList(new ArrayList<>());
      WorkOptions o = WorkOptions.defaults().withOnOutcome(out -> told.add(out.action() + " " + out.reason()))
          .withOnError((err, job) -> errors.add(String.valueOf(err.getMessage())));
      try (RabbitWorker w = q.work(p, job -> {
        if (runs.incrementAndGet() == 1) {
          started.countDown();
          release.await(60, TimeUnit.SECONDS);
        }
      }, o)) {
        assertTrue(started.await(30, TimeUnit.SECONDS));
        server.ctl("stop_app"); // the delivery's channel goes with the broker
        release.countDown();
        RabbitCasesTest.until("the outcome kept", () -> errors.stream().anyMatch(e -> e.contains("kept for its redelivery")));
        server.ctl("start_app");
        RabbitCasesTest.until("the success applied after the restart", () -> told.contains("ack success"));
        RabbitCasesTest.until("the queue empty", () -> RabbitWorkerTest.ready(q) == 0);
      }
      assertEquals(1, runs.get(), "the job ran again: " + told + " " + errors);
      assertEquals(List.of("ack success"), told);
    } finally {
      server.ctl("start_app"); // a no-op when it runs; the other tests need the broker
    }
  }

  @Test
  void anOutcomeTheBrokerRefusesIsHandedBackAndAppliedOnceWithoutRunningAgain() throws Exception {
    RabbitServer server = RabbitServer.get();
    RabbitWorkerTest.fresh("jfull");
    server.ctl("set_policy", "--apply-to", "queues", "jfull-dlq", "^jfull\\.dlq$", "{\"max-length\":1,\"overflow\":\"reject-publish\"}");
    try (RabbitBroker b = RabbitBroker.connect(server.url); Policy p = Policy.load(ONCE);
        Connection c = RabbitWorkerTest.raw()) {
      // Each hand-back counts in x-delivery-count: a limit the pauses do not reach here.
      RabbitQueue q = b.queue("jfull", 20);
      q.declare();
      Channel ch = c.createChannel();
      ch.confirmSelect();
      // A quorum queue refuses once it is over its limit, not at it.
      RabbitCasesTest.until("the DLQ full", () -> {
        try {
          ch.basicPublish("", "jfull.dlq", new AMQP.BasicProperties.Builder().messageId("filler").build(), new byte[0]);
          return !ch.waitForConfirms(10_000);
        } catch (Exception e) {
          throw new AssertionError(e);
        }
      });
      q.enqueue("bad", "b".getBytes(StandardCharsets.UTF_8), null);
      AtomicInteger runs = new AtomicInteger();
      List<String> told = Collections.synchronizedList(new ArrayList<>());
      List<String> refusals = Collections.synchronizedList(new ArrayList<>());
      WorkOptions o = WorkOptions.defaults().withOnOutcome(out -> told.add(out.action() + " " + out.reason()))
          .withOnError((err, job) -> {
            if (String.valueOf(err.getMessage()).contains("refused by the broker")) refusals.add(err.getMessage());
          });
      try (RabbitWorker w = q.work(p, job -> {
        runs.incrementAndGet();
        throw new HttpStatusException(400);
      }, o)) {
        // Refused, handed back, delivered again (its kept outcome applied, not run) and refused again.
        RabbitCasesTest.until("the dead letter refused twice", () -> refusals.size() >= 2);
        server.ctl("set_policy", "--apply-to", "queues", "jfull-dlq", "^jfull\\.dlq$", "{\"max-length\":1000,\"overflow\":\"reject-publish\"}");
        RabbitCasesTest.until("the dead letter applied", () -> told.size() == 1);
      }
      assertEquals(1, runs.get(), "a refused outcome is kept, not decided again");
      assertEquals(List.of("dead_letter permanent_error"), told);
      List<String> ids = new ArrayList<>();
      for (GetResponse g; (g = ch.basicGet("jfull.dlq", true)) != null; ) {
        if (!"filler".equals(g.getProps().getMessageId())) ids.add(g.getProps().getMessageId());
      }
      assertEquals(List.of("bad"), ids);
    } finally {
      server.ctl("clear_policy", "jfull-dlq");
    }
  }
}
