package dev.backstop.spring;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import dev.backstop.SpringTestBroker;
import org.aopalliance.aop.Advice;
import org.junit.jupiter.api.Test;
import org.springframework.amqp.rabbit.config.DirectRabbitListenerContainerFactory;
import org.springframework.amqp.rabbit.config.SimpleRabbitListenerContainerFactory;
import org.springframework.boot.amqp.autoconfigure.RabbitAutoConfiguration;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.test.context.runner.ApplicationContextRunner;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;

/**
 * Which listener container factories take backstop's advice: Boot's own (its
 * retry interceptor replaced) and the application's own, each with the advice
 * once; those backstop.exclude-factories names are left as they are.
 */
class ListenerFactoriesTest {
  @Configuration(proxyBeanMethods = false)
  static class App {
    @Bean
    SimpleRabbitListenerContainerFactory ordersFactory() {
      return new SimpleRabbitListenerContainerFactory();
    }

    @Bean
    DirectRabbitListenerContainerFactory smsFactory() {
      return new DirectRabbitListenerContainerFactory();
    }

    @Bean
    SimpleRabbitListenerContainerFactory legacyFactory() {
      return new SimpleRabbitListenerContainerFactory();
    }
  }

  @Test
  void everyFactoryButTheExcludedTakesTheAdviceOnce() throws Exception {
    new ApplicationContextRunner()
        .withConfiguration(AutoConfigurations.of(RabbitAutoConfiguration.class, BackstopAutoConfiguration.class))
        .withUserConfiguration(App.class)
        .withPropertyValues("spring.rabbitmq.addresses=" + SpringTestBroker.url(),
            "spring.rabbitmq.listener.simple.retry.enabled=true", "backstop.exclude-factories=legacyFactory")
        .run(ctx -> {
          Advice[] want = {ctx.getBean(BackstopListenerAdvice.class)};
          assertArrayEquals(want, ctx.getBean("rabbitListenerContainerFactory", SimpleRabbitListenerContainerFactory.class)
              .getAdviceChain()); // Boot's: its retry interceptor replaced
          assertArrayEquals(want, ctx.getBean("ordersFactory", SimpleRabbitListenerContainerFactory.class).getAdviceChain());
          assertArrayEquals(want, ctx.getBean("smsFactory", DirectRabbitListenerContainerFactory.class).getAdviceChain());
          assertNull(ctx.getBean("legacyFactory", SimpleRabbitListenerContainerFactory.class).getAdviceChain());
        });
  }
}
