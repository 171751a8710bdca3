package dev.backstop.example.notification;

import dev.backstop.HttpStatusException;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;
import org.springframework.amqp.core.Binding;
import org.springframework.amqp.core.BindingBuilder;
import org.springframework.amqp.core.DirectExchange;
import org.springframework.amqp.core.Queue;
import org.springframework.amqp.core.QueueBuilder;
import org.springframework.amqp.rabbit.annotation.RabbitListener;
import org.springframework.amqp.rabbit.config.DirectRabbitListenerContainerFactory;
import org.springframework.amqp.rabbit.connection.ConnectionFactory;
import org.springframework.amqp.support.converter.JacksonJsonMessageConverter;
import org.springframework.amqp.support.converter.MessageConverter;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.context.annotation.Bean;
import org.springframework.messaging.handler.annotation.Header;
import org.springframework.stereotype.Component;

/**
 * A notification service as a Spring Boot application writes it: its queue
 * declared the usual way (quorum, its own dead-letter exchange and DLQ), a
 * JSON message converter, a {@code @RabbitListener} calling a provider. The
 * only backstop in it is the backstop-spring dependency and application.yml
 * (in a package of its own: its component scan sees none of backstop-spring's
 * classes, as in an application).
 */
@SpringBootApplication(proxyBeanMethods = false)
public class NotificationService {
  public static final String QUEUE = "notification.order-placed";
  public static final String OTHER = "notification.sms";

  public record OrderPlaced(String orderId, String email) {}

  @Bean
  Queue orderPlaced() {
    return QueueBuilder.durable(QUEUE).quorum().deadLetterExchange("notification.dlx").build();
  }

  @Bean
  DirectExchange notificationDlx() {
    return new DirectExchange("notification.dlx");
  }

  @Bean
  Queue orderPlacedDlq() {
    return QueueBuilder.durable(QUEUE + ".dlq").quorum().build();
  }

  @Bean
  Binding orderPlacedDlqBinding() {
    return BindingBuilder.bind(orderPlacedDlq()).to(notificationDlx()).with(QUEUE);
  }

  @Bean
  Queue sms() {
    return QueueBuilder.durable(OTHER).quorum().deadLetterExchange("notification.dlx").build();
  }

  @Bean
  Queue smsDlq() {
    return QueueBuilder.durable(OTHER + ".dlq").quorum().build();
  }

  @Bean
  Binding smsDlqBinding() {
    return BindingBuilder.bind(smsDlq()).to(notificationDlx()).with(OTHER);
  }

  /**
   * A listener container factory of the application's own (most services
   * define one): its listeners are backstop's too, with nothing set on it.
   */
  @Bean
  DirectRabbitListenerContainerFactory smsListenerFactory(ConnectionFactory cf, MessageConverter converter) {
    DirectRabbitListenerContainerFactory f = new DirectRabbitListenerContainerFactory();
    f.setConnectionFactory(cf);
    f.setMessageConverter(converter);
    return f;
  }

  @Bean
  MessageConverter jsonConverter() {
    return new JacksonJsonMessageConverter();
  }

  /** The e-mail provider: scripted answers per order (200 when none is left), and the calls it took. */
  @Component
  public static class Provider {
    public final Map<String, List<Integer>> answers = new ConcurrentHashMap<>();
    public final List<String> calls = new CopyOnWriteArrayList<>(); // "orderId attempt prevDelayMs"

    void send(OrderPlaced o, String attempt, String prevDelay) throws HttpStatusException {
      calls.add(o.orderId() + " " + (attempt == null ? "-" : attempt) + " " + (prevDelay == null ? "-" : prevDelay));
      List<Integer> a = answers.get(o.orderId());
      int status = a == null || a.isEmpty() ? 200 : a.remove(0);
      if (status >= 400) throw new HttpStatusException(status);
    }
  }

  @Component
  public static class Listener {
    final Provider provider;
    public final AtomicInteger sms = new AtomicInteger();

    Listener(Provider provider) {
      this.provider = provider;
    }

    @RabbitListener(queues = QUEUE)
    public void onOrderPlaced(OrderPlaced event, @Header(name = "backstop-attempt", required = false) String attempt,
        @Header(name = "backstop-prev-delay-ms", required = false) String prevDelay) throws HttpStatusException {
      provider.send(event, attempt, prevDelay);
    }

    @RabbitListener(queues = OTHER, containerFactory = "smsListenerFactory")
    public void onSms(OrderPlaced event) throws HttpStatusException {
      sms.incrementAndGet();
      provider.send(event, null, null);
    }
  }
}
