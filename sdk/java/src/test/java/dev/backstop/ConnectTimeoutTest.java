package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpConnectTimeoutException;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * connect_timeout (issue 43): read from the module once, handed to
 * HttpClient.Builder.connectTimeout, against a real peer on loopback that
 * never completes a connect. A connect that runs out is the error kind
 * connect_timeout, not timeout, and a POST that never connected is retried
 * (never sent).
 */
class ConnectTimeoutTest {
  private static final String POLICY = "{\"max_attempts\": 2, \"attempt_timeout\": \"30s\", \"connect_timeout\": \"100ms\","
      + " \"backoff\": {\"strategy\": \"constant\", \"base\": \"1ms\"}, \"jitter\": {\"mode\": \"none\"}}";

  /**
   * A listener on 127.0.0.1 whose connects hang: a backlog of 1 (Java's
   * least: below 1 is its default, 50), never accepted, its queue filled;
   * the kernel drops further SYNs, as a black-holing firewall does
   * (offline, unlike a non-routable address, which may fail at once).
   */
  static final class Blackhole implements AutoCloseable {
    final ServerSocket server;
    final List<Socket> held = new ArrayList<>();

    Blackhole() throws IOException {
      server = new ServerSocket(0, 1, InetAddress.getLoopbackAddress());
      for (int i = 0; i < 16; i++) {
        Socket s = new Socket();
        try {
          s.connect(new InetSocketAddress(InetAddress.getLoopbackAddress(), server.getLocalPort()), 200);
          held.add(s);
        } catch (SocketTimeoutException e) {
          s.close();
          return;
        }
      }
      close();
      throw new IllegalStateException("blackhole: port " + server.getLocalPort() + " still accepts connections after 16");
    }

    URI uri(String path) {
      return URI.create("http://127.0.0.1:" + server.getLocalPort() + path);
    }

    @Override
    public void close() throws IOException {
      for (Socket s : held) s.close();
      server.close();
    }
  }

  @Test
  void connectTimeoutIsReadFromThePolicy() {
    try (Policy p = Policy.load(POLICY); Policy none = Policy.load("{\"max_attempts\": 2}")) {
      assertEquals(Optional.of(Duration.ofMillis(100)), p.connectTimeout());
      assertEquals(Optional.empty(), none.connectTimeout()); // the client's own
    }
  }

  @Test
  void aConnectToABlackholedPeerFailsAsConnectTimeoutAndIsRetried() throws Exception {
    try (Blackhole peer = new Blackhole(); Policy p = Policy.load(POLICY)) {
      HttpClient.Builder b = HttpClient.newBuilder();
      p.connectTimeout().ifPresent(b::connectTimeout);
      HttpClient client = b.build();
      AtomicInteger calls = new AtomicInteger();
      RetryException e = assertThrows(RetryException.class, () -> Backstop.retrying(p).withMethod("POST").call(() -> {
        calls.incrementAndGet();
        HttpRequest req = HttpRequest.newBuilder(peer.uri("/charge")).POST(HttpRequest.BodyPublishers.noBody()).build();
        return client.send(req, HttpResponse.BodyHandlers.discarding());
      }));
      assertEquals(Decision.Reason.MAX_ATTEMPTS_REACHED, e.reason());
      assertEquals(2, calls.get());
      assertInstanceOf(HttpConnectTimeoutException.class, e.getCause());
      assertEquals("connect_timeout", ErrorKinds.of(e.getCause()));
    }
  }
}
