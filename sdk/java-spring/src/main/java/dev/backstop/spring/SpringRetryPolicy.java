package dev.backstop.spring;

import java.math.BigDecimal;
import java.time.Duration;
import java.util.Optional;
import org.springframework.boot.context.properties.bind.Binder;
import org.springframework.core.env.Environment;

/**
 * The policy of a Spring application's listener retry settings
 * ({@code spring.rabbitmq.listener.simple.retry.*}), as
 * {@code backstop policy import --from spring} writes it from the same keys
 * (cmd/backstop/import.go): max-attempts counts the first call, the first wait
 * is initial-interval, each next one multiplier times the last (a multiplier
 * of 1 or less is 1), none above max-interval; no jitter. Spring Boot's
 * defaults for the keys left out: 3, 1000ms, 1.0, 10000ms. The retries are
 * backstop's cold ones (the delay levels), not Spring's in-memory loop.
 */
final class SpringRetryPolicy {
  static final String PREFIX = "spring.rabbitmq.listener.simple.retry";

  private SpringRetryPolicy() {}

  private static <T> Optional<T> opt(org.springframework.boot.context.properties.bind.BindResult<T> r) {
    return r.isBound() ? Optional.of(r.get()) : Optional.empty();
  }

  /** The policy JSON of env's retry settings, or empty when none of the four keys is set. */
  static Optional<String> of(Environment env) {
    Binder b = Binder.get(env);
    Optional<Integer> attempts = opt(b.bind(PREFIX + ".max-attempts", Integer.class));
    Optional<Duration> initial = opt(b.bind(PREFIX + ".initial-interval", Duration.class));
    Optional<BigDecimal> multiplier = opt(b.bind(PREFIX + ".multiplier", BigDecimal.class));
    Optional<Duration> maxInterval = opt(b.bind(PREFIX + ".max-interval", Duration.class));
    if (attempts.isEmpty() && initial.isEmpty() && multiplier.isEmpty() && maxInterval.isEmpty()) {
      return Optional.empty();
    }
    long first = initial.orElse(Duration.ofMillis(1000)).toMillis();
    long cap = maxInterval.orElse(Duration.ofMillis(10000)).toMillis();
    BigDecimal m = multiplier.orElse(BigDecimal.ONE).max(BigDecimal.ONE).stripTrailingZeros();
    return Optional.of("{\"max_attempts\": " + attempts.orElse(3) + ", \"backoff\": {\"strategy\": \"exponential\", "
        + "\"base\": \"" + Math.min(first, cap) + "ms\", \"multiplier\": " + m.toPlainString() + ", \"cap\": \"" + cap
        + "ms\", \"max_doublings\": 1000}, \"jitter\": {\"mode\": \"none\"}}");
  }
}
