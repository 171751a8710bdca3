package dev.backstop.spring;

import java.lang.reflect.Method;
import java.util.Arrays;
import java.util.Set;
import org.apache.commons.logging.Log;
import org.apache.commons.logging.LogFactory;
import org.aopalliance.aop.Advice;
import org.springframework.amqp.rabbit.config.AbstractRabbitListenerContainerFactory;
import org.springframework.amqp.rabbit.listener.AbstractMessageListenerContainer;
import org.springframework.amqp.rabbit.listener.DirectMessageListenerContainer;
import org.springframework.amqp.rabbit.listener.MessageListenerContainer;
import org.springframework.amqp.rabbit.listener.RabbitListenerEndpointRegistry;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.beans.factory.config.BeanPostProcessor;
import org.springframework.context.SmartLifecycle;
import org.springframework.util.ErrorHandler;
import org.springframework.util.ReflectionUtils;

/**
 * Every simple or direct listener container factory in the context, Boot's
 * and the application's own, takes backstop's advice as its containers'
 * whole chain (the factory's, so set once whatever the container
 * customizers). Then, before the listener containers start, each advised
 * container's queues get their handling (and mover of the delay levels), and
 * its error handler stays quiet about backstop's dead letters on their way
 * to the DLQ.
 */
final class BackstopContainers {
  private BackstopContainers() {}

  /** The factories' post-processor; the beans named in excluded are left as they are. */
  static BeanPostProcessor factories(ObjectProvider<BackstopListenerAdvice> advice, Set<String> excluded) {
    return new BeanPostProcessor() {
      @Override
      public Object postProcessAfterInitialization(Object bean, String name) {
        if (bean instanceof AbstractRabbitListenerContainerFactory<?> f && !excluded.contains(name)) {
          f.setAdviceChain(advice.getObject()); // in place of Boot's retry interceptor, if any
        }
        return bean;
      }
    };
  }

  private static final Method CHAIN = chain();

  private static Method chain() {
    // Protected in Spring AMQP: which containers a factory advised is not public otherwise.
    Method m = ReflectionUtils.findMethod(AbstractMessageListenerContainer.class, "getAdviceChain");
    ReflectionUtils.makeAccessible(m);
    return m;
  }

  static boolean advised(AbstractMessageListenerContainer c, BackstopListenerAdvice advice) {
    Advice[] chain = (Advice[]) ReflectionUtils.invokeMethod(CHAIN, c);
    return chain != null && Arrays.asList(chain).contains(advice);
  }

  /** Starts just before the registry starts the listener containers. */
  static final class Starter implements SmartLifecycle {
    private final ObjectProvider<RabbitListenerEndpointRegistry> registry;
    private final BackstopListenerAdvice advice;
    private volatile boolean running;

    Starter(ObjectProvider<RabbitListenerEndpointRegistry> registry, BackstopListenerAdvice advice) {
      this.registry = registry;
      this.advice = advice;
    }

    @Override
    public void start() {
      RabbitListenerEndpointRegistry r = registry.getIfAvailable();
      if (r != null) {
        for (MessageListenerContainer mc : r.getListenerContainers()) {
          if (mc instanceof AbstractMessageListenerContainer c && advised(c, advice)) {
            // Each queue's mover now, not at its first delivery: a retry waiting in the
            // delay levels comes back though no new message arrives.
            for (String q : c.getQueueNames()) {
              if (c instanceof DirectMessageListenerContainer) advice.consumedByDirectContainer(q);
              advice.handling(q);
            }
            c.setErrorHandler(new QuietDeadLetters(c.getErrorHandler()));
          }
        }
      }
      running = true;
    }

    @Override
    public void stop() {
      running = false;
    }

    @Override
    public boolean isRunning() {
      return running;
    }

    @Override
    public int getPhase() {
      RabbitListenerEndpointRegistry r = registry.getIfAvailable();
      return (r != null ? r.getPhase() : DEFAULT_PHASE) - 1;
    }
  }

  /**
   * The container's error handler, but for backstop's dead letter rejected
   * on its way through the queue's dead-letter exchange: a normal outcome
   * (counted in backstop's metrics), not a WARN with a stack trace per
   * message. It is rejected without requeue all the same: the container acts
   * on the exception, not on the handler.
   */
  static final class QuietDeadLetters implements ErrorHandler {
    private static final Log LOG = LogFactory.getLog(QuietDeadLetters.class);
    private final ErrorHandler delegate;

    QuietDeadLetters(ErrorHandler delegate) {
      this.delegate = delegate;
    }

    @Override
    public void handleError(Throwable t) {
      for (Throwable c = t; c != null; c = c.getCause()) {
        if (c instanceof BackstopListenerAdvice.DeadLetterRejected) {
          if (LOG.isDebugEnabled()) LOG.debug(c.getMessage());
          return;
        }
      }
      if (delegate != null) delegate.handleError(t);
    }
  }
}
