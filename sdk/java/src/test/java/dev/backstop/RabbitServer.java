package dev.backstop;

import java.io.File;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * A real rabbitmq-server (the Debian package) for the tests, as the Python
 * conftest starts one: run directly from /usr/lib/rabbitmq/bin (not the
 * wrapper, which switches user) on free loopback ports with a private data
 * directory and HOME, once per test JVM, stopped at its exit
 * (/work/shared/notes/rabbitmq-local.md). A missing broker fails the tests.
 */
final class RabbitServer {
  static final Path BIN = Path.of("/usr/lib/rabbitmq/bin");
  private static RabbitServer shared;

  final String url;
  private final Map<String, String> env;
  private final String node;
  private final Process proc;

  /** The test JVM's broker, started on first use. */
  static synchronized RabbitServer get() throws Exception {
    if (shared == null) {
      shared = new RabbitServer();
      RabbitServer s = shared;
      Runtime.getRuntime().addShutdownHook(new Thread(s::stop));
    }
    return shared;
  }

  static int freePort() throws IOException {
    try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
      return s.getLocalPort();
    }
  }

  private RabbitServer() throws Exception {
    if (!Files.isExecutable(BIN.resolve("rabbitmq-server"))) {
      throw new AssertionError(BIN + "/rabbitmq-server not found: the rabbitmq tests need a real broker; install the"
          + " Debian package rabbitmq-server (`make deps` does)");
    }
    Path dir = Files.createTempDirectory("backstop-java-rabbit");
    for (String d : new String[] {"home", "log", "mnesia"}) Files.createDirectories(dir.resolve(d));
    int port = freePort();
    int dist = freePort();
    node = "bsjava" + ProcessHandle.current().pid() + "x" + port + "@localhost";
    Files.writeString(dir.resolve("enabled_plugins"), "[].\n"); // no management: starts faster
    Files.writeString(dir.resolve("rabbit.conf"), "listeners.tcp.default = 127.0.0.1:" + port + "\nloopback_users = none\n");
    url = "amqp://guest:guest@127.0.0.1:" + port + "/";
    ProcessBuilder pb = new ProcessBuilder(BIN.resolve("rabbitmq-server").toString());
    env = pb.environment();
    env.put("HOME", dir.resolve("home").toString());
    env.put("RABBITMQ_NODENAME", node);
    env.put("RABBITMQ_MNESIA_BASE", dir.resolve("mnesia").toString());
    env.put("RABBITMQ_LOG_BASE", dir.resolve("log").toString());
    env.put("RABBITMQ_ENABLED_PLUGINS_FILE", dir.resolve("enabled_plugins").toString());
    env.put("RABBITMQ_CONFIG_FILE", dir.resolve("rabbit").toString());
    env.put("RABBITMQ_DIST_PORT", Integer.toString(dist));
    File log = dir.resolve("out.log").toFile();
    pb.redirectErrorStream(true).redirectOutput(log).redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")));
    proc = pb.start();
    long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(90);
    while (System.nanoTime() < until && proc.isAlive()) {
      try (Socket s = new Socket()) {
        s.connect(new InetSocketAddress("127.0.0.1", port), 1000);
        return;
      } catch (IOException e) {
        proc.waitFor(100, TimeUnit.MILLISECONDS); // the broker starting (bounded polling)
      }
    }
    stop();
    throw new AssertionError("rabbitmq-server on 127.0.0.1:" + port + " did not start; see " + log);
  }

  /** Runs rabbitmqctl on the broker's node; its output. */
  String ctl(String... args) throws IOException, InterruptedException {
    List<String> argv = new ArrayList<>(List.of(BIN.resolve("rabbitmqctl").toString(), "-n", node));
    argv.addAll(List.of(args));
    ProcessBuilder pb = new ProcessBuilder(argv);
    pb.environment().putAll(env);
    pb.redirectErrorStream(true).redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")));
    Process p = pb.start();
    String out = new String(p.getInputStream().readAllBytes(), java.nio.charset.StandardCharsets.UTF_8);
    if (!p.waitFor(120, TimeUnit.SECONDS) || p.exitValue() != 0) {
      throw new AssertionError("rabbitmqctl " + String.join(" ", args) + ": " + out);
    }
    return out;
  }

  void stop() {
    if (!proc.isAlive()) return;
    try {
      ProcessBuilder pb = new ProcessBuilder(BIN.resolve("rabbitmqctl").toString(), "-n", node, "stop");
      pb.environment().putAll(env);
      pb.redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.DISCARD);
      pb.start().waitFor(60, TimeUnit.SECONDS);
      if (!proc.waitFor(30, TimeUnit.SECONDS)) {
        proc.descendants().forEach(ProcessHandle::destroyForcibly);
        proc.destroyForcibly();
      }
    } catch (IOException | InterruptedException e) {
      proc.descendants().forEach(ProcessHandle::destroyForcibly);
      proc.destroyForcibly();
    }
  }
}
