package dev.backstop;

import java.io.File;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;

/** A real redis-server for the tests: loopback, a free port, no persistence, once per test JVM. */
final class RedisServer {
  private static RedisServer shared;
  final String url;
  private final Process proc;

  static synchronized RedisServer get() throws Exception {
    if (shared == null) {
      shared = new RedisServer();
      Process p = shared.proc;
      Runtime.getRuntime().addShutdownHook(new Thread(p::destroy));
    }
    return shared;
  }

  private RedisServer() throws Exception {
    int port = RabbitServer.freePort();
    Path dir = Files.createTempDirectory("backstop-java-redis");
    ProcessBuilder pb = new ProcessBuilder("redis-server", "--port", Integer.toString(port), "--bind", "127.0.0.1",
        "--save", "", "--appendonly", "no", "--dir", dir.toString());
    pb.redirectErrorStream(true).redirectOutput(dir.resolve("out.log").toFile())
        .redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")));
    try {
      proc = pb.start();
    } catch (IOException e) {
      throw new AssertionError("redis-server not found: the Redis tests need a real server; install the Debian package"
          + " redis-server (`make deps` does)", e);
    }
    url = "redis://127.0.0.1:" + port;
    long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    while (System.nanoTime() < until && proc.isAlive()) {
      try (Socket s = new Socket()) {
        s.connect(new InetSocketAddress("127.0.0.1", port), 1000);
        return;
      } catch (IOException e) {
        proc.waitFor(50, TimeUnit.MILLISECONDS); // the server starting (bounded polling)
      }
    }
    proc.destroyForcibly();
    throw new AssertionError("redis-server on 127.0.0.1:" + port + " did not start; see " + dir + "/out.log");
  }
}
