package dev.backstop;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.sync.RedisCommands;
import io.lettuce.core.codec.ByteArrayCodec;
import io.lettuce.core.output.NestedMultiOutput;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.CommandType;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;

/**
 * One Redis Streams queue of backstop's contract (queue/redisqueue/README.md)
 * over Lettuce (io.lettuce:lettuce-core, an optional dependency): every move
 * is one of the contract's Lua scripts (contract/scripts, run with EVALSHA,
 * EVAL on NOSCRIPT), the same bytes as the Go, Node and Python workers; the
 * policy decides locally (backstop.wasm), only the move talks to Redis.
 *
 * <pre>{@code
 * RedisClient client = RedisClient.create("redis://127.0.0.1:6379");
 * RedisQueue emails = RedisQueue.create(client, "emails");   // {emails}:jobs, :delayed, :dlq, :stats
 * emails.enqueue("order-42", payload, "send_email");
 * try (RedisWorker w = emails.work(policy, job -> send(job), WorkOptions.defaults())) { ... }
 * }</pre>
 */
public final class RedisQueue implements AutoCloseable {
  /** The keys of one queue: {name}:jobs, :delayed, :dlq, :stats by default (one hash tag: Redis Cluster). */
  public record Keys(String jobs, String delayed, String dlq, String stats) {
    public static Keys of(String name) {
      String tag = "{" + name + "}";
      return new Keys(tag + ":jobs", tag + ":delayed", tag + ":dlq", tag + ":stats");
    }
  }

  /** What promote did: jobs moved, and ms until the next is due (-1: the delayed set is empty). */
  public record Promoted(long moved, long nextDueMs) {}

  /** What a forced run did: delayed jobs moved, and those still due before the bound beyond the limit. */
  public record Ran(long moved, long left) {}

  /** What reclaim did: crash loops dead-lettered, entries claimed, and those the DLQ refused (entry id, why). */
  public record Reclaimed(long deadLettered, List<RedisJob> jobs, List<String[]> skipped) {}

  /** What applying an outcome did: applied false when the entry was no longer pending. */
  public record Applied(String action, String reason, boolean applied, long dueMs, String dlqId) {}

  final RedisClient client;
  final String name;
  final Keys keys;
  final String group;
  private final StatefulRedisConnection<byte[], byte[]> conn;
  private final RedisCommands<byte[], byte[]> cmds;

  private RedisQueue(RedisClient client, String name, Keys keys, String group) {
    this.client = client;
    this.name = name;
    this.keys = keys;
    this.group = group;
    this.conn = client.connect(ByteArrayCodec.INSTANCE);
    this.cmds = conn.sync();
  }

  /** Queue name on client, with the default keys and the consumer group "workers". */
  public static RedisQueue create(RedisClient client, String name) {
    return create(client, name, Keys.of(Objects.requireNonNull(name, "name")), "workers");
  }

  /** Queue name with keys of your own (an existing layout) and a consumer group. */
  public static RedisQueue create(RedisClient client, String name, Keys keys, String group) {
    Objects.requireNonNull(client, "client");
    if (name == null || name.isEmpty()) throw new IllegalArgumentException("queue: name must be a non-empty string");
    if (group == null || group.isEmpty()) throw new IllegalArgumentException("queue: group must be a non-empty string");
    return new RedisQueue(client, name, Objects.requireNonNull(keys, "keys"), group);
  }

  public String name() {
    return name;
  }

  public Keys keys() {
    return keys;
  }

  /** A command on the queue's connection: its reply as nested lists of byte[] and Long. */
  Object call(CommandType type, List<byte[]> args) {
    return call(cmds, type, args);
  }

  private static Object call(RedisCommands<byte[], byte[]> cmds, CommandType type, List<byte[]> args) {
    CommandArgs<byte[], byte[]> a = new CommandArgs<>(ByteArrayCodec.INSTANCE);
    for (byte[] x : args) a.add(x);
    List<Object> out = cmds.dispatch(type, new NestedMultiOutput<>(ByteArrayCodec.INSTANCE), a);
    return out;
  }

  /** Runs script name with EVALSHA, and EVAL (which caches it) on NOSCRIPT; the reply's list. */
  List<Object> script(String name, List<String> keys, List<Object> argv) {
    return script(cmds, name, keys, argv);
  }

  /** Runs script name on cmds (EVALSHA, EVAL on NOSCRIPT); the reply: nested lists of byte[] and Long. */
  @SuppressWarnings("unchecked")
  static List<Object> script(RedisCommands<byte[], byte[]> cmds, String name, List<String> keys, List<Object> argv) {
    Redis.Script s = Redis.script(name);
    List<byte[]> tail = new ArrayList<>();
    tail.add(Redis.bytes(Integer.toString(keys.size())));
    for (String k : keys) tail.add(Redis.bytes(k));
    for (Object v : argv) tail.add(v instanceof byte[] ? (byte[]) v : Redis.bytes(String.valueOf(v)));
    List<byte[]> args = new ArrayList<>();
    args.add(Redis.bytes(s.sha()));
    args.addAll(tail);
    try {
      return (List<Object>) call(cmds, CommandType.EVALSHA, args);
    } catch (RedisCommandExecutionException e) {
      if (e.getMessage() == null || !e.getMessage().startsWith("NOSCRIPT")) throw e;
      args.set(0, Redis.bytes(s.source()));
      return (List<Object>) call(cmds, CommandType.EVAL, args);
    }
  }

  private static long num(Object v) {
    if (v instanceof Long) return (Long) v;
    if (v instanceof byte[]) return Long.parseLong(Redis.text((byte[]) v));
    return 0;
  }

  /** The server's clock (TIME) in unix ms: the clock the scripts stamp times with. */
  public long serverTimeMs() {
    List<byte[]> t = cmds.time();
    return Long.parseLong(Redis.text(t.get(0))) * 1000 + Long.parseLong(Redis.text(t.get(1))) / 1000;
  }

  /** Creates the jobs stream and the consumer group when missing; true when it created the group. */
  public boolean ensureGroup() {
    try {
      call(CommandType.XGROUP, List.of(Redis.bytes("CREATE"), Redis.bytes(keys.jobs), Redis.bytes(group),
          Redis.bytes("0"), Redis.bytes("MKSTREAM")));
      return true;
    } catch (RedisCommandExecutionException e) {
      if (e.getMessage() != null && e.getMessage().contains("BUSYGROUP")) return false;
      // Redis refuses XGROUP CREATE before it looks for the group when it
      // refuses writes (out of memory, a read-only replica): a group that
      // exists is all a worker needs (as the Go and Node.js queues).
      if (groupExists()) return false;
      throw e;
    }
  }

  private boolean groupExists() {
    try {
      for (Object g : (List<?>) call(CommandType.XINFO, List.of(Redis.bytes("GROUPS"), Redis.bytes(keys.jobs)))) {
        List<?> f = (List<?>) g;
        for (int i = 0; i + 1 < f.size(); i += 2) {
          if ("name".equals(Redis.text((byte[]) f.get(i))) && f.get(i + 1) instanceof byte[]
              && group.equals(Redis.text((byte[]) f.get(i + 1)))) {
            return true;
          }
        }
      }
    } catch (RuntimeException e) {
      return false; // no stream, or Redis failing: the create's error says more
    }
    return false;
  }

  /** Enqueues job jobId (its attempt 1); jobType may be null. Returns the entry id. */
  public String enqueue(String jobId, byte[] payload, String jobType) {
    if (jobId == null || jobId.isEmpty()) throw new IllegalArgumentException("enqueue: job_id must be a non-empty string");
    Objects.requireNonNull(payload, "payload");
    if (jobType != null && !jobType.isEmpty() && !QueueMetrics.JOB_TYPE.matcher(jobType).matches()) {
      throw new IllegalArgumentException("enqueue: job_type must be 1..64 of [A-Za-z0-9_./-] (got " + jobType + ")");
    }
    List<Object> argv = new ArrayList<>(List.of(jobId, payload));
    if (jobType != null && !jobType.isEmpty()) argv.add(jobType);
    return Redis.text((byte[]) script("enqueue", List.of(keys.jobs, keys.stats), argv).get(0));
  }

  /** Acks a job (success); false when the entry was not pending. */
  public boolean ack(String entryId) {
    return num(script("ack", List.of(keys.jobs, keys.stats), List.of(group, Redis.entry("ack", entryId))).get(0)) == 1;
  }

  private long later(String op, String entryId, long delayMs, String reason, String lastError) {
    if (delayMs < 0) throw new IllegalArgumentException(op + ": delay_ms must be >= 0 (got " + delayMs + ")");
    if (reason == null || reason.isEmpty()) throw new IllegalArgumentException(op + ": reason must be a non-empty string");
    return num(script(op, List.of(keys.jobs, keys.delayed, keys.stats), List.of(group, Redis.entry(op, entryId),
        delayMs, reason, lastError == null ? "" : lastError)).get(0));
  }

  /** Retries a job after delayMs (attempt + 1): its due time (unix ms), 0 when the entry was not pending. */
  public long retry(String entryId, long delayMs, String reason, String lastError) {
    return later("retry", entryId, delayMs, reason, lastError);
  }

  /** Defers a job the breaker or budget refused (attempt unchanged): its due time, 0 when not pending. */
  public long defer(String entryId, long delayMs, String reason, String lastError) {
    return later("defer", entryId, delayMs, reason, lastError);
  }

  /** Dead-letters a job: its DLQ entry id, null when the entry was not pending. */
  public String deadLetter(String entryId, String reason, String lastError) {
    if (reason == null || reason.isEmpty()) throw new IllegalArgumentException("dead_letter: reason must be a non-empty string");
    Object v = script("dead_letter", List.of(keys.jobs, keys.dlq, keys.stats), List.of(group,
        Redis.entry("dead_letter", entryId), reason, lastError == null ? "" : lastError)).get(0);
    return v instanceof byte[] ? Redis.text((byte[]) v) : null;
  }

  /** Moves up to limit (1..10000) due jobs from the delayed set to the stream. */
  public Promoted promote(int limit) {
    if (limit < 1 || limit > 10000) throw new IllegalArgumentException("promote: limit must be a whole number in 1..10000 (got " + limit + ")");
    List<Object> v = script("promote", List.of(keys.delayed, keys.jobs, keys.stats), List.of(limit));
    long next = num(v.get(1));
    return new Promoted(num(v.get(0)), next < 0 ? -1 : next);
  }

  /** Runs the delayed job jobId now (the moved count: 0 when it is not delayed). */
  public Ran run(String jobId) {
    if (jobId == null || jobId.isEmpty()) throw new IllegalArgumentException("run: job_id must be a non-empty string");
    long moved = 0;
    String cursor = "0";
    while (true) {
      List<Object> v = script("run", List.of(keys.delayed, keys.jobs, keys.stats), List.of("id", jobId, cursor));
      moved += num(v.get(0));
      cursor = Redis.text((byte[]) v.get(1));
      if (cursor.equals("0")) return new Ran(moved, 0);
    }
  }

  /** Runs now up to limit delayed jobs due before dueBeforeMs (unix ms). */
  public Ran runDueBefore(long dueBeforeMs, int limit) {
    if (dueBeforeMs < 0) throw new IllegalArgumentException("run: due_before must be >= 0");
    if (limit < 1 || limit > 10000) throw new IllegalArgumentException("run: limit must be a whole number in 1..10000 (got " + limit + ")");
    List<Object> v = script("run", List.of(keys.delayed, keys.jobs, keys.stats), List.of("before", dueBeforeMs, limit));
    return new Ran(num(v.get(0)), num(v.get(1)));
  }

  /** Claims entries idle at least minIdleMs for consumer; those delivered maxDeliveries times are dead-lettered crash_loop. */
  public Reclaimed reclaim(String consumer, long minIdleMs, int count, long maxDeliveries) {
    if (consumer == null || consumer.isEmpty()) throw new IllegalArgumentException("reclaim: consumer must be a non-empty string");
    if (minIdleMs < 0) throw new IllegalArgumentException("reclaim: min_idle_ms must be >= 0");
    if (count < 1 || count > 1000) throw new IllegalArgumentException("reclaim: count must be in 1..1000 (got " + count + ")");
    if (maxDeliveries < 1) throw new IllegalArgumentException("reclaim: max_deliveries must be >= 1");
    List<Object> v = script("reclaim", List.of(keys.jobs, keys.dlq, keys.stats),
        List.of(group, consumer, minIdleMs, count, maxDeliveries));
    List<String[]> skipped = new ArrayList<>();
    if (v.get(2) instanceof List) {
      for (Object s : (List<?>) v.get(2)) {
        if (s instanceof List && ((List<?>) s).size() == 2) {
          skipped.add(new String[] {Redis.text((byte[]) ((List<?>) s).get(0)), Redis.text((byte[]) ((List<?>) s).get(1))});
        }
      }
    }
    return new Reclaimed(num(v.get(0)), Redis.jobs(v.get(1) instanceof List ? (List<?>) v.get(1) : null), skipped);
  }

  /** Resets the idle time of entries consumer holds (a running job): true for each held. */
  public List<Boolean> hold(String consumer, List<String> entries) {
    if (consumer == null || consumer.isEmpty()) throw new IllegalArgumentException("hold: consumer must be a non-empty string");
    if (entries.size() > 1000) throw new IllegalArgumentException("hold: entries must be at most 1000 entry ids");
    List<Object> argv = new ArrayList<>(List.of(group, consumer));
    for (String e : entries) argv.add(Redis.entry("hold", e));
    if (entries.isEmpty()) return List.of();
    List<Boolean> out = new ArrayList<>();
    for (Object x : script("hold", List.of(keys.jobs), argv)) out.add(num(x) == 1);
    return out;
  }

  /** Moves up to limit dead letters (of reason and jobType, or any when null) back to the stream. */
  public long replay(long limit, String reason, String jobType) {
    if (limit < 1) throw new IllegalArgumentException("replay: limit must be a whole number >= 1 (got " + limit + ")");
    if (jobType != null && !QueueMetrics.JOB_TYPE.matcher(jobType).matches()) {
      throw new IllegalArgumentException("replay: job_type must be 1..64 of [A-Za-z0-9_./-] (got " + jobType + ")");
    }
    long moved = 0;
    String cursor = "-";
    while (moved < limit) {
      long n = Math.min(limit - moved, 1000);
      List<Object> v = script("replay", List.of(keys.dlq, keys.jobs, keys.stats),
          List.of(n, reason == null ? "" : reason, cursor, n * 10, jobType == null ? "" : jobType));
      moved += num(v.get(0));
      cursor = Redis.text((byte[]) v.get(1));
      if (cursor.equals("0")) break;
    }
    return moved;
  }

  /** Reads up to count new entries for consumer, blocking up to blockMs (0: not at all). */
  @SuppressWarnings("unchecked")
  List<RedisJob> read(RedisCommands<byte[], byte[]> on, String consumer, int count, long blockMs) {
    CommandArgs<byte[], byte[]> a = new CommandArgs<>(ByteArrayCodec.INSTANCE);
    a.add("GROUP").add(group).add(consumer).add("COUNT").add(count);
    if (blockMs > 0) a.add("BLOCK").add(blockMs);
    a.add("STREAMS").add(keys.jobs).add(">");
    List<Object> r = on.dispatch(CommandType.XREADGROUP, new NestedMultiOutput<>(ByteArrayCodec.INSTANCE), a);
    List<RedisJob> out = new ArrayList<>();
    if (r == null) return out;
    for (int i = 0; i < r.size(); i++) {
      Object s = r.get(i);
      if (s instanceof List && ((List<?>) s).size() == 2 && ((List<?>) s).get(1) instanceof List) {
        out.addAll(Redis.jobs((List<?>) ((List<?>) s).get(1))); // RESP2: [[stream, entries]]
      } else if (s instanceof byte[] && i + 1 < r.size() && r.get(i + 1) instanceof List) {
        out.addAll(Redis.jobs((List<?>) r.get(++i))); // RESP3: {stream: entries}
      }
    }
    return out;
  }

  /** Applies a plan to job's entry through the scripts (one attempt). */
  Applied apply(RedisJob job, QueuePlan plan) {
    String reason = plan.reason().toString();
    switch (plan.action()) {
      case ACK:
        return new Applied("ack", reason, ack(job.entryId()), 0, null);
      case RETRY: {
        long due = retry(job.entryId(), plan.delayMs(), reason, plan.error());
        return new Applied("retry", reason, due != 0, due, null);
      }
      case DEFER: {
        long due = defer(job.entryId(), plan.delayMs(), reason, plan.error());
        return new Applied("defer", reason, due != 0, due, null);
      }
      default: {
        String id = deadLetter(job.entryId(), reason, plan.error());
        return new Applied("dead_letter", reason, id != null, 0, id);
      }
    }
  }

  /** Starts a worker of this queue (see {@link RedisWorker}). */
  public RedisWorker work(Policy policy, QueueHandler<RedisJob> handler, WorkOptions options) {
    return new RedisWorker(this, Objects.requireNonNull(policy, "policy"), Objects.requireNonNull(handler, "handler"),
        Objects.requireNonNull(options, "options"));
  }

  /** Closes the queue's connection (not the client). */
  @Override
  public void close() {
    conn.close();
  }
}
