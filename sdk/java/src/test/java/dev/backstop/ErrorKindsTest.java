package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.net.ConnectException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.SocketException;
import java.net.SocketTimeoutException;
import java.net.UnknownHostException;
import java.net.http.HttpConnectTimeoutException;
import java.net.http.HttpTimeoutException;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeoutException;
import java.util.function.Supplier;
import org.junit.jupiter.api.Test;

/**
 * Every "java" row of contract/errorkinds.json gives its kind, on errors
 * made the way the JDK makes them (a real refused connection and a real
 * read timeout on loopback, where one can be made without waiting).
 */
class ErrorKindsTest {
  private static final Map<String, Object> TABLE = Repo.json("contract/errorkinds.json");

  private static Exception realRefused() throws IOException {
    int port;
    try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
      port = s.getLocalPort();
    }
    try (Socket c = new Socket()) {
      c.connect(new InetSocketAddress(InetAddress.getLoopbackAddress(), port), 5_000);
    } catch (ConnectException e) {
      return e;
    }
    throw new AssertionError("a closed loopback port accepted a connection");
  }

  private static Exception realReadTimeout() throws IOException {
    try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getLoopbackAddress());
        Socket c = new Socket(InetAddress.getLoopbackAddress(), s.getLocalPort())) {
      c.setSoTimeout(1);
      InputStream in = c.getInputStream();
      in.read(); // nothing is ever written
    } catch (SocketTimeoutException e) {
      return e;
    }
    throw new AssertionError("a read with nothing to read returned");
  }

  private static Exception unchecked(Supplier<Exception> s) {
    return s.get();
  }

  @Test
  @SuppressWarnings("unchecked")
  void everyJavaRowGivesItsKind() throws Exception {
    Map<String, List<Exception>> rows = new LinkedHashMap<>();
    rows.put("java.net.http.HttpConnectTimeoutException", List.of(new HttpConnectTimeoutException("HTTP connect timed out")));
    rows.put("java.net.SocketTimeoutException when message has \"Connect timed out\"",
        List.of(new SocketTimeoutException("Connect timed out")));
    rows.put("java.net.SocketTimeoutException", List.of(realReadTimeout()));
    rows.put("java.net.http.HttpTimeoutException", List.of(new HttpTimeoutException("request timed out")));
    rows.put("java.util.concurrent.TimeoutException", List.of(new TimeoutException()));
    rows.put("java.net.ConnectException", List.of(realRefused(),
        new ExecutionException(new ConnectException("Connection refused")))); // wrapped: found on the cause
    rows.put("java.net.UnknownHostException when message has \"Temporary failure in name resolution\"",
        List.of(new UnknownHostException("api.example: Temporary failure in name resolution")));
    rows.put("java.net.UnknownHostException", List.of(new UnknownHostException("x.invalid: Name or service not known"),
        new UncheckedIOException(new UnknownHostException("x.invalid"))));
    rows.put("java.net.SocketException", List.of(new SocketException("Connection reset"),
        unchecked(() -> new SocketException("Broken pipe"))));
    Set<String> seen = new HashSet<>();
    for (Object o : (List<Object>) TABLE.get("java")) {
      List<Object> row = (List<Object>) o;
      String name = (String) row.get(0);
      List<Exception> errors = rows.get(name);
      assertNotNull(errors, "row " + name + ": no error made for it here");
      for (Exception e : errors) assertEquals(row.get(1), ErrorKinds.of(e), name + ": " + e);
      seen.add(name);
    }
    assertEquals(rows.keySet(), seen, "rows made here that errorkinds.json does not have");
    assertNull(ErrorKinds.of(new IOException("something else")));
    assertNull(ErrorKinds.of(new IllegalStateException("a bug")));
  }

  @Test
  void theBundledTableIsTheContractsTable() {
    assertEquals(Repo.read("contract/errorkinds.json"),
        new String(PolicyRuntime.resource("errorkinds.json"), java.nio.charset.StandardCharsets.UTF_8));
    assertTrue(ErrorKinds.ROWS.stream().allMatch(r -> r.type() != null), "a row names a class this JVM lacks");
  }
}
