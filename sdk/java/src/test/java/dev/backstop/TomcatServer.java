package dev.backstop;

import jakarta.servlet.Filter;
import jakarta.servlet.http.HttpServlet;
import java.nio.file.Files;
import org.apache.catalina.Context;
import org.apache.catalina.LifecycleException;
import org.apache.catalina.startup.Tomcat;
import org.apache.tomcat.util.descriptor.web.FilterDef;
import org.apache.tomcat.util.descriptor.web.FilterMap;

/** An embedded Tomcat (Servlet 6.1) on a free loopback port: one servlet on /*, behind one filter. */
final class TomcatServer implements AutoCloseable {
  private final Tomcat tomcat;
  final String base;

  TomcatServer(Filter filter, HttpServlet servlet) throws Exception {
    tomcat = new Tomcat();
    tomcat.setBaseDir(Files.createTempDirectory("backstop-tomcat").toString());
    tomcat.setHostname("127.0.0.1");
    tomcat.setPort(0);
    Context ctx = tomcat.addContext("", null);
    Tomcat.addServlet(ctx, "app", servlet);
    ctx.addServletMappingDecoded("/*", "app");
    FilterDef fd = new FilterDef();
    fd.setFilterName("filter");
    fd.setFilter(filter);
    ctx.addFilterDef(fd);
    FilterMap fm = new FilterMap();
    fm.setFilterName("filter");
    fm.addURLPattern("/*");
    ctx.addFilterMap(fm);
    tomcat.getConnector().setProperty("address", "127.0.0.1");
    tomcat.start();
    base = "http://127.0.0.1:" + tomcat.getConnector().getLocalPort();
  }

  @Override
  public void close() throws LifecycleException {
    tomcat.stop();
    tomcat.destroy();
  }
}
