package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.ConfirmCallback;
import java.lang.reflect.Proxy;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;

/**
 * RabbitConfirms' locking. A channel whose basicPublish blocks stands in for
 * a broker under a memory alarm (it stops reading the socket, and the write
 * blocks): a real broker cannot be made to block one publish and confirm an
 * earlier one on cue. The lock discipline is what is tested.
 */
class RabbitConfirmsTest {
  /**
   * A publish blocked in basicPublish does not block the connection thread:
   * the confirm of an earlier publish is settled meanwhile. Before, publish
   * held the lock the confirm callback takes during basicPublish.
   */
  @Test
  void aBlockedPublishDoesNotStopConfirms() throws Exception {
    AtomicLong next = new AtomicLong(1);
    AtomicReference<ConfirmCallback> acks = new AtomicReference<>();
    CountDownLatch blocked = new CountDownLatch(1);
    CountDownLatch unblock = new CountDownLatch(1);
    Channel ch = (Channel) Proxy.newProxyInstance(Channel.class.getClassLoader(), new Class<?>[] {Channel.class},
        (proxy, m, args) -> {
          switch (m.getName()) {
            case "getNextPublishSeqNo":
              return next.get();
            case "basicPublish":
              if (next.getAndIncrement() == 2) {
                blocked.countDown();
                unblock.await();
              }
              return null;
            case "addConfirmListener":
              acks.set((ConfirmCallback) args[0]);
              return null;
            case "hashCode":
              return System.identityHashCode(proxy);
            case "equals":
              return proxy == args[0];
            default:
              return null; // confirmSelect, the return and shutdown listeners
          }
        });
    RabbitConfirms c = new RabbitConfirms(ch);
    AMQP.BasicProperties one = new AMQP.BasicProperties.Builder().messageId("one").build();
    AMQP.BasicProperties two = new AMQP.BasicProperties.Builder().messageId("two").build();
    CompletableFuture<RabbitConfirms.Result> first = c.publish("", "q", one, new byte[0]);
    Thread publisher = new Thread(() -> {
      try {
        c.publish("", "q", two, new byte[0]);
      } catch (Exception e) {
        throw new RuntimeException(e);
      }
    });
    publisher.start();
    try {
      assertTrue(blocked.await(30, TimeUnit.SECONDS), "the second publish reached basicPublish");
      // The connection thread's confirm of the first publish.
      Thread reader = new Thread(() -> {
        try {
          acks.get().handle(1, false);
        } catch (java.io.IOException e) {
          throw new java.io.UncheckedIOException(e);
        }
      });
      reader.start();
      reader.join(TimeUnit.SECONDS.toMillis(30)); // a hang detector, not a timing threshold
      assertEquals(RabbitConfirms.Result.CONFIRMED, first.getNow(null), "the confirm was settled while a publish blocked");
    } finally {
      unblock.countDown();
      publisher.join();
    }
    assertEquals(1, c.waiting()); // the second publish awaits its confirm
  }
}
