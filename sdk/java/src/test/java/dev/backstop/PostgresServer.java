package dev.backstop;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.GroupPrincipal;
import java.nio.file.attribute.PosixFileAttributeView;
import java.nio.file.attribute.UserPrincipalLookupService;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Stream;
import javax.sql.DataSource;
import org.postgresql.ds.PGSimpleDataSource;

/**
 * A private PostgreSQL server for the tests, as Go's internal/testing/pgtest
 * and Node's test-support/postgres-server.js start one: initdb into a fresh
 * temporary directory, then postgres (the Debian package postgresql, the
 * newest /usr/lib/postgresql/<major>/bin) on a free 127.0.0.1 port with its
 * socket in that directory; never the system service. PostgreSQL refuses to
 * run as root: as root the server runs as the package's system user postgres
 * (through setpriv). A missing postgres fails the tests loudly; they never
 * skip. Clients connect over TCP with {@link #SUPERUSER} and {@link #PASSWORD}
 * (scram-sha-256).
 */
final class PostgresServer implements AutoCloseable {
  static final String SUPERUSER = "backstop";
  static final String PASSWORD = "pgtest-s3cret-password";

  private static PostgresServer shared;
  private static final AtomicInteger DATABASES = new AtomicInteger();

  final int port;
  private final Path dir;
  private Process proc;

  /** The server the test JVM shares, started on first use (a server takes seconds, a database milliseconds). */
  static synchronized PostgresServer get() throws Exception {
    if (shared == null) {
      shared = new PostgresServer();
      PostgresServer s = shared;
      Runtime.getRuntime().addShutdownHook(new Thread(s::close));
    }
    return shared;
  }

  static Path bin() {
    Path root = Path.of("/usr/lib/postgresql");
    List<Path> majors = new ArrayList<>();
    if (Files.isDirectory(root)) {
      try (Stream<Path> s = Files.list(root)) {
        s.filter(p -> Files.isExecutable(p.resolve("bin/postgres"))).forEach(majors::add);
      } catch (IOException e) {
        throw new AssertionError("listing " + root, e);
      }
    }
    if (majors.isEmpty()) {
      throw new AssertionError("postgres not found in /usr/lib/postgresql/*/bin: the PostgreSQL tests need a real server;"
          + " run `make deps`, which installs the Debian package postgresql");
    }
    majors.sort(Comparator.comparingInt(p -> {
      try {
        return Integer.parseInt(p.getFileName().toString());
      } catch (NumberFormatException e) {
        return -1;
      }
    }));
    return majors.get(majors.size() - 1).resolve("bin");
  }

  /** A server of its own (close it to stop it and remove its directory). */
  PostgresServer() throws Exception {
    Path b = bin();
    dir = Files.createTempDirectory("backstop-java-pg");
    boolean root = "root".equals(System.getProperty("user.name"));
    List<String> as = new ArrayList<>();
    if (root) {
      UserPrincipalLookupService users = dir.getFileSystem().getUserPrincipalLookupService();
      PosixFileAttributeView view = Files.getFileAttributeView(dir, PosixFileAttributeView.class);
      try {
        view.setOwner(users.lookupPrincipalByName("postgres"));
        GroupPrincipal g = users.lookupPrincipalByGroupName("postgres");
        view.setGroup(g);
      } catch (IOException e) {
        throw new AssertionError("running as root and there is no system user postgres (the Debian package postgresql creates it)", e);
      }
      as.addAll(List.of("setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"));
    }
    try {
      Path pw = dir.resolve("pwfile");
      Files.writeString(pw, PASSWORD + "\n");
      if (root) Files.setOwner(pw, Files.getOwner(dir));
      List<String> init = new ArrayList<>(as);
      init.addAll(List.of(b.resolve("initdb").toString(), "-D", dir.resolve("data").toString(), "-U", SUPERUSER, "--pwfile",
          pw.toString(), "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync"));
      Process p = command(init).redirectOutput(dir.resolve("initdb.log").toFile()).start();
      if (!p.waitFor(120, TimeUnit.SECONDS) || p.exitValue() != 0) {
        p.destroyForcibly();
        throw new AssertionError("initdb failed: " + Files.readString(dir.resolve("initdb.log")));
      }
      Files.delete(pw);
      port = RabbitServer.freePort();
      // Through sh, which stops the server (a fast shutdown, SIGINT) when its
      // stdin closes: when close() closes it, and when this JVM dies.
      List<String> run = new ArrayList<>(List.of("sh", "-c",
          "exec 3<&0; \"$0\" \"$@\" </dev/null & pid=$!; (read _ <&3; kill -INT $pid 2>/dev/null) & wait $pid"));
      run.addAll(as.isEmpty() ? List.of(b.resolve("postgres").toString()) : as);
      if (!as.isEmpty()) run.add(b.resolve("postgres").toString());
      run.addAll(List.of("-D", dir.resolve("data").toString(), "-k", dir.toString(), "-h", "127.0.0.1", "-p",
          Integer.toString(port), "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"));
      proc = command(run).redirectOutput(dir.resolve("postgres.log").toFile()).redirectInput(ProcessBuilder.Redirect.PIPE).start();
    } catch (IOException | AssertionError | InterruptedException e) {
      close();
      throw e;
    }
    long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    SQLException last = null;
    while (System.nanoTime() < until && proc.isAlive()) {
      try (Connection c = DriverManager.getConnection(jdbcUrl("postgres"), SUPERUSER, PASSWORD)) {
        return;
      } catch (SQLException e) {
        last = e;
        proc.waitFor(50, TimeUnit.MILLISECONDS); // the server starting (bounded polling)
      }
    }
    String log = Files.readString(dir.resolve("postgres.log"));
    close();
    throw new AssertionError("postgres on 127.0.0.1:" + port + " did not answer: " + last + "\n" + log);
  }

  private ProcessBuilder command(List<String> args) {
    ProcessBuilder pb = new ProcessBuilder(args).directory(dir.toFile()).redirectErrorStream(true);
    pb.environment().clear();
    pb.environment().put("LC_ALL", "C");
    pb.environment().put("PATH", "/usr/bin:/bin:/usr/sbin:/sbin");
    return pb;
  }

  /** A JDBC URL of database db, without credentials. */
  String jdbcUrl(String db) {
    return "jdbc:postgresql://127.0.0.1:" + port + "/" + db + "?sslmode=disable";
  }

  /** A JDBC URL of database db with the superuser's password in it: a secret, as a production DSN is. */
  String secretUrl(String db) {
    return jdbcUrl(db) + "&user=" + SUPERUSER + "&password=" + PASSWORD;
  }

  /** The name of a fresh database (its own tables) on this server. */
  String database() throws SQLException {
    String name = "test_" + DATABASES.incrementAndGet();
    try (Connection c = DriverManager.getConnection(jdbcUrl("postgres"), SUPERUSER, PASSWORD); Statement st = c.createStatement()) {
      st.execute("CREATE DATABASE " + name);
    }
    return name;
  }

  /** A DataSource on database db (a connection per getConnection: the driver's own, no pool). */
  DataSource dataSource(String db) {
    PGSimpleDataSource ds = new PGSimpleDataSource();
    ds.setUrl(jdbcUrl(db));
    ds.setUser(SUPERUSER);
    ds.setPassword(PASSWORD);
    return ds;
  }

  /** Stops the server (a fast shutdown) and removes its directory; idempotent. */
  @Override
  public synchronized void close() {
    if (proc != null) {
      try {
        proc.getOutputStream().close();
        if (!proc.waitFor(10, TimeUnit.SECONDS)) {
          proc.destroyForcibly();
          proc.waitFor(10, TimeUnit.SECONDS);
        }
      } catch (IOException e) {
        proc.destroyForcibly();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      proc = null;
    }
    try (Stream<Path> s = Files.walk(dir)) {
      s.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
    } catch (IOException e) {
      // already gone
    }
  }

  @Override
  public String toString() {
    return "postgres on 127.0.0.1:" + port; // never the password
  }
}
