package dev.backstop.spring;

import com.rabbitmq.client.AMQP;
import dev.backstop.Policy;
import dev.backstop.QueueHandler;
import dev.backstop.RabbitBroker;
import dev.backstop.RabbitHandling;
import dev.backstop.RabbitJob;
import dev.backstop.WorkOptions;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Function;
import java.util.function.Predicate;
import org.aopalliance.intercept.MethodInterceptor;
import org.aopalliance.intercept.MethodInvocation;
import org.springframework.amqp.AmqpRejectAndDontRequeueException;
import org.springframework.amqp.core.Message;
import org.springframework.amqp.rabbit.support.DefaultMessagePropertiesConverter;
import org.springframework.amqp.rabbit.support.ListenerExecutionFailedException;

/**
 * The listener container's advice in place of Spring's retry interceptor and
 * its MessageRecoverer: each delivery of a {@code @RabbitListener} runs
 * through backstop's {@link RabbitHandling} (the core artifact's RabbitMQ
 * outcome code; {@link Policy#outcome} decides). A listener's exception is
 * not retried in memory: the policy decides it, and the next message (a
 * retry through the delay levels, a deferral, a dead letter with
 * backstop's reason) is published and confirmed; then the advice returns and
 * the container acks the delivery. When the outcome could not be applied the
 * advice throws, and the container hands the delivery back.
 */
public final class BackstopListenerAdvice implements MethodInterceptor, AutoCloseable {
  private static final DefaultMessagePropertiesConverter PROPS = new DefaultMessagePropertiesConverter();

  private final RabbitBroker broker;
  private final Function<String, Policy> policyOf;
  private final Function<String, Integer> maxDeliveriesOf;
  private final WorkOptions options;
  private final Predicate<String> throughDlx;
  private final Map<String, RabbitHandling> queues = new ConcurrentHashMap<>();
  private final Set<String> direct = ConcurrentHashMap.newKeySet();

  /**
   * Handles the deliveries of every queue with broker (queues someone else
   * declared: {@link RabbitBroker#existingQueue}), the policy and crash-loop
   * limit of each queue, and options (per-type policies, metrics, hooks).
   */
  public BackstopListenerAdvice(RabbitBroker broker, Function<String, Policy> policyOf,
      Function<String, Integer> maxDeliveriesOf, WorkOptions options) {
    this(broker, policyOf, maxDeliveriesOf, options, q -> false);
  }

  /**
   * As above; the dead letters of the queues throughDlx selects (declared
   * with their own dead-letter exchange, which routes to Q.dlq) go through
   * it ({@link RabbitHandling#deadLetterThroughQueue}): they reach the DLQ
   * with the broker's x-death beside backstop's reason.
   */
  public BackstopListenerAdvice(RabbitBroker broker, Function<String, Policy> policyOf,
      Function<String, Integer> maxDeliveriesOf, WorkOptions options, Predicate<String> throughDlx) {
    this.throughDlx = throughDlx;
    this.broker = broker;
    this.policyOf = policyOf;
    this.maxDeliveriesOf = maxDeliveriesOf;
    this.options = options;
  }

  RabbitHandling handling(String queue) {
    // Each runs a mover of the delay levels, as each worker does.
    return queues.computeIfAbsent(queue, q -> {
      RabbitHandling h = new RabbitHandling(broker.existingQueue(q, maxDeliveriesOf.apply(q)), policyOf.apply(q), options);
      return throughDlx.test(q) && !direct.contains(q) ? h.deadLetterThroughQueue() : h;
    });
  }

  /**
   * queue is consumed by a direct listener container: its dead letters are
   * published to Q.dlq directly, not rejected through the queue's
   * dead-letter exchange (that container logs every rejected delivery as an
   * ERROR with a stack trace). Before the queue's first delivery.
   */
  void consumedByDirectContainer(String queue) {
    direct.add(queue);
  }

  @Override
  public Object invoke(MethodInvocation invocation) throws Throwable {
    Object[] args = invocation.getArguments();
    if (args.length < 2 || !(args[1] instanceof Message m) || m.getMessageProperties().getConsumerQueue() == null) {
      return invocation.proceed(); // a batch: not backstop's
    }
    AMQP.BasicProperties props = PROPS.fromMessageProperties(m.getMessageProperties(), StandardCharsets.UTF_8.name());
    boolean redelivered = Boolean.TRUE.equals(m.getMessageProperties().getRedelivered());
    RabbitHandling handling = handling(m.getMessageProperties().getConsumerQueue());
    if (handling.isDeadLetter(props)) {
      // backstop's dead letter, back in its queue: the broker moves it to the DLQ (x-death).
      throw new DeadLetterRejected(m.getMessageProperties().getConsumerQueue());
    }
    QueueHandler<RabbitJob> listener = job -> {
      try {
        invocation.proceed();
      } catch (ListenerExecutionFailedException e) {
        // The listener's own exception is the failure the policy classifies.
        Throwable cause = e.getCause() != null ? e.getCause() : e;
        if (cause instanceof Exception ex) throw ex;
        throw e;
      } catch (Exception e) {
        throw e;
      } catch (Throwable t) {
        throw new RuntimeException(t);
      }
    };
    handling.handle(props, m.getBody(), redelivered, listener);
    return null;
  }

  /**
   * backstop's dead letter rejected without requeue so that the broker
   * dead-letters it (x-death); the container's error handler logs it at
   * debug, not as a failed listener.
   */
  public static final class DeadLetterRejected extends AmqpRejectAndDontRequeueException {
    DeadLetterRejected(String queue) {
      super("backstop: a dead letter of " + queue + " on its way to the DLQ");
    }
  }

  /** Stops the movers. */
  @Override
  public void close() {
    queues.values().forEach(RabbitHandling::close);
  }
}
