package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import io.lettuce.core.RedisClient;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * The measured retry latency (backstop_client_retry_latency_seconds: a
 * failure to the start of its retry) as Go's queue/redisqueue/latency_test.go
 * and queue/rabbitmq/latency_test.go prove it: a stalled promoter or mover
 * shows as latency above the decided delay (backstop_client_retry_delay_seconds);
 * a job deferred since its failure (circuit_open) is not measured. The stalls
 * are made without waiting, against real servers.
 */
class QueueLatencyTest {
  static final long STALL_MS = 5000;

  /** The value of sample name{policy="payments",target=queue} in reg (0 when absent). */
  static double sample(PrometheusRegistry reg, String name, String queue) throws Exception {
    String want = name + "{policy=\"payments\",target=\"" + queue + "\"} ";
    for (String line : MetricsTest.scrape(reg).split("\n")) {
      if (line.startsWith(want)) return Double.parseDouble(line.substring(want.length()).trim());
    }
    return 0;
  }

  static boolean counted(PrometheusRegistry reg, String queue) {
    try {
      return sample(reg, "backstop_client_retry_latency_seconds_count", queue) >= 1;
    } catch (Exception e) {
      throw new AssertionError(e);
    }
  }

  // The worker promotes every second itself: the decided delay is an hour,
  // so that no promotion comes before the test moves the member's score an
  // hour and 5 s back (due 5 s ago: a promoter stalled 5 s). Then promote.
  @Test
  void aStalledRedisPromoterShowsInTheRetryLatency() throws Exception {
    RedisClient client = RedisClient.create(RedisServer.get().url);
    try (RedisQueue q = RedisQueue.create(client, "jlatency");
        Policy p = Policy.load("{\"max_attempts\": 3, \"backoff\": {\"strategy\": \"constant\", \"base\": \"1h\","
            + " \"cap\": \"1h\"}, \"jitter\": {\"mode\": \"none\"}}")) {
      RedisCasesTest.cmd(q, "DEL", q.keys().jobs(), q.keys().delayed(), q.keys().dlq(), q.keys().stats());
      q.ensureGroup();
      q.enqueue("job-1", new byte[0], null);
      PrometheusRegistry reg = new PrometheusRegistry();
      List<RedisJob> started = java.util.Collections.synchronizedList(new java.util.ArrayList<>());
      CountDownLatch second = new CountDownLatch(1);
      try (RedisWorker w = q.work(p, job -> {
        started.add(job);
        if (job.attempt() == 1) throw new HttpStatusException(503);
        second.countDown();
      }, WorkOptions.defaults().withMetrics(reg, "payments"))) {
        RabbitCasesTest.until("the failed job in the delayed set",
            () -> ((List<?>) RedisCasesTest.cmd(q, "ZRANGE", q.keys().delayed(), "0", "-1")).size() == 1);
        Object member = ((List<?>) RedisCasesTest.cmd(q, "ZRANGE", q.keys().delayed(), "0", "0")).get(0);
        RedisCasesTest.cmd(q, "ZINCRBY", q.keys().delayed(), Long.toString(-(3_600_000 + STALL_MS)), member);
        q.promote(10); // or the worker's own promote: either moves it once
        assertTrue(second.await(30, TimeUnit.SECONDS), "attempt 2 never started: " + started);
        RabbitCasesTest.until("the retry latency recorded", () -> counted(reg, "jlatency"));
      }
      RedisJob j = started.get(1);
      assertEquals(2, j.attempt());
      assertEquals(3_600_000, j.prevDelayMs());
      assertTrue(j.dueMs() > 0, "due_ms on the promoted entry: " + j.fields());
      assertEquals(3600.0, sample(reg, "backstop_client_retry_delay_seconds_sum", "jlatency"), "the decided delay");
      assertEquals(1.0, sample(reg, "backstop_client_retry_latency_seconds_count", "jlatency"));
      double latency = sample(reg, "backstop_client_retry_latency_seconds_sum", "jlatency");
      // It failed (as the set says) an hour and 5 s before it started.
      assertTrue(latency >= 3600 + STALL_MS / 1000.0, "measured latency " + latency + " s; want the delay and the stall");
    } finally {
      client.shutdown();
    }
  }

  // What a mover 5 s late delivers: attempt 2, due 5 s ago after a 1 s delay;
  // and a job deferred by the breaker (circuit_open), not measured.
  @Test
  void aStalledRabbitMoverShowsInTheRetryLatency() throws Exception {
    RabbitWorkerTest.fresh("jlatency");
    try (RabbitBroker b = RabbitBroker.connect(RabbitWorkerTest.url()); Policy p = Policy.load("{\"max_attempts\": 3}")) {
      RabbitQueue q = b.queue("jlatency");
      q.declare();
      long due = System.currentTimeMillis() - STALL_MS;
      try (Connection c = RabbitWorkerTest.raw()) {
        Channel ch = c.createChannel();
        for (String[] m : List.of(new String[] {"deferred", "circuit_open"}, new String[] {"late", "transient"})) {
          Map<String, Object> h = new HashMap<>();
          h.put(Rabbit.H_ATTEMPT, "2");
          h.put(Rabbit.H_FIRST, Long.toString(due - 1000));
          h.put(Rabbit.H_DUE, Long.toString(due));
          h.put(Rabbit.H_PREV_DELAY, "1000");
          h.put(Rabbit.H_LAST_REASON, m[1]);
          h.put(Rabbit.H_DEST, "jlatency");
          ch.basicPublish("", "jlatency", new AMQP.BasicProperties.Builder().messageId(m[0]).headers(h).build(),
              new byte[0]);
        }
      }
      PrometheusRegistry reg = new PrometheusRegistry();
      CountDownLatch done = new CountDownLatch(2);
      try (RabbitWorker w = q.work(p, job -> done.countDown(), WorkOptions.defaults().withMetrics(reg, "payments"))) {
        assertTrue(done.await(30, TimeUnit.SECONDS), "both jobs ran");
        RabbitCasesTest.until("the retry latency recorded", () -> counted(reg, "jlatency"));
      }
      assertEquals(1.0, sample(reg, "backstop_client_retry_latency_seconds_count", "jlatency"),
          "the deferred job is not measured");
      double latency = sample(reg, "backstop_client_retry_latency_seconds_sum", "jlatency");
      assertTrue(latency >= 1 + STALL_MS / 1000.0, "measured latency " + latency + " s; want the 1 s delay and the stall");
    }
  }
}
