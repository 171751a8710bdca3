package dev.backstop.spring;

import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.springframework.boot.context.properties.ConfigurationProperties;

/**
 * backstop's settings in application.yml:
 *
 * <pre>
 * backstop:
 *   policy: classpath:policy.yaml      # a preset name, or a resource holding a JSON or YAML policy
 *   policies:                          # a job type's own policy (backstop-job-type header)
 *     send_sms: classpath:sms.yaml
 *   queues:
 *     notification.order-placed:
 *       policy: classpath:orders.yaml  # one listener's queue's own policy
 *       max-deliveries: 5
 *   exclude-factories: [legacyListenerFactory]  # factories whose listeners keep Spring's retry
 * </pre>
 *
 * Without {@code backstop.policy}, the policy is the one {@code backstop policy import --from spring}
 * writes from {@code spring.rabbitmq.listener.simple.retry.*} (max-attempts, initial-interval,
 * multiplier, max-interval), else the preset {@code default}.
 */
@ConfigurationProperties("backstop")
public class BackstopProperties {
  /** Whether backstop decides the listeners' failures. */
  private boolean enabled = true;
  /** The policy: a preset name or a resource (classpath:policy.yaml, file:...). */
  private String policy;
  /** The name the policy's metrics carry (backstop_client_* policy label). */
  private String policyName = "default";
  /** Per job type (the backstop-job-type header): its own policy. */
  private Map<String, String> policies = new LinkedHashMap<>();
  /** Per queue a listener consumes: its own policy and crash-loop limit. */
  private Map<String, QueueSettings> queues = new LinkedHashMap<>();
  /** Deliveries of one job without an outcome before it is dead-lettered crash_loop. */
  private int maxDeliveries = 5;
  /**
   * backstop's dead letters of a queue the application declares with its own
   * dead-letter exchange go through it (the broker's x-death beside backstop's
   * reason); false: published to Q.dlq directly.
   */
  private boolean deadLetterThroughDlx = true;
  /**
   * The bean names of listener container factories backstop leaves alone
   * (their listeners keep Spring's own retry and error handling); every
   * other simple or direct factory, Boot's or the application's, is advised.
   */
  private List<String> excludeFactories = new ArrayList<>();
  /** A listener's deadline: at it, its thread is interrupted and the attempt fails as a timeout. */
  private Duration handlerTimeout = Duration.ofMinutes(5);

  public static class QueueSettings {
    private String policy;
    private Integer maxDeliveries;

    public String getPolicy() {
      return policy;
    }

    public void setPolicy(String policy) {
      this.policy = policy;
    }

    public Integer getMaxDeliveries() {
      return maxDeliveries;
    }

    public void setMaxDeliveries(Integer maxDeliveries) {
      this.maxDeliveries = maxDeliveries;
    }
  }

  public boolean isEnabled() {
    return enabled;
  }

  public void setEnabled(boolean enabled) {
    this.enabled = enabled;
  }

  public String getPolicy() {
    return policy;
  }

  public void setPolicy(String policy) {
    this.policy = policy;
  }

  public String getPolicyName() {
    return policyName;
  }

  public void setPolicyName(String policyName) {
    this.policyName = policyName;
  }

  public Map<String, String> getPolicies() {
    return policies;
  }

  public void setPolicies(Map<String, String> policies) {
    this.policies = policies;
  }

  public Map<String, QueueSettings> getQueues() {
    return queues;
  }

  public void setQueues(Map<String, QueueSettings> queues) {
    this.queues = queues;
  }

  public int getMaxDeliveries() {
    return maxDeliveries;
  }

  public void setMaxDeliveries(int maxDeliveries) {
    this.maxDeliveries = maxDeliveries;
  }

  public boolean isDeadLetterThroughDlx() {
    return deadLetterThroughDlx;
  }

  public void setDeadLetterThroughDlx(boolean deadLetterThroughDlx) {
    this.deadLetterThroughDlx = deadLetterThroughDlx;
  }

  public List<String> getExcludeFactories() {
    return excludeFactories;
  }

  public void setExcludeFactories(List<String> excludeFactories) {
    this.excludeFactories = excludeFactories;
  }

  public Duration getHandlerTimeout() {
    return handlerTimeout;
  }

  public void setHandlerTimeout(Duration handlerTimeout) {
    this.handlerTimeout = handlerTimeout;
  }
}
