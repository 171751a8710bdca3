package dev.backstop;

import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ReadListener;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletInputStream;
import jakarta.servlet.ServletOutputStream;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.WriteListener;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletRequestWrapper;
import jakarta.servlet.http.HttpServletResponse;
import jakarta.servlet.http.HttpServletResponseWrapper;
import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.Charset;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.function.Function;
import java.util.function.IntPredicate;

/**
 * Idempotency keys for servlets and Spring MVC (a {@code jakarta.servlet}
 * Filter over an {@link IdempotencyBackend}: {@link IdempotencyStore} on Redis or
 * {@link PgIdempotencyStore} on PostgreSQL): a request with an
 * {@code Idempotency-Key} runs once; a retry with the same key and request
 * gets the first response (marked {@code Idempotent-Replayed: true}), the
 * same key with another request 422, a duplicate while the first runs 409
 * and {@code Retry-After}. The record is the one the Go, Node.js and Python
 * middlewares read and write.
 *
 * <pre>{@code
 * FilterRegistration.Dynamic f = servletContext.addFilter("idempotency",
 *     IdempotencyFilter.create(store, IdempotencyFilter.Options.defaults()));
 * f.addMappingForUrlPatterns(null, false, "/charges/*");
 * }</pre>
 *
 * <p>The handler's response is held until the store has it (a client never
 * sees a response the store then keeps differently), then written. Once the
 * handler has run, its response is stored (or the key released) whatever
 * happens to the client: a client that timed out or left does not stop the
 * store call. A store call that fails is logged and retried in the
 * background while the key's lease lasts (10ms doubling to 1s, jittered);
 * the client gets its response after the first attempt. If the store still
 * fails when the lease ends, the key may run again (at least once, not
 * exactly once), as in every language.
 *
 * <p>jakarta.servlet-api is a provided dependency: the container brings it.
 * The filter reads the request body to fingerprint it and gives it to the
 * handler again (stream, reader, form parameters); multipart parts
 * ({@code getParts}) cannot be parsed again by the container, and
 * asynchronous requests ({@code startAsync}) are not buffered: map the
 * filter to synchronous handlers of JSON or form bodies.
 */
public final class IdempotencyFilter implements Filter {
  /** Marks a response replayed from the store. */
  public static final String REPLAYED_HEADER = "Idempotent-Replayed";

  private static final System.Logger LOG = System.getLogger("dev.backstop.idempotency");

  /**
   * The filter's options: immutable, each {@code withX} returns a copy.
   * Defaults: the key in {@code Idempotency-Key}, one scope, POST and PATCH,
   * Content-Type and Location stored, 503 when the store is down (not fail
   * open), request bodies up to 1 MiB, the policy's retryable statuses (408,
   * 429, 502, 503, 504) release the key instead of being stored.
   */
  public static final class Options {
    final String header;
    final Function<HttpServletRequest, String> scope;
    final Set<String> methods;
    final List<String> stored;
    final boolean failOpen;
    final int maxRequestBody;
    final IntPredicate release;

    private Options(String header, Function<HttpServletRequest, String> scope, Set<String> methods, List<String> stored,
        boolean failOpen, int maxRequestBody, IntPredicate release) {
      this.header = header;
      this.scope = scope;
      this.methods = methods;
      this.stored = stored;
      this.failOpen = failOpen;
      this.maxRequestBody = maxRequestBody;
      this.release = release;
    }

    public static Options defaults() {
      return new Options("Idempotency-Key", r -> "", Set.of("POST", "PATCH"), List.of("Content-Type", "Location"), false,
          1 << 20, IdempotencyFilter::defaultRelease);
    }

    /** The request header that carries the key. */
    public Options withKeyHeader(String name) {
      if (name == null || name.isEmpty()) throw new IllegalArgumentException("idempotency: key header must be non-empty");
      return new Options(name, scope, methods, stored, failOpen, maxRequestBody, release);
    }

    /** The scope of keys (per user, per route...): two requests share a record only when scope and key are equal. */
    public Options withScope(Function<HttpServletRequest, String> scope) {
      return new Options(header, Objects.requireNonNull(scope, "scope"), methods, stored, failOpen, maxRequestBody, release);
    }

    /** The methods the filter handles; others pass through. */
    public Options withMethods(String... methods) {
      return new Options(header, scope, Set.of(methods), stored, failOpen, maxRequestBody, release);
    }

    /** The response headers kept for a replay. */
    public Options withStoredHeaders(String... names) {
      return new Options(header, scope, methods, List.of(names), failOpen, maxRequestBody, release);
    }

    /** Runs the handler without the store when it cannot be reached (default false: 503 and Retry-After). */
    public Options withFailOpen(boolean open) {
      return new Options(header, scope, methods, stored, open, maxRequestBody, release);
    }

    /** The largest request body read to fingerprint a request; a larger one gets 413. */
    public Options withMaxRequestBody(int n) {
      if (n < 0) throw new IllegalArgumentException("idempotency: max request body must not be negative (got " + n + ")");
      return new Options(header, scope, methods, stored, failOpen, n, release);
    }

    /** Which response statuses release the key (a retry may run again) instead of being stored. */
    public Options withRelease(IntPredicate release) {
      return new Options(header, scope, methods, stored, failOpen, maxRequestBody, Objects.requireNonNull(release, "release"));
    }
  }

  private final IdempotencyBackend store;
  private final Options o;
  // The background retries of store calls that failed after a handler ran;
  // destroy() lets those pending finish (each ends with its key's lease).
  private final IdempotencySettle settle = new IdempotencySettle();

  private IdempotencyFilter(IdempotencyBackend store, Options o) {
    this.store = store;
    this.o = o;
  }

  /** Stops the retry thread once the retries pending have ended. */
  @Override
  public void destroy() {
    settle.close();
  }

  /** The filter over store: an {@link IdempotencyStore} (Redis) or a {@link PgIdempotencyStore} (PostgreSQL). */
  public static IdempotencyFilter create(IdempotencyBackend store, Options options) {
    return new IdempotencyFilter(Objects.requireNonNull(store, "store"), Objects.requireNonNull(options, "options"));
  }

  /** Whether status is one the policy retries by default: such a response releases the key. */
  public static boolean defaultRelease(int status) {
    return status == 408 || status == 429 || status == 502 || status == 503 || status == 504;
  }

  @Override
  public void doFilter(ServletRequest request, ServletResponse response, FilterChain chain) throws IOException, ServletException {
    if (!(request instanceof HttpServletRequest) || !(response instanceof HttpServletResponse)) {
      chain.doFilter(request, response);
      return;
    }
    HttpServletRequest req = (HttpServletRequest) request;
    HttpServletResponse res = (HttpServletResponse) response;
    String key = req.getHeader(o.header);
    if (key == null || !o.methods.contains(req.getMethod())) {
      chain.doFilter(request, response);
      return;
    }
    String bad = IdempotencyRules.checkKey(key);
    if (bad != null) {
      error(res, HttpServletResponse.SC_BAD_REQUEST, o.header + ": " + bad);
      return;
    }
    byte[] body;
    try {
      body = req.getInputStream().readNBytes(o.maxRequestBody + 1);
    } catch (IOException e) {
      error(res, HttpServletResponse.SC_BAD_REQUEST, "idempotency: reading the request body: " + e.getMessage());
      return;
    }
    if (body.length > o.maxRequestBody) {
      error(res, 413, "idempotency: request body over " + o.maxRequestBody + " bytes");
      return;
    }
    HttpServletRequest again = new Replayable(req, body);
    String scope = o.scope.apply(again);
    long until = System.nanoTime() + store.lease().toNanos(); // the lease runs from about here
    IdempotencyStore.Claim c;
    try {
      c = store.begin(scope, key, IdempotencyRules.requestHash(req.getMethod(), req.getRequestURI(), body));
    } catch (RuntimeException e) {
      LOG.log(System.Logger.Level.WARNING, "idempotency: begin " + key + " failed: " + e);
      if (o.failOpen) {
        chain.doFilter(again, response);
        return;
      }
      res.setHeader("Retry-After", "1");
      error(res, HttpServletResponse.SC_SERVICE_UNAVAILABLE, "idempotency store unavailable");
      return;
    }
    switch (c.state()) {
      case CONFLICT:
        store.countRequest("conflict");
        error(res, 422, o.header + " was used with a different request");
        return;
      case IN_PROGRESS:
        store.countRequest("in_progress");
        res.setHeader("Retry-After", Long.toString(c.retryAfterSeconds()));
        error(res, HttpServletResponse.SC_CONFLICT, "a request with this " + o.header + " is in progress");
        return;
      case COMPLETED:
        replay(res, c.response());
        return;
      default:
    }
    store.countRequest("first_run");
    // Whatever happens from here (a handler that throws, a client that
    // left, a store that fails), the record is completed or released.
    Recorder rec = new Recorder(res);
    boolean done = false;
    try {
      chain.doFilter(again, rec);
      done = true;
    } finally {
      if (!done) settle.later("fail", key, until, () -> store.fail(scope, key, c.token()));
    }
    rec.flushWriter();
    if (o.release.test(rec.status)) {
      settle.later("fail", key, until, () -> store.fail(scope, key, c.token()));
    } else {
      Map<String, List<String>> h = new LinkedHashMap<>();
      for (String name : o.stored) {
        List<String> v = headerValues(res, name);
        if (!v.isEmpty()) h.put(canonical(name), v);
      }
      IdempotencyStore.Response stored = new IdempotencyStore.Response(rec.status, h, rec.body.toByteArray(), false, false);
      settle.later("complete", key, until, () -> store.complete(scope, key, c.token(), stored));
    }
    rec.writeThrough();
  }

  private static List<String> headerValues(HttpServletResponse res, String name) {
    if (name.equalsIgnoreCase("Content-Type")) {
      String ct = res.getContentType();
      return ct == null ? List.of() : List.of(ct);
    }
    Collection<String> v = res.getHeaders(name);
    return v == null ? List.of() : new ArrayList<>(v);
  }

  /** A header name as Go canonicalises it: each dash-separated word capitalised. */
  static String canonical(String name) {
    StringBuilder b = new StringBuilder(name.length());
    boolean upper = true;
    for (char ch : name.toCharArray()) {
      b.append(upper ? Character.toUpperCase(ch) : Character.toLowerCase(ch));
      upper = ch == '-';
    }
    return b.toString();
  }

  private void replay(HttpServletResponse res, IdempotencyStore.Response r) throws IOException {
    res.setHeader(REPLAYED_HEADER, "true");
    store.countRequest(r.tooLarge() ? "too_large" : "replayed");
    if (r.tooLarge()) {
      error(res, 500, "idempotency: the first response to this key was too large to store; it cannot be replayed");
      return;
    }
    for (Map.Entry<String, List<String>> e : r.headers().entrySet()) {
      for (String v : e.getValue()) {
        try { // the rule made it safe; a container that still refuses it skips it, never a crash
          if (e.getKey().equalsIgnoreCase("Content-Type")) res.setContentType(v);
          else res.addHeader(e.getKey(), v);
        } catch (RuntimeException x) {
          LOG.log(System.Logger.Level.WARNING, "idempotency: stored header not replayed: " + e.getKey() + ": " + x);
        }
      }
    }
    res.setStatus(r.status());
    res.setContentLength(r.body().length);
    res.getOutputStream().write(r.body());
  }

  private static void error(HttpServletResponse res, int status, String message) throws IOException {
    byte[] b = (message + "\n").getBytes(StandardCharsets.UTF_8);
    res.setStatus(status);
    res.setContentType("text/plain; charset=utf-8");
    res.setHeader("X-Content-Type-Options", "nosniff");
    res.setContentLength(b.length);
    res.getOutputStream().write(b);
  }

  /**
   * The request with its body read once and given again to the handler: as
   * a stream, a reader, and for a form (application/x-www-form-urlencoded)
   * as parameters, which the container can no longer parse from the body.
   */
  private static final class Replayable extends HttpServletRequestWrapper {
    private final byte[] body;
    private Map<String, String[]> form;

    Replayable(HttpServletRequest r, byte[] body) {
      super(r);
      this.body = body;
    }

    private boolean isForm() {
      String ct = getContentType();
      return ct != null && ct.toLowerCase(Locale.ROOT).startsWith("application/x-www-form-urlencoded");
    }

    private Map<String, String[]> form() {
      if (form == null) {
        String enc = getCharacterEncoding();
        Charset cs = enc == null ? StandardCharsets.UTF_8 : Charset.forName(enc);
        Map<String, List<String>> m = new LinkedHashMap<>();
        for (String part : new String[] {getQueryString(), new String(body, cs)}) {
          if (part == null || part.isEmpty()) continue;
          for (String pair : part.split("&")) {
            if (pair.isEmpty()) continue;
            int eq = pair.indexOf('=');
            String name = java.net.URLDecoder.decode(eq < 0 ? pair : pair.substring(0, eq), cs);
            String value = eq < 0 ? "" : java.net.URLDecoder.decode(pair.substring(eq + 1), cs);
            m.computeIfAbsent(name, k -> new ArrayList<>()).add(value);
          }
        }
        Map<String, String[]> out = new LinkedHashMap<>();
        m.forEach((k, v) -> out.put(k, v.toArray(new String[0])));
        form = java.util.Collections.unmodifiableMap(out);
      }
      return form;
    }

    @Override
    public String getParameter(String name) {
      if (!isForm()) return super.getParameter(name);
      String[] v = form().get(name);
      return v == null ? null : v[0];
    }

    @Override
    public Map<String, String[]> getParameterMap() {
      return isForm() ? form() : super.getParameterMap();
    }

    @Override
    public java.util.Enumeration<String> getParameterNames() {
      return isForm() ? java.util.Collections.enumeration(form().keySet()) : super.getParameterNames();
    }

    @Override
    public String[] getParameterValues(String name) {
      return isForm() ? form().get(name) : super.getParameterValues(name);
    }

    @Override
    public ServletInputStream getInputStream() {
      ByteArrayInputStream in = new ByteArrayInputStream(body);
      return new ServletInputStream() {
        @Override
        public int read() {
          return in.read();
        }

        @Override
        public int read(byte[] b, int off, int len) {
          return in.read(b, off, len);
        }

        @Override
        public boolean isFinished() {
          return in.available() == 0;
        }

        @Override
        public boolean isReady() {
          return true;
        }

        @Override
        public void setReadListener(ReadListener l) {
          throw new IllegalStateException("idempotency: the request body was read already; no async reads");
        }
      };
    }

    @Override
    public BufferedReader getReader() {
      String enc = getCharacterEncoding();
      Charset cs = enc == null ? StandardCharsets.ISO_8859_1 : Charset.forName(enc);
      return new BufferedReader(new InputStreamReader(new ByteArrayInputStream(body), cs));
    }
  }

  /**
   * Holds the handler's status and body until the store has them. Headers go
   * to the real response (nothing is committed before writeThrough).
   */
  private static final class Recorder extends HttpServletResponseWrapper {
    int status = 200;
    final ByteArrayOutputStream body = new ByteArrayOutputStream();
    private PrintWriter writer;
    private ServletOutputStream out;

    Recorder(HttpServletResponse r) {
      super(r);
    }

    @Override
    public void setStatus(int sc) {
      status = sc;
    }

    @Override
    public int getStatus() {
      return status;
    }

    @Override
    public void sendError(int sc, String msg) {
      status = sc;
      body.reset();
      if (msg != null) body.writeBytes(msg.getBytes(StandardCharsets.UTF_8));
    }

    @Override
    public void sendError(int sc) {
      sendError(sc, null);
    }

    @Override
    public void sendRedirect(String location) {
      status = 302;
      setHeader("Location", location);
    }

    @Override
    public void flushBuffer() {
      // held: the real response is written once the store has it
    }

    @Override
    public boolean isCommitted() {
      return false;
    }

    @Override
    public void resetBuffer() {
      body.reset();
    }

    @Override
    public void reset() {
      super.reset();
      status = 200;
      body.reset();
    }

    @Override
    public void setContentLength(int len) {
      // written from what the handler wrote
    }

    @Override
    public void setContentLengthLong(long len) {}

    @Override
    public ServletOutputStream getOutputStream() {
      if (writer != null) throw new IllegalStateException("getWriter() was called on this response");
      if (out == null) {
        out = new ServletOutputStream() {
          @Override
          public void write(int b) {
            body.write(b);
          }

          @Override
          public void write(byte[] b, int off, int len) {
            body.write(b, off, len);
          }

          @Override
          public boolean isReady() {
            return true;
          }

          @Override
          public void setWriteListener(WriteListener l) {
            throw new IllegalStateException("idempotency: the response is held until stored; no async writes");
          }
        };
      }
      return out;
    }

    @Override
    public PrintWriter getWriter() {
      if (out != null) throw new IllegalStateException("getOutputStream() was called on this response");
      if (writer == null) {
        String enc = getCharacterEncoding();
        Charset cs = enc == null ? StandardCharsets.ISO_8859_1 : Charset.forName(enc.toLowerCase(Locale.ROOT));
        // As the container's own getWriter does: the charset becomes part of the Content-Type.
        if (enc != null) setCharacterEncoding(enc);
        writer = new PrintWriter(new OutputStreamWriter(body, cs));
      }
      return writer;
    }

    void flushWriter() {
      if (writer != null) writer.flush();
    }

    void writeThrough() throws IOException {
      HttpServletResponse r = (HttpServletResponse) getResponse();
      r.setStatus(status);
      r.setContentLength(body.size());
      r.getOutputStream().write(body.toByteArray());
    }
  }
}
