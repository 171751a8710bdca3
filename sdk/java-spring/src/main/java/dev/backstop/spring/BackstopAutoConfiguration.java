package dev.backstop.spring;

import dev.backstop.Policy;
import dev.backstop.RabbitBroker;
import dev.backstop.WorkOptions;
import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.Set;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.regex.Pattern;
import org.springframework.amqp.core.Queue;
import java.util.List;
import org.springframework.amqp.rabbit.listener.RabbitListenerEndpointRegistry;
import org.springframework.beans.factory.config.BeanPostProcessor;
import org.springframework.boot.context.properties.bind.Bindable;
import org.springframework.boot.context.properties.bind.Binder;
import org.springframework.amqp.rabbit.connection.CachingConnectionFactory;
import org.springframework.amqp.rabbit.listener.SimpleMessageListenerContainer;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.boot.amqp.autoconfigure.RabbitAutoConfiguration;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.core.env.Environment;
import org.springframework.core.io.Resource;
import org.springframework.core.io.ResourceLoader;

/**
 * backstop for a Spring Boot application's {@code @RabbitListener}s: the
 * policy named in application.yml ({@link BackstopProperties}), and the
 * listener containers of every simple or direct container factory (Boot's
 * and the application's own) advised by
 * {@link BackstopListenerAdvice} in place of Spring's retry interceptor (its
 * in-memory retries and MessageRecoverer): a listener's exception is decided
 * by the policy and applied as backstop's outcome on the queue as Spring
 * declared it (the existing-queue mode). Metrics under backstop's names go to
 * the application's PrometheusRegistry when there is one (with actuator
 * and micrometer-registry-prometheus: /actuator/prometheus), else to the
 * Prometheus client's default registry.
 */
@AutoConfiguration(after = RabbitAutoConfiguration.class)
@ConditionalOnClass({SimpleMessageListenerContainer.class, RabbitBroker.class})
@ConditionalOnProperty(prefix = "backstop", name = "enabled", matchIfMissing = true)
@EnableConfigurationProperties(BackstopProperties.class)
public class BackstopAutoConfiguration {
  private static final Pattern PRESET = Pattern.compile("[a-z][a-z0-9-]*");

  /** A policy by its setting: a preset name, or a resource holding JSON or YAML. */
  static Policy load(ResourceLoader loader, String where) {
    if (PRESET.matcher(where).matches()) return Policy.preset(where);
    Resource r = loader.getResource(where);
    try (InputStream in = r.getInputStream()) {
      return Policy.load(in.readAllBytes());
    } catch (IOException e) {
      throw new UncheckedIOException("backstop: cannot read the policy " + where + ": " + e.getMessage(), e);
    }
  }

  /** The application's policy: backstop.policy, else its Spring retry settings, else the preset default. */
  @Bean
  @ConditionalOnMissingBean(name = "backstopPolicy")
  public Policy backstopPolicy(BackstopProperties props, ResourceLoader loader, Environment env) {
    if (props.getPolicy() != null && !props.getPolicy().isBlank()) return load(loader, props.getPolicy());
    return SpringRetryPolicy.of(env).map(Policy::load).orElseGet(() -> Policy.preset("default"));
  }

  /** The RabbitMQ part: with the application's connection factory (Boot's RabbitAutoConfiguration). */
  @Configuration(proxyBeanMethods = false)
  @ConditionalOnBean(CachingConnectionFactory.class)
  static class Rabbit {
    /** backstop's connection, with the settings of the application's connection factory. */
    @Bean(destroyMethod = "close")
    @ConditionalOnMissingBean
    public RabbitBroker backstopRabbitBroker(CachingConnectionFactory cf) throws IOException {
      return RabbitBroker.connect(cf.getRabbitConnectionFactory());
    }

    /**
     * The advice; metrics go to the application's PrometheusRegistry bean
     * (the one Boot's Prometheus export gives Micrometer, scraped at
     * /actuator/prometheus), else to the Prometheus client's default registry.
     */
    @Bean(destroyMethod = "close")
    @ConditionalOnMissingBean
    public BackstopListenerAdvice backstopListenerAdvice(BackstopProperties props, RabbitBroker broker,
        Policy backstopPolicy, ResourceLoader loader, ObjectProvider<PrometheusRegistry> registry,
        ObjectProvider<Queue> declared) {
      Map<String, Policy> byType = new LinkedHashMap<>();
      props.getPolicies().forEach((type, where) -> byType.put(type, load(loader, where)));
      Map<String, Policy> byQueue = new ConcurrentHashMap<>();
      props.getQueues().forEach((q, s) -> {
        if (s.getPolicy() != null) byQueue.put(q, load(loader, s.getPolicy()));
      });
      WorkOptions options = WorkOptions.defaults().withHandlerTimeout(props.getHandlerTimeout()).withPolicies(byType)
          .withMetrics(registry.getIfAvailable(() -> PrometheusRegistry.defaultRegistry), props.getPolicyName());
      // The queues the application declares with a dead-letter exchange of their own.
      Set<String> withDlx = new HashSet<>();
      if (props.isDeadLetterThroughDlx()) {
        declared.orderedStream().filter(q -> q.getArguments().get("x-dead-letter-exchange") != null)
            .forEach(q -> withDlx.add(q.getName()));
      }
      return new BackstopListenerAdvice(broker, q -> byQueue.getOrDefault(q, backstopPolicy), q -> {
        BackstopProperties.QueueSettings s = props.getQueues().get(q);
        return s != null && s.getMaxDeliveries() != null ? s.getMaxDeliveries() : props.getMaxDeliveries();
      }, options, withDlx::contains);
    }

    /**
     * Every simple or direct listener container factory, Boot's and the
     * application's own (backstop.exclude-factories names those to leave
     * alone), takes backstop's advice as its whole chain: Spring's retry
     * interceptor (spring.rabbitmq.listener.simple.retry) would hold the
     * consumer's thread; its settings are the policy's instead. Static: a
     * post-processor, read before the other beans.
     */
    @Bean
    static BeanPostProcessor backstopListenerFactories(ObjectProvider<BackstopListenerAdvice> advice, Environment env) {
      Set<String> excluded = new HashSet<>(Binder.get(env).bind("backstop.exclude-factories", Bindable.listOf(String.class))
          .orElse(List.of()));
      return BackstopContainers.factories(advice, excluded);
    }

    /** The advised containers' queues handled, and their error handlers quiet about dead letters, as they start. */
    @Bean
    BackstopContainers.Starter backstopContainerStarter(ObjectProvider<RabbitListenerEndpointRegistry> registry,
        BackstopListenerAdvice advice) {
      return new BackstopContainers.Starter(registry, advice);
    }
  }
}
