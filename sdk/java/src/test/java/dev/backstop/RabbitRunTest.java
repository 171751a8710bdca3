package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.Delivery;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * The force-run protocol (queue/rabbitmq/run.go, {@code backstop queue run
 * --id J}) answered by the Java mover against a real rabbitmq-server: the
 * commands are written here exactly as Go's runHeld sends them (a count on
 * the backstop.run fanout exchange, then a take to the mover's own command
 * queue, replies by direct reply-to), and the job the Java mover held for an
 * hour runs at once, its attempt kept and its due time dropped.
 */
class RabbitRunTest {
  static final String REPLY = "amq.rabbitmq.reply-to";

  // One of Go's commands: op with limit n, to exchange/key, correlated by corr.
  static void ask(Channel ch, String exchange, String key, String op, String corr, String queue, String id, long n)
      throws Exception {
    Map<String, Object> h = new HashMap<>();
    h.put("backstop-run-queue", queue);
    h.put("backstop-run-id", id);
    h.put("backstop-run-op", op);
    h.put("backstop-run-limit", Long.toString(n));
    ch.basicPublish(exchange, key, new AMQP.BasicProperties.Builder().headers(h).replyTo(REPLY).correlationId(corr).build(),
        new byte[0]);
  }

  // The replies correlated with corr that come within 5 s (Go's runWait) of the last one.
  static List<Map<String, String>> replies(BlockingQueue<Delivery> in, String corr) throws InterruptedException {
    List<Map<String, String>> out = new ArrayList<>();
    Delivery d;
    while ((d = in.poll(out.isEmpty() ? 5 : 1, TimeUnit.SECONDS)) != null) {
      if (!corr.equals(d.getProperties().getCorrelationId())) continue;
      Map<String, String> m = new HashMap<>();
      d.getProperties().getHeaders().forEach((k, v) -> m.put(k, Rabbit.text(v)));
      out.add(m);
    }
    return out;
  }

  static Map<String, String> holder(List<Map<String, String>> answers) {
    for (Map<String, String> a : answers) {
      if (!a.get("backstop-run-matched").equals("0")) return a;
    }
    return null;
  }

  @Test
  void aRunTakesTheJobAJavaMoverHolds() throws Exception {
    RabbitWorkerTest.fresh("jrun");
    try (RabbitBroker b = RabbitBroker.connect(RabbitWorkerTest.url()); Policy p = Policy.load("{\"max_attempts\": 3}")) {
      RabbitQueue q = b.queue("jrun");
      List<RabbitJob> ran = java.util.Collections.synchronizedList(new ArrayList<>());
      CountDownLatch done = new CountDownLatch(1);
      try (RabbitWorker w = q.work(p, job -> {
        ran.add(job);
        done.countDown();
      }, WorkOptions.defaults()); Connection c = RabbitWorkerTest.raw()) {
        q.enqueue("held-1", "{}".getBytes(), "charge", null, Duration.ofHours(1));
        Channel ch = c.createChannel();
        BlockingQueue<Delivery> in = new LinkedBlockingQueue<>();
        ch.basicConsume(REPLY, true, (tag, d) -> in.add(d), tag -> {});
        // The mover holds it once it has its delivery of the hold level (and
        // answers once its command queue is bound): ask until it counts it.
        Map<String, String> a = null;
        List<Map<String, String>> answers = List.of();
        long end = System.nanoTime() + 30_000_000_000L;
        while (a == null && System.nanoTime() < end) {
          ask(ch, Rabbit.RUN, "", "count", "count", "jrun", "held-1", 0);
          answers = replies(in, "count");
          a = holder(answers);
        }
        assertNotNull(a, "no mover counted the held job: " + answers);
        assertEquals("1", a.get("backstop-run-matched"));
        assertEquals("0", a.get("backstop-run-moved"), "a count moves nothing");
        assertTrue(a.get("backstop-run-mover").startsWith("amq.gen-"), a.toString());
        assertEquals(0, ran.size(), "the job waits its hour");
        ask(ch, "", a.get("backstop-run-mover"), "take", "take-0", "jrun", "held-1", 100_000);
        List<Map<String, String>> took = replies(in, "take-0");
        assertEquals(1, took.size(), took.toString());
        assertEquals("1", took.get(0).get("backstop-run-matched"));
        assertEquals("1", took.get(0).get("backstop-run-moved"));
        assertTrue(done.await(30, TimeUnit.SECONDS), "the job ran after the take");
        // Asked again, nobody holds it any more.
        ask(ch, Rabbit.RUN, "", "count", "count", "jrun", "held-1", 0);
        assertEquals(null, holder(replies(in, "count")));
      }
      RabbitJob j = ran.get(0);
      assertEquals("held-1", j.id());
      assertEquals(1, j.attempt(), "its attempt kept");
      assertEquals(0, j.dueMs(), "its due time dropped");
      assertEquals("charge", j.jobType());
      assertEquals(1, ran.size());
    }
  }
}
