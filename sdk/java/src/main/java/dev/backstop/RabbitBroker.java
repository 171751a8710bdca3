package dev.backstop;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import java.io.IOException;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.TimeoutException;
import java.util.logging.Level;

/**
 * A connection to one RabbitMQ virtual host, for backstop's queues
 * (queue/rabbitmq/README.md): the topology, the headers and the moves of the
 * Go, Node and Python workers, over the official client
 * (com.rabbitmq:amqp-client, an optional dependency: add it to use this
 * class).
 *
 * <pre>{@code
 * try (RabbitBroker broker = RabbitBroker.connect("amqp://guest:guest@127.0.0.1:5672/")) {
 *   RabbitQueue emails = broker.queue("emails", 5);
 *   emails.enqueue("order-42", "{\"to\":\"a@example.com\"}".getBytes(UTF_8), "send_email");
 *   try (RabbitWorker w = emails.work(policy, job -> send(job), WorkOptions.defaults())) {
 *     ... // until close(): the jobs in hand finish and are applied first
 *   }
 * }
 * }</pre>
 *
 * <p>Each worker opens a connection of its own (and again, with backoff, when
 * it is lost); the other methods share this one, opened again on their next
 * call. Safe to use from several threads.
 */
public final class RabbitBroker implements AutoCloseable {
  final ConnectionFactory factory;
  private Connection conn;
  private final Set<String> declared = new HashSet<>(); // declared on conn ("" = the shared levels)
  private volatile boolean closed;

  private RabbitBroker(ConnectionFactory f) {
    this.factory = f;
  }

  /**
   * Connects to the broker at url ({@code amqp://user:pass@host:port/vhost}).
   *
   * @throws IOException when the first connection fails
   * @throws IllegalArgumentException for a URL that is not amqp:// (the URL is not repeated: it may hold a password)
   */
  public static RabbitBroker connect(String url) throws IOException {
    if (url == null || url.isEmpty()) throw new IllegalArgumentException("connect: url must be a non-empty amqp:// URL");
    ConnectionFactory f = new ConnectionFactory();
    try {
      f.setUri(url);
      // amqp://host/ is the default virtual host "/" in the Go, Node and
      // Python clients (the Java client reads it as "").
      String path = new java.net.URI(url).getRawPath();
      if (path == null || path.isEmpty() || path.equals("/")) f.setVirtualHost("/");
    } catch (Exception e) {
      throw new IllegalArgumentException("connect: url must be an amqp:// or amqps:// URL");
    }
    return open(f);
  }

  /**
   * Connects with a copy of factory's settings (host, port, credentials,
   * virtual host, TLS: a Spring application's, from its
   * CachingConnectionFactory), without its automatic recovery.
   *
   * @throws IOException when the first connection fails
   */
  public static RabbitBroker connect(ConnectionFactory factory) throws IOException {
    return open(factory.clone());
  }

  private static RabbitBroker open(ConnectionFactory f) throws IOException {
    f.setAutomaticRecoveryEnabled(false); // the workers reconnect themselves, and keep their outcomes
    f.setRequestedHeartbeat(30);
    RabbitBroker b = new RabbitBroker(f);
    synchronized (b) {
      b.connection();
    }
    return b;
  }

  /** Work queue name, its crash-loop limit maxDeliveries (1..1000; the queue's x-delivery-limit is that + 2). */
  public RabbitQueue queue(String name, int maxDeliveries) {
    if (name == null || name.isEmpty()) throw new IllegalArgumentException("queue: name must be a non-empty string");
    if (maxDeliveries < 1 || maxDeliveries > 1000) {
      throw new IllegalArgumentException("queue: maxDeliveries must be in 1..1000 (got " + maxDeliveries + ")");
    }
    return new RabbitQueue(this, name, maxDeliveries, false);
  }

  /**
   * Work queue name as someone else declared it (a Spring application's
   * queue: quorum or classic, with its own dead-letter exchange): backstop
   * checks that it exists and never declares it again (so no
   * PRECONDITION_FAILED over its arguments); it declares the DLQ
   * {@code name.dlq} only when missing, and its delay exchanges. The broker's
   * own x-delivery-limit is the queue's (or none): the worker's crash-loop
   * limit maxDeliveries still applies on a quorum queue (x-delivery-count).
   */
  public RabbitQueue existingQueue(String name, int maxDeliveries) {
    RabbitQueue q = queue(name, maxDeliveries);
    return new RabbitQueue(this, q.name, q.maxDeliveries, true);
  }

  /** queue(name, 5). */
  public RabbitQueue queue(String name) {
    return queue(name, 5);
  }

  boolean isClosed() {
    return closed;
  }

  Connection newConnection(String name) throws IOException {
    try {
      Connection c = factory.newConnection(name);
      c.addBlockedListener(reason -> QueueRunner.LOG.warning("rabbitmq connection blocked: " + reason),
          () -> QueueRunner.LOG.warning("rabbitmq connection unblocked"));
      return c;
    } catch (TimeoutException e) {
      throw new IOException("rabbitmq: connect timed out", e);
    }
  }

  private Connection connection() throws IOException {
    if (closed) throw new IllegalStateException("rabbitmq: the broker connection is closed");
    if (conn == null || !conn.isOpen()) {
      conn = newConnection("backstop");
      declared.clear();
    }
    return conn;
  }

  interface Op<T> {
    T run(RabbitConfirms c) throws IOException, InterruptedException;
  }

  /** fn on a new confirm channel of the shared connection, queue q (and the levels) declared once. */
  synchronized <T> T op(RabbitQueue queue, Op<T> fn) throws IOException, InterruptedException {
    String q = queue == null ? null : queue.name;
    Channel ch;
    try {
      ch = connection().createChannel();
    } catch (IOException | com.rabbitmq.client.AlreadyClosedException e) {
      conn = null; // lost (a broker restart): opened again, once
      ch = connection().createChannel();
    }
    try {
      if (!declared.contains("")) {
        Rabbit.declareShared(ch);
        declared.add("");
      }
      if (q != null && !declared.contains(q)) {
        queue.declareOn(ch);
        declared.add(q);
      }
      return fn.run(new RabbitConfirms(ch));
    } finally {
      if (ch.isOpen()) {
        try {
          ch.close();
        } catch (IOException | TimeoutException | com.rabbitmq.client.AlreadyClosedException e) {
          // closed meanwhile
        }
      }
    }
  }

  /** Forgets queue q's declaration (it was deleted): declared again on next use. */
  synchronized void forget(String q) {
    declared.remove(q);
  }

  /** Closes the shared connection; running workers stop (close them first to finish their jobs). */
  @Override
  public synchronized void close() {
    closed = true;
    if (conn != null && conn.isOpen()) {
      try {
        conn.close();
      } catch (IOException | com.rabbitmq.client.AlreadyClosedException e) {
        QueueRunner.LOG.log(Level.FINE, "rabbitmq: close", e);
      }
    }
  }

  /**
   * The properties of a publish: the source delivery's that a message takes
   * to its next place (all a publisher may set but expiration and user_id),
   * persistent, its headers fitted within the bounds, and messageId when set.
   */
  static AMQP.BasicProperties props(AMQP.BasicProperties src, Map<String, Object> headers, String messageId,
      String contentType) {
    AMQP.BasicProperties.Builder b = new AMQP.BasicProperties.Builder().deliveryMode(2)
        .headers(Rabbit.fit(headers));
    if (src != null) {
      b.messageId(nonEmpty(src.getMessageId())).contentType(nonEmpty(src.getContentType()))
          .contentEncoding(nonEmpty(src.getContentEncoding())).correlationId(nonEmpty(src.getCorrelationId()))
          .type(nonEmpty(src.getType())).appId(nonEmpty(src.getAppId())).timestamp(src.getTimestamp())
          .replyTo(nonEmpty(src.getReplyTo()));
      if (src.getPriority() != null && src.getPriority() != 0) b.priority(src.getPriority());
    }
    if (contentType != null && !contentType.isEmpty()) b.contentType(contentType);
    if (messageId != null && !messageId.isEmpty()) b.messageId(messageId);
    return b.build();
  }

  private static String nonEmpty(String s) {
    return s == null || s.isEmpty() ? null : s;
  }
}
