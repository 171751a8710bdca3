package dev.backstop;

import io.lettuce.core.RedisClient;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The Java side of Go's idempotency/java_test.go: IdempotencyFilter in
 * embedded Tomcat over the Redis at args[0] (host:port), with the default
 * prefix and scope, so it shares records with Go's Middleware. For each key
 * in args[1..] it POSTs "10" to /charges once and prints what came back, as
 * one JSON object (key → status, body, Location, Content-Type, replayed),
 * with the handler's runs. The handler answers 201, Location
 * /charges/café (Latin-1, as Tomcat sends it) and "charged by java".
 */
public final class IdempotencyInterop {
  private IdempotencyInterop() {}

  public static void main(String[] args) throws Exception {
    RedisClient client = RedisClient.create("redis://" + args[0]);
    AtomicInteger runs = new AtomicInteger();
    HttpServlet charges = new HttpServlet() {
      private static final long serialVersionUID = 1L;

      @Override
      protected void service(HttpServletRequest req, HttpServletResponse res) throws IOException {
        req.getInputStream().readAllBytes();
        runs.incrementAndGet();
        res.setContentType("text/plain");
        res.setHeader("Location", "/charges/caf\u00e9");
        res.setStatus(201);
        res.getOutputStream().write("charged by java".getBytes(java.nio.charset.StandardCharsets.UTF_8));
      }
    };
    Map<String, Object> out = new LinkedHashMap<>();
    try (IdempotencyStore store = IdempotencyStore.create(client, IdempotencyStore.Options.defaults());
        TomcatServer server = new TomcatServer(IdempotencyFilter.create(store, IdempotencyFilter.Options.defaults()), charges)) {
      HttpClient http = HttpClient.newHttpClient();
      for (int i = 1; i < args.length; i++) {
        HttpResponse<String> r = http.send(HttpRequest.newBuilder(URI.create(server.base + "/charges"))
            .header("Idempotency-Key", args[i]).POST(HttpRequest.BodyPublishers.ofString("10")).build(),
            HttpResponse.BodyHandlers.ofString());
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("status", (long) r.statusCode());
        m.put("body", r.body());
        m.put("location", r.headers().firstValue("Location").orElse(""));
        m.put("content_type", r.headers().firstValue("Content-Type").orElse(""));
        m.put("replayed", r.headers().firstValue(IdempotencyFilter.REPLAYED_HEADER).orElse(""));
        out.put(args[i], m);
      }
    } finally {
      client.shutdown();
    }
    out.put("runs", (long) runs.get());
    System.out.println(Repo.write(out));
    System.exit(0);
  }
}
