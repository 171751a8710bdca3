package dev.backstop;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.AlreadyClosedException;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.Delivery;
import com.rabbitmq.client.ShutdownSignalException;
import java.io.IOException;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.logging.Level;

/**
 * The moves between delay levels (queue/rabbitmq/README.md, "The moves
 * between levels are the workers'"): on a connection of its own it consumes
 * backstop.hold.L0..L10 (prefetch 1000 per level), holds each delivery until
 * its time, publishes it unchanged to its next exchange on one of 4 confirm
 * channels ("lanes", each one move at a time), waits for the confirm and
 * only then acks it. A move returned (no route) is dead-lettered
 * {@code unroutable}; one refused enters the delay again for 10 s
 * ({@link Rabbit#afterMove}). A lost connection returns what it held; the
 * mover connects again with backoff until stopped.
 */
final class RabbitMover {
  private static final int LANES = 4;

  private final RabbitBroker broker;
  private final CountDownLatch stop = new CountDownLatch(1);
  private final Thread thread;

  RabbitMover(RabbitBroker broker) {
    this.broker = broker;
    thread = new Thread(this::loop, "backstop-delay-mover");
    thread.setDaemon(true);
    thread.start();
  }

  void stop() {
    stop.countDown();
    try {
      thread.join(30_000);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  private boolean stopping() {
    return stop.getCount() == 0 || broker.isClosed();
  }

  private void loop() {
    long backoff = 100;
    while (!stopping()) {
      try {
        session();
        backoff = 100;
      } catch (IOException | ShutdownSignalException e) {
        QueueRunner.LOG.warning("delay mover: connection lost, connecting again: " + e.getMessage());
      } catch (InterruptedException e) {
        return;
      } catch (RuntimeException e) {
        QueueRunner.LOG.log(Level.WARNING, "delay mover: session failed", e);
      }
      try {
        if (stop.await((long) (backoff * (0.5 + Math.random() / 2)), TimeUnit.MILLISECONDS)) return;
      } catch (InterruptedException e) {
        return;
      }
      backoff = Math.min(2 * backoff, 5000);
    }
  }

  private void session() throws IOException, InterruptedException {
    Connection conn = broker.newConnection("backstop-mover");
    ScheduledExecutorService timers = Executors.newSingleThreadScheduledExecutor(r -> {
      Thread t = new Thread(r, "backstop-delay-mover-timer");
      t.setDaemon(true);
      return t;
    });
    List<ExecutorService> laneThreads = new ArrayList<>();
    CountDownLatch lost = new CountDownLatch(1);
    try {
      Channel ch = conn.createChannel();
      ch.addShutdownListener(s -> lost.countDown());
      Rabbit.declareShared(ch);
      List<RabbitConfirms> lanes = new ArrayList<>();
      for (int i = 0; i < LANES; i++) {
        Channel lc = conn.createChannel();
        lc.addShutdownListener(s -> lost.countDown());
        lanes.add(new RabbitConfirms(lc));
        laneThreads.add(Executors.newSingleThreadExecutor(r -> {
          Thread t = new Thread(r, "backstop-delay-mover-lane");
          t.setDaemon(true);
          return t;
        }));
      }
      AtomicInteger next = new AtomicInteger();
      ch.basicQos(Rabbit.MOVE_PREFETCH, false);
      for (int n = 0; n < Rabbit.HOLD_LEVELS; n++) {
        int level = n;
        ch.basicConsume(Rabbit.hold(n), false, (tag, d) -> {
          String key = d.getEnvelope().getRoutingKey();
          Map<String, Object> h = d.getProperties().getHeaders();
          long at = Rabbit.releaseMs(level, key, h, System.currentTimeMillis());
          int lane = Math.floorMod(next.getAndIncrement(), LANES);
          Runnable move = new Runnable() {
            @Override
            public void run() {
              laneThreads.get(lane).execute(() -> {
                if (!move(ch, lanes.get(lane), level, d) && !stopping()) {
                  timers.schedule(this, Rabbit.MOVE_RETRY_MS, TimeUnit.MILLISECONDS);
                }
              });
            }
          };
          timers.schedule(move, Math.max(0, at - System.currentTimeMillis()), TimeUnit.MILLISECONDS);
        }, tag -> lost.countDown());
      }
      while (!stopping() && lost.getCount() > 0) stop.await(100, TimeUnit.MILLISECONDS);
    } finally {
      timers.shutdownNow();
      for (ExecutorService e : laneThreads) e.shutdownNow();
      if (conn.isOpen()) {
        try {
          conn.close(1000); // the held deliveries go back to their levels
        } catch (IOException | AlreadyClosedException e) {
          QueueRunner.LOG.log(Level.FINE, "close", e);
        }
      }
    }
  }

  // The move of one delivery; one returned is dead-lettered (unroutable),
  // one refused enters the delay again: neither keeps a place in the
  // prefetch. False: held, its move tried again after MOVE_RETRY_MS (a
  // re-entry or dead letter refused: a cluster electing a leader).
  private boolean move(Channel hold, RabbitConfirms lane, int n, Delivery d) {
    String key = d.getEnvelope().getRoutingKey();
    AMQP.BasicProperties props = d.getProperties();
    Map<String, Object> h = props.getHeaders();
    Deque<Rabbit.Publish> pubs = new ArrayDeque<>(List.of(Rabbit.moved(n, key, h)));
    try {
      while (!pubs.isEmpty()) {
        if (!hold.isOpen()) return true; // the delivery went back with the channel
        Rabbit.Publish p = pubs.pollFirst();
        RabbitConfirms.Result r = RabbitConfirms.await(lane.publish(p.exchange(), p.routingKey(),
            RabbitBroker.props(props, p.headers(), "", null), d.getBody()));
        if (r == RabbitConfirms.Result.CONFIRMED) {
          hold.basicAck(d.getEnvelope().getDeliveryTag(), false);
          return true;
        }
        List<Rabbit.Publish> more = Rabbit.afterMove(n, p, r == RabbitConfirms.Result.RETURNED,
            h == null ? Map.of() : h, System.currentTimeMillis());
        if (more == null) break;
        for (int i = more.size() - 1; i >= 0; i--) pubs.addFirst(more.get(i));
      }
    } catch (IOException | ShutdownSignalException e) {
      return true; // the channel went: the delivery goes back to its level
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return true;
    }
    QueueRunner.LOG.warning("delay mover: move of " + props.getMessageId() + " from " + Rabbit.hold(n)
        + " refused, trying again in " + Rabbit.MOVE_RETRY_MS / 1000 + "s");
    return false;
  }
}
