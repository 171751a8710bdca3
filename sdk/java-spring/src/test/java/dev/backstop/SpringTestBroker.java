package dev.backstop;

/** The core's test broker (a real rabbitmq-server, RabbitServer) for backstop-spring's tests. */
public final class SpringTestBroker {
  private SpringTestBroker() {}

  /** The broker's amqp:// URL, started on first use and stopped at the JVM's exit. */
  public static String url() throws Exception {
    return RabbitServer.get().url;
  }

  /** Bounded polling until cond holds (the core tests' RabbitCasesTest.until). */
  public static void until(String what, java.util.function.BooleanSupplier cond) throws InterruptedException {
    RabbitCasesTest.until(what, cond);
  }
}
