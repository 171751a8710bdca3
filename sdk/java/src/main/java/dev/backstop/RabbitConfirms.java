package dev.backstop;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.ShutdownSignalException;
import java.io.IOException;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentSkipListMap;

/**
 * Publishes on a channel in confirm mode, each publish mandatory, and tells
 * each its fate: confirmed, returned (no route: the return comes before the
 * confirm) or refused (a nack). A return names no publish, so it is matched
 * by message id, exchange and routing key: one publish of a key at a time
 * (queue/rabbitmq/README.md, issue 40). The channel's close before a confirm
 * fails the future: the outcome is unknown (applied again on redelivery). A
 * confirm is never timed out into "not published".
 */
final class RabbitConfirms {
  enum Result { CONFIRMED, RETURNED, REFUSED }

  /** Thrown for a publish the broker returned (no route) or refused (a nack). */
  static final class Rejected extends IOException {
    private static final long serialVersionUID = 1L;
    final boolean returned;

    Rejected(boolean returned, String what) {
      super(returned ? "rabbitmq: no route for " + what + " (returned)" : "rabbitmq: the broker rejected the message");
      this.returned = returned;
    }
  }

  private static final class Pending {
    final String key;
    final CompletableFuture<Result> done = new CompletableFuture<>();
    volatile boolean returned;

    Pending(String key) {
      this.key = key;
    }
  }

  final Channel ch;
  private final ConcurrentSkipListMap<Long, Pending> pending = new ConcurrentSkipListMap<>();
  private final Map<String, Pending> byKey = new HashMap<>();
  private final Set<String> inFlight = new HashSet<>();
  /** Held across getNextPublishSeqNo and basicPublish, never with this object's lock held. */
  private final Object publishing = new Object();
  private volatile ShutdownSignalException closed;

  RabbitConfirms(Channel ch) throws IOException {
    this.ch = ch;
    ch.confirmSelect();
    ch.addConfirmListener((tag, multiple) -> settle(tag, multiple, false), (tag, multiple) -> settle(tag, multiple, true));
    ch.addReturnListener(r -> {
      String key = key(r.getProperties().getMessageId(), r.getExchange(), r.getRoutingKey());
      synchronized (this) {
        Pending p = byKey.get(key);
        if (p != null) p.returned = true;
      }
    });
    ch.addShutdownListener(cause -> {
      closed = cause;
      for (Pending p : pending.values()) p.done.completeExceptionally(cause);
      pending.clear();
      synchronized (this) {
        notifyAll();
      }
    });
  }

  private static String key(String id, String exchange, String routingKey) {
    return (id == null ? "" : id) + "\u0000" + exchange + "\u0000" + routingKey;
  }

  private void settle(long tag, boolean multiple, boolean nack) {
    Map<Long, Pending> done = multiple ? pending.headMap(tag, true) : null;
    if (done != null) {
      for (Pending p : done.values()) finish(p, nack);
      done.clear();
    } else {
      Pending p = pending.remove(tag);
      if (p != null) finish(p, nack);
    }
  }

  private void finish(Pending p, boolean nack) {
    synchronized (this) {
      byKey.remove(p.key);
      inFlight.remove(p.key);
      notifyAll();
    }
    p.done.complete(nack ? Result.REFUSED : p.returned ? Result.RETURNED : Result.CONFIRMED);
  }

  /** Publishes (mandatory, persistent); the future completes with the broker's answer. */
  CompletableFuture<Result> publish(String exchange, String routingKey, AMQP.BasicProperties props, byte[] body)
      throws IOException, InterruptedException {
    String key = key(props.getMessageId(), exchange, routingKey);
    Pending p = new Pending(key);
    synchronized (this) {
      while (inFlight.contains(key)) {
        if (closed != null) throw closed;
        wait(100);
      }
      if (closed != null) throw closed;
      inFlight.add(key);
      byKey.put(key, p);
    }
    // basicPublish may block (a broker memory or disk alarm stops reading the
    // socket): it runs outside this object's lock, which the connection
    // thread's confirm and return callbacks take, so frames are still read.
    // The publish lock keeps the sequence number the channel gives the
    // publish the one it is registered under.
    synchronized (publishing) {
      long seq = ch.getNextPublishSeqNo();
      pending.put(seq, p);
      try {
        ch.basicPublish(exchange, routingKey, true, props, body);
      } catch (IOException | RuntimeException e) {
        pending.remove(seq);
        synchronized (this) {
          byKey.remove(key);
          inFlight.remove(key);
          notifyAll();
        }
        throw e;
      }
    }
    // Closed while publishing, after the shutdown listener failed the pending
    // ones: the outcome is unknown (a no-op when already confirmed).
    ShutdownSignalException c = closed;
    if (c != null) p.done.completeExceptionally(c);
    return p.done;
  }

  /** Publishes and waits for the confirm (no timeout of its own): throws Rejected when returned or refused. */
  void publishAndWait(String exchange, String routingKey, AMQP.BasicProperties props, byte[] body)
      throws IOException, InterruptedException {
    Result r = await(publish(exchange, routingKey, props, body));
    if (r != Result.CONFIRMED) throw new Rejected(r == Result.RETURNED, "queue \"" + routingKey + "\"");
  }

  static Result await(CompletableFuture<Result> f) throws IOException, InterruptedException {
    try {
      return f.get();
    } catch (java.util.concurrent.ExecutionException e) {
      Throwable c = e.getCause();
      if (c instanceof ShutdownSignalException) throw (ShutdownSignalException) c;
      throw new IOException(c);
    }
  }

  /** Publishes this no longer waiting for their confirms. */
  int waiting() {
    return pending.size();
  }
}
