package dev.backstop;

import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.security.MessageDigest;

/**
 * A Java worker in the RabbitMQ crash test's fleet
 * (queue/rabbitmq/reliability, TestCrashLosesNothingWithJavaWorkers): the
 * role "crash" of that package's workerRole, in Java, so that Go and Java
 * workers share one queue and one ledger and the test SIGKILLs either.
 * Configured by the same environment (BACKSTOP_RELIABILITY_URL, _QUEUE,
 * _LEDGER, _MAX_DELIVERIES, _PREFETCH, _CONCURRENCY). Each execution is
 * also counted, one byte, in LEDGER.java; LEDGER.ready gets a byte once the
 * worker consumes.
 */
public final class RabbitCrashWorker {
  private RabbitCrashWorker() {}

  static final String POLICY = "{\"max_attempts\": 3, \"backoff\": {\"strategy\": \"constant\", \"base\": \"1s\"},"
      + " \"jitter\": {\"mode\": \"none\"}}";

  /** The job's fate, as Go's expected: {final attempt, 0 succeed / 1 permanent / 2 max attempts}. */
  static long[] expected(String id) throws Exception {
    byte[] sum = MessageDigest.getInstance("SHA-256").digest(("fate/" + id).getBytes(StandardCharsets.UTF_8));
    long v = (ByteBuffer.wrap(sum, 0, 4).getInt() & 0xffffffffL) % 100;
    if (v < 10) return new long[] {1, 1};
    if (v < 15) return new long[] {3, 2};
    if (v < 40) return new long[] {2, 0};
    return new long[] {1, 0};
  }

  static String env(String k) {
    return System.getenv("BACKSTOP_RELIABILITY_" + k);
  }

  static void append(FileChannel f, byte[] b) throws Exception {
    f.write(ByteBuffer.wrap(b)); // O_APPEND, under PIPE_BUF: lines from many processes never interleave
  }

  public static void main(String[] args) throws Exception {
    String ledgerPath = env("LEDGER");
    FileChannel ledger = FileChannel.open(Path.of(ledgerPath), StandardOpenOption.CREATE, StandardOpenOption.WRITE,
        StandardOpenOption.APPEND);
    FileChannel mine = FileChannel.open(Path.of(ledgerPath + ".java"), StandardOpenOption.CREATE, StandardOpenOption.WRITE,
        StandardOpenOption.APPEND);
    String url = env("URL").trim().split("\\s+")[0];
    RabbitBroker b = RabbitBroker.connect(url);
    RabbitQueue q = b.queue(env("QUEUE"), Integer.parseInt(env("MAX_DELIVERIES")));
    Policy policy = Policy.load(POLICY);
    QueueHandler<RabbitJob> handler = job -> {
      long[] fate = expected(job.id());
      Exception err = null;
      if (fate[1] == 1) err = new HttpStatusException(400);
      else if (job.attempt() < fate[0] || fate[1] != 0) err = new HttpStatusException(503);
      // Recorded before the outcome is applied: a kill in between is what makes a duplicate execution.
      String line = String.format("%-6s %d %c\n", job.id(), job.attempt() % 10, err == null ? 'S' : 'F');
      append(ledger, line.getBytes(StandardCharsets.US_ASCII));
      append(mine, new byte[] {'.'});
      if (err != null) throw err;
    };
    RabbitWorker w = q.work(policy, handler, WorkOptions.defaults().withPrefetch(Integer.parseInt(env("PREFETCH")))
        .withConcurrency(Integer.parseInt(env("CONCURRENCY"))));
    try (FileChannel ready = FileChannel.open(Path.of(ledgerPath + ".ready"), StandardOpenOption.CREATE,
        StandardOpenOption.WRITE, StandardOpenOption.APPEND)) {
      append(ready, new byte[] {'.'});
    }
    Runtime.getRuntime().addShutdownHook(new Thread(() -> { // SIGTERM: in-flight jobs finish
      try {
        w.close();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      b.close();
    }));
    Thread.currentThread().join();
  }
}
