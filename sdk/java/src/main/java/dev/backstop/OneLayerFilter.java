package dev.backstop;

import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletOutputStream;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.WriteListener;
import jakarta.servlet.http.HttpServletResponse;
import jakarta.servlet.http.HttpServletResponseWrapper;
import java.io.IOException;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Objects;

/**
 * Retry at one layer for servlets and Spring MVC (docs/layers.md), as Go's
 * {@code retry.Middleware}, Node's {@code oneLayer} and Python's
 * {@code OneLayerWSGI}: a {@code jakarta.servlet} Filter over the policies
 * the service calls its dependencies with.
 *
 * <ul>
 *   <li>While the breaker of any of them is open, a request is answered at
 *       once with 503, {@code Backstop-No-Retry: circuit_open} and
 *       {@code X-Envoy-Overloaded: true}; the handler is not run.
 *   <li>When a retry loop ({@link Backstop#retry}) inside the request gave up,
 *       a failed response (status 400 or more) gets
 *       {@code Backstop-No-Retry: <the loop's reason>}, unless the handler set
 *       it, so the caller's loop stops instead of retrying the same failure.
 * </ul>
 *
 * <pre>{@code
 * servletContext.addFilter("one-layer", OneLayerFilter.create(paymentsPolicy))
 *     .addMappingForUrlPatterns(null, false, "/*");
 * }</pre>
 *
 * <p>An empty retry budget sheds nothing: a budget limits retries, never
 * first calls. The loops find the request through a thread-local the filter
 * sets while the chain runs on its thread (and the attempt threads of an
 * attempt_timeout): a loop on a thread of the handler's own (an executor,
 * {@code startAsync}) is not seen. The header is added before the response
 * is committed (a flush, a write, {@code sendError}, the end of the chain);
 * a response committed before the loop gave up cannot get it, as in Go and
 * Node. jakarta.servlet-api is a provided dependency: the container brings
 * it.
 */
public final class OneLayerFilter implements Filter {
  private static final byte[] SHED_BODY =
      "circuit breaker open: not retried here; do not retry\n".getBytes(StandardCharsets.UTF_8);

  private final List<Policy> policies;

  private OneLayerFilter(List<Policy> policies) {
    this.policies = List.copyOf(policies);
  }

  /** A filter over policies: those the service calls its dependencies with (none: it only marks failed responses). */
  public static OneLayerFilter create(Policy... policies) {
    return create(List.of(policies));
  }

  /** A filter over policies. */
  public static OneLayerFilter create(List<Policy> policies) {
    Objects.requireNonNull(policies, "policies");
    return new OneLayerFilter(policies);
  }

  @Override
  public void doFilter(ServletRequest req, ServletResponse res, FilterChain chain)
      throws IOException, ServletException {
    if (!(res instanceof HttpServletResponse)) {
      chain.doFilter(req, res);
      return;
    }
    HttpServletResponse response = (HttpServletResponse) res;
    if (anyOpen()) {
      response.setStatus(HttpServletResponse.SC_SERVICE_UNAVAILABLE);
      response.setHeader(Layers.NO_RETRY, Decision.Reason.CIRCUIT_OPEN.toString());
      response.setHeader(Layers.OVERLOADED, "true");
      response.setContentType("text/plain;charset=utf-8");
      response.setContentLength(SHED_BODY.length);
      response.getOutputStream().write(SHED_BODY);
      return;
    }
    Layers.GaveUp gaveUp = new Layers.GaveUp();
    Marking marking = new Marking(response, gaveUp);
    Layers.GaveUp outer = Layers.enter(gaveUp);
    try {
      chain.doFilter(req, marking);
    } catch (IOException | ServletException | RuntimeException e) {
      // The container answers 500 for it: a failure too.
      marking.mark(HttpServletResponse.SC_INTERNAL_SERVER_ERROR);
      throw e;
    } finally {
      Layers.leave(outer);
    }
    marking.mark(response.getStatus());
  }

  // Whether the breaker of any policy is open. A policy without one is
  // never open; one that cannot answer (closed) does not shed, as in Go.
  private boolean anyOpen() {
    long now = System.currentTimeMillis();
    for (Policy p : policies) {
      try {
        if (p.isStateful() && p.circuitState(now) == CircuitState.OPEN) return true;
      } catch (RuntimeException e) {
        // not an open breaker
      }
    }
    return false;
  }

  /** The response, marked with the reason of the request's last loop that gave up before it commits. */
  private static final class Marking extends HttpServletResponseWrapper {
    private final HttpServletResponse response;
    private final Layers.GaveUp gaveUp;
    private ServletOutputStream out;
    private PrintWriter writer;

    Marking(HttpServletResponse response, Layers.GaveUp gaveUp) {
      super(response);
      this.response = response;
      this.gaveUp = gaveUp;
    }

    void mark(int status) {
      String reason = gaveUp.reason();
      if (reason != null && status >= 400 && !response.isCommitted() && !response.containsHeader(Layers.NO_RETRY)) {
        response.setHeader(Layers.NO_RETRY, reason);
      }
    }

    void mark() {
      if (gaveUp.reason() != null) mark(response.getStatus());
    }

    @Override
    public void sendError(int sc, String msg) throws IOException {
      mark(sc);
      super.sendError(sc, msg);
    }

    @Override
    public void sendError(int sc) throws IOException {
      mark(sc);
      super.sendError(sc);
    }

    @Override
    public void flushBuffer() throws IOException {
      mark();
      super.flushBuffer();
    }

    @Override
    public ServletOutputStream getOutputStream() throws IOException {
      ServletOutputStream s = super.getOutputStream();
      if (out == null) out = new MarkingStream(s, this);
      return out;
    }

    @Override
    public PrintWriter getWriter() throws IOException {
      PrintWriter w = super.getWriter();
      if (writer == null) writer = new MarkingWriter(w, this);
      return writer;
    }
  }

  // A write may commit the response (its buffer full): mark before each.
  private static final class MarkingStream extends ServletOutputStream {
    private final ServletOutputStream s;
    private final Marking m;

    MarkingStream(ServletOutputStream s, Marking m) {
      this.s = s;
      this.m = m;
    }

    @Override
    public boolean isReady() {
      return s.isReady();
    }

    @Override
    public void setWriteListener(WriteListener l) {
      s.setWriteListener(l);
    }

    @Override
    public void write(int b) throws IOException {
      m.mark();
      s.write(b);
    }

    @Override
    public void write(byte[] b, int off, int len) throws IOException {
      m.mark();
      s.write(b, off, len);
    }

    @Override
    public void flush() throws IOException {
      m.mark();
      s.flush();
    }

    @Override
    public void close() throws IOException {
      m.mark();
      s.close();
    }
  }

  private static final class MarkingWriter extends PrintWriter {
    private final PrintWriter w;
    private final Marking m;

    MarkingWriter(PrintWriter w, Marking m) {
      super(w);
      this.w = w;
      this.m = m;
    }

    @Override
    public void write(int c) {
      m.mark();
      super.write(c);
    }

    @Override
    public void write(char[] buf, int off, int len) {
      m.mark();
      super.write(buf, off, len);
    }

    @Override
    public void write(String s, int off, int len) {
      m.mark();
      super.write(s, off, len);
    }

    @Override
    public void flush() {
      m.mark();
      super.flush();
    }

    @Override
    public void close() {
      m.mark();
      super.close();
    }

    @Override
    public boolean checkError() {
      return super.checkError() || w.checkError();
    }
  }
}
