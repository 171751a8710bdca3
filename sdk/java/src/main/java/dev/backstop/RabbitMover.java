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
import java.util.Comparator;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledFuture;
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
 *
 * <p>It answers a force run ({@code backstop queue run}, queue/rabbitmq/run.go)
 * on a command queue of its own bound to {@link Rabbit#RUN}: {@code count}
 * the held deliveries a command selects, {@code take} at most its limit of
 * them, earliest due first, each published to its work queue without its due
 * time with a confirm and only then acked; the answer (matched, moved, the
 * command queue's name) goes to the command's reply-to.
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
      // What is held, until its time or a run's take: whoever removes a
      // delivery from it moves it, once.
      Set<Held> pending = ConcurrentHashMap.newKeySet();
      // A run's commands: a queue of this session's own, bound to the run
      // exchange before the holds are consumed (a run counts the hold
      // level's consumers as movers), answered from what is held on a
      // thread of their own (a take waits for confirms).
      Channel cc = conn.createChannel();
      cc.addShutdownListener(s -> lost.countDown());
      Channel rc = conn.createChannel();
      rc.addShutdownListener(s -> lost.countDown());
      RabbitConfirms runLane = new RabbitConfirms(rc);
      ExecutorService runs = Executors.newSingleThreadExecutor(r -> {
        Thread t = new Thread(r, "backstop-delay-mover-run");
        t.setDaemon(true);
        return t;
      });
      laneThreads.add(runs);
      String cq = cc.queueDeclare("", false, true, true, null).getQueue();
      cc.queueBind(cq, Rabbit.RUN, "");
      cc.basicConsume(cq, true, (tag, c) -> runs.execute(() -> answer(cc, cq, ch, runLane, pending, timers, c)),
          tag -> lost.countDown());
      ch.basicQos(Rabbit.MOVE_PREFETCH, false);
      for (int n = 0; n < Rabbit.HOLD_LEVELS; n++) {
        int level = n;
        ch.basicConsume(Rabbit.hold(n), false, (tag, d) -> {
          String key = d.getEnvelope().getRoutingKey();
          Map<String, Object> h = d.getProperties().getHeaders();
          long at = Rabbit.releaseMs(level, key, h, System.currentTimeMillis());
          int lane = Math.floorMod(next.getAndIncrement(), LANES);
          Held held = new Held(level, d);
          held.move = new Runnable() {
            @Override
            public void run() {
              if (!pending.remove(held)) return; // a run took it
              laneThreads.get(lane).execute(() -> {
                if (!move(ch, lanes.get(lane), level, d) && !stopping()) hold(pending, timers, held, Rabbit.MOVE_RETRY_MS);
              });
            }
          };
          hold(pending, timers, held, Math.max(0, at - System.currentTimeMillis()));
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

  /** A delivery of hold level n, held until its time; its timer once scheduled. */
  private static final class Held {
    final int level;
    final Delivery d;
    Runnable move; // its move, at its time
    volatile ScheduledFuture<?> timer;

    Held(int level, Delivery d) {
      this.level = level;
      this.d = d;
    }

    long dueMs() {
      Long due = Rabbit.num(d.getProperties().getHeaders() == null ? null : d.getProperties().getHeaders().get(Rabbit.H_DUE));
      return due == null ? 0 : due;
    }
  }

  private static void hold(Set<Held> pending, ScheduledExecutorService timers, Held h, long inMs) {
    pending.add(h);
    try {
      h.timer = timers.schedule(h.move, inMs, TimeUnit.MILLISECONDS);
    } catch (RejectedExecutionException e) {
      pending.remove(h); // the session ends: the delivery goes back with its channel
    }
  }

  // A run's command c (Rabbit.runCommand): takes the held deliveries it
  // selects (none for a count), earliest due first, publishes each to its
  // work queue with a confirm and acks it; one the broker does not take
  // goes on down the levels, due now. Then answers.
  private void answer(Channel cc, String cq, Channel hold, RabbitConfirms lane, Set<Held> pending,
      ScheduledExecutorService timers, Delivery c) {
    Rabbit.RunCommand cmd = Rabbit.runCommand(c.getProperties().getHeaders());
    List<Held> all = new ArrayList<>();
    for (Held h : pending) {
      if (cmd.selects(h.d.getProperties().getMessageId(), h.d.getProperties().getHeaders())) all.add(h);
    }
    all.sort(Comparator.comparingLong(Held::dueMs));
    long moved = 0;
    long taken = 0;
    for (Held h : all) {
      if (taken >= cmd.limit()) break;
      if (!pending.remove(h)) continue; // its time came: the move has it
      taken++;
      ScheduledFuture<?> t = h.timer;
      if (t != null) t.cancel(false);
      AMQP.BasicProperties props = h.d.getProperties();
      Rabbit.Publish p = Rabbit.runNow(props.getHeaders());
      try {
        RabbitConfirms.Result r = RabbitConfirms.await(lane.publish(p.exchange(), p.routingKey(),
            RabbitBroker.props(props, p.headers(), "", null), h.d.getBody()));
        if (r == RabbitConfirms.Result.CONFIRMED) {
          hold.basicAck(h.d.getEnvelope().getDeliveryTag(), false);
          moved++;
          continue;
        }
        QueueRunner.LOG.warning("delay mover: run of held job " + props.getMessageId() + " refused (" + r
            + "); it goes on delayed");
      } catch (IOException | ShutdownSignalException e) {
        QueueRunner.LOG.warning("delay mover: run of held job " + props.getMessageId() + " failed: " + e.getMessage());
        return; // the channel went: the delivery goes back to its level
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return;
      }
      hold(pending, timers, h, 0); // as if its time had come
    }
    String to = c.getProperties().getReplyTo();
    if (to == null || to.isEmpty()) return;
    try {
      cc.basicPublish("", to, new AMQP.BasicProperties.Builder().correlationId(c.getProperties().getCorrelationId())
          .headers(Rabbit.runAnswer(all.size(), moved, cq)).build(), new byte[0]);
    } catch (IOException | ShutdownSignalException e) {
      QueueRunner.LOG.warning("delay mover: run: cannot answer: " + e.getMessage());
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
