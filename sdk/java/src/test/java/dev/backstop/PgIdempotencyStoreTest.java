package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.prometheus.metrics.model.registry.PrometheusRegistry;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import javax.sql.DataSource;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.postgresql.ds.PGSimpleDataSource;

/**
 * PgIdempotencyStore against a real PostgreSQL server: onceTx as Go's OnceTx
 * (idempotency/pgstore/pgstore_test.go) and Node's onceTx, the password never
 * shown, the DDL the docs show. The shared cases are PgIdempotencyCasesTest's,
 * the filter over it PgIdempotencyFilterTest's.
 */
class PgIdempotencyStoreTest {
  DataSource db;
  PrometheusRegistry reg;
  PgIdempotencyStore store;
  final AtomicInteger runs = new AtomicInteger();

  @BeforeEach
  void start() throws Exception {
    PostgresServer pg = PostgresServer.get();
    db = pg.dataSource(pg.database());
    reg = new PrometheusRegistry();
    store = PgIdempotencyStore.create(db, IdempotencyStore.Options.defaults().withMetrics(reg));
    store.createTable();
    try (Connection c = db.getConnection(); Statement st = c.createStatement()) {
      st.execute("CREATE TABLE charges (id serial PRIMARY KEY, order_id text NOT NULL, cents int NOT NULL)");
    }
  }

  int charges() throws SQLException {
    try (Connection c = db.getConnection(); Statement st = c.createStatement(); ResultSet rs = st.executeQuery("SELECT count(*) FROM charges")) {
      rs.next();
      return rs.getInt(1);
    }
  }

  byte[] charge(Connection tx) throws SQLException {
    runs.incrementAndGet();
    try (PreparedStatement st = tx.prepareStatement("INSERT INTO charges (order_id, cents) VALUES ('o1', 500)")) {
      st.executeUpdate();
    }
    return "charged".getBytes(StandardCharsets.UTF_8);
  }

  interface InTx {
    byte[] run(Connection tx) throws SQLException;
  }

  /** Runs f in a transaction of its own and commits it (rolls back when f throws). */
  byte[] inTx(InTx f) throws SQLException {
    try (Connection c = db.getConnection()) {
      c.setAutoCommit(false);
      try {
        byte[] out = f.run(c);
        c.commit();
        return out;
      } catch (SQLException | RuntimeException e) {
        c.rollback();
        throw e;
      }
    }
  }

  // The charge and its record commit together: a redelivered job replays the
  // result without a second charge; a rolled-back transaction leaves neither,
  // so the job runs again.
  @Test
  void onceTxCommitsTheWriteAndTheRecordTogether() throws Exception {
    for (int i = 1; i <= 2; i++) {
      byte[] out = inTx(tx -> store.onceTx(tx, "jobs", "j1", "j1", this::charge));
      assertEquals("charged", new String(out, StandardCharsets.UTF_8), "delivery " + i);
      assertEquals(1, runs.get(), "delivery " + i + ": runs");
      assertEquals(1, charges(), "delivery " + i + ": charges");
    }
    // The caller rolls back after onceTx succeeded: neither the charge nor the record stays.
    try (Connection c = db.getConnection()) {
      c.setAutoCommit(false);
      store.onceTx(c, "jobs", "j2", "j2", this::charge);
      c.rollback();
    }
    assertEquals(2, runs.get());
    assertEquals(1, charges(), "rolled back");
    // fn fails: its savepoint is rolled back, so even a caller that commits
    // anyway keeps neither its writes nor a record, and its transaction works.
    SQLException boom = new SQLException("card declined");
    inTx(tx -> {
      SQLException got = assertThrows(SQLException.class, () -> store.onceTx(tx, "jobs", "j2", "j2", t -> {
        charge(t);
        throw boom;
      }));
      assertSame(boom, got);
      try (Statement st = tx.createStatement()) {
        st.execute("INSERT INTO charges (order_id, cents) VALUES ('after', 1)"); // the caller's transaction is usable
      }
      return null; // commit
    });
    assertEquals(2, charges(), "the failed fn's charge is gone, the caller's own write stays");
    inTx(tx -> store.onceTx(tx, "jobs", "j2", "j2", this::charge));
    assertEquals(3, charges(), "after a rollback and a failure, the job runs");
    // Another request under j1.
    assertThrows(IdempotencyStore.ConflictException.class, () -> inTx(tx -> store.onceTx(tx, "jobs", "j1", "j1-other", this::charge)));
    // Without a transaction of the caller's there is nothing to join.
    try (Connection c = db.getConnection()) {
      assertThrows(IllegalStateException.class, () -> store.onceTx(c, "jobs", "j9", "j9", this::charge));
    }
    MetricsTest.assertExposes(reg, "backstop_idempotency_requests_total{outcome=\"first_run\"} 4.0",
        "backstop_idempotency_requests_total{outcome=\"replayed\"} 1.0",
        "backstop_idempotency_requests_total{outcome=\"conflict\"} 1.0",
        "backstop_idempotency_store_errors_total{operation=\"begin\"} 0.0");
  }

  // While a transaction holds a key, a duplicate (another onceTx, or the
  // filter's begin on its own connection) is answered in progress at once
  // instead of waiting on the row; after the commit it gets the result.
  @Test
  void onceTxDuplicateWhileTheTransactionRuns() throws Exception {
    List<Object> seen = new ArrayList<>();
    inTx(tx -> store.onceTx(tx, "jobs", "j3", "j3", t -> {
      charge(t);
      IdempotencyStore.InProgressException dup = assertThrows(IdempotencyStore.InProgressException.class,
          () -> inTx(tx2 -> store.onceTx(tx2, "jobs", "j3", "j3", x -> {
            throw new AssertionError("the duplicate ran");
          })));
      seen.add(dup.retryAfterSeconds());
      seen.add(store.begin("jobs", "j3", "j3"));
      return "first".getBytes(StandardCharsets.UTF_8);
    }));
    assertEquals(1L, seen.get(0), "the duplicate onceTx's retry after");
    IdempotencyStore.Claim during = (IdempotencyStore.Claim) seen.get(1);
    assertEquals(IdempotencyStore.State.IN_PROGRESS, during.state(), "begin while the transaction runs");
    assertEquals(1, during.retryAfterSeconds());
    IdempotencyStore.Claim after = store.begin("jobs", "j3", "j3");
    assertEquals(IdempotencyStore.State.COMPLETED, after.state());
    assertArrayEquals("first".getBytes(StandardCharsets.UTF_8), after.response().body());
    assertEquals(200, after.response().status());
    assertEquals(1, charges());
  }

  // A second table beside the first, and purge, which deletes only rows past their retention.
  @Test
  void withTableAndPurge() throws Exception {
    PgIdempotencyStore other = store.withTable("other \"idem\"");
    other.createTable();
    assertEquals(IdempotencyStore.State.STARTED, other.begin("s", "k", "r").state());
    assertEquals(IdempotencyStore.State.STARTED, store.begin("s", "k", "r").state(), "the default table is another record");
    assertEquals(0, other.purge(100), "a live record stays");
    try (Connection conn = db.getConnection(); Statement st = conn.createStatement()) {
      st.executeUpdate("UPDATE \"other \"\"idem\"\"\" SET expires_at = clock_timestamp() - interval '1 millisecond'");
    }
    assertEquals(IdempotencyStore.State.STARTED, other.begin("s", "k2", "r").state());
    assertEquals(1, other.purge(100), "the expired record goes");
    assertEquals(0, other.purge(100));
    assertEquals(0, store.purge(100), "the default table's live record stays");
    assertEquals(IdempotencyStore.State.IN_PROGRESS, other.begin("s", "k2", "r").state(), "k2 was not purged");
    assertEquals(IdempotencyStore.State.STARTED, other.begin("s", "k", "r").state(), "k was");
  }

  @Test
  void badArgumentsAreRefusedBeforeTheDatabase() {
    assertThrows(IllegalArgumentException.class, () -> store.begin("s", "", "r"));
    assertThrows(IllegalArgumentException.class, () -> store.begin("s", "k\n", "r"));
    assertThrows(IllegalArgumentException.class, () -> store.begin("s", "k", "a b"));
    assertThrows(IllegalArgumentException.class, () -> store.complete("s", "k", "", new IdempotencyStore.Response(200, null, null, false, false)));
    IdempotencyStore.Claim c = store.begin("s", "k", "r");
    assertThrows(IllegalArgumentException.class, () -> store.complete("s", "k", c.token(), new IdempotencyStore.Response(99, null, null, false, false)));
    assertThrows(IllegalArgumentException.class, () -> store.withTable(""));
  }

  // The store and the filter over it need neither lettuce-core nor the
  // Prometheus client (optional dependencies, the Redis store's): Probe, in a
  // class loader that has only this package (and its tests), the driver and
  // the servlet API, uses them as an application does.
  @Test
  void worksWithoutLettuceOnTheClassPath() throws Exception {
    URL[] urls = {PgIdempotencyStore.class.getProtectionDomain().getCodeSource().getLocation(),
        Probe.class.getProtectionDomain().getCodeSource().getLocation(),
        org.postgresql.Driver.class.getProtectionDomain().getCodeSource().getLocation(),
        jakarta.servlet.Filter.class.getProtectionDomain().getCodeSource().getLocation()};
    try (URLClassLoader l = new URLClassLoader(urls, ClassLoader.getPlatformClassLoader())) {
      assertThrows(ClassNotFoundException.class, () -> l.loadClass("io.lettuce.core.RedisClient"));
      assertThrows(ClassNotFoundException.class, () -> l.loadClass("io.prometheus.metrics.model.registry.PrometheusRegistry"));
      Class<?> probe = l.loadClass(Probe.class.getName());
      assertTrue(probe != Probe.class, "the probe was loaded from the test's class path");
      assertEquals("started completed conflict", probe.getMethod("run", DataSource.class).invoke(null, db));
    }
  }

  // A table an older schema() made (no claim function): begin says to run
  // the DDL again, and running it keeps the table's rows.
  @Test
  void schemaAgainUpgradesAnOlderTable() throws Exception {
    PgIdempotencyStore old = store.withTable("idem_old");
    String ddl = PgIdempotencyStore.schema("idem_old");
    try (Connection c = db.getConnection(); Statement st = c.createStatement()) {
      st.execute(ddl.substring(0, ddl.indexOf("CREATE OR REPLACE FUNCTION")));
      st.execute("INSERT INTO idem_old (scope, key, state, request, status, headers, body, expires_at)"
          + " VALUES ('', 'k1', 'completed', 'r1', 201, '{}', 'paid', now() + interval '1 hour')");
    }
    PgIdempotencyStore.StoreException e = assertThrows(PgIdempotencyStore.StoreException.class, () -> old.begin("", "k1", "r1"));
    assertTrue(e.getMessage().contains("run createTable() or schema() again"), e.getMessage());
    old.createTable();
    IdempotencyStore.Claim c = old.begin("", "k1", "r1");
    assertEquals(IdempotencyStore.State.COMPLETED, c.state());
    assertArrayEquals("paid".getBytes(StandardCharsets.UTF_8), c.response().body());
  }

  // once, the worker's side outside a transaction, is the backend's: on
  // PostgreSQL as on Redis (IdempotencyOnceTest), a redelivered job gets its
  // recorded result, another request under the key is a conflict, a failure
  // releases the key.
  @Test
  void onceRunsAJobOnceOnPostgres() throws Exception {
    int[] effects = {0};
    IdempotencyBackend.Effect charge = () -> {
      effects[0]++;
      return "charged".getBytes(StandardCharsets.UTF_8);
    };
    assertArrayEquals("charged".getBytes(StandardCharsets.UTF_8), store.once("jobs", "o1", "o1", charge));
    assertArrayEquals("charged".getBytes(StandardCharsets.UTF_8), store.once("jobs", "o1", "o1", charge));
    assertEquals(1, effects[0]);
    assertThrows(IdempotencyStore.ConflictException.class, () -> store.once("jobs", "o1", "o1-other", charge));
    IllegalStateException boom = new IllegalStateException("upstream timeout");
    assertSame(boom, assertThrows(IllegalStateException.class, () -> store.once("jobs", "o2", "o2", () -> {
      throw boom;
    })));
    store.once("jobs", "o2", "o2", charge);
    assertEquals(2, effects[0], "the failed job runs again");
  }

  /** What an application without Lettuce does: begin, complete, begin again, a filter over the store, once. */
  public static final class Probe {
    public static String run(DataSource db) {
      PgIdempotencyStore s = PgIdempotencyStore.create(db, IdempotencyStore.Options.defaults());
      IdempotencyStore.Claim c = s.begin("s", "no-lettuce", "r");
      s.complete("s", "no-lettuce", c.token(), new IdempotencyStore.Response(201, Map.of("Content-Type", List.of("text/plain")),
          new byte[] {'o', 'k'}, false, false));
      IdempotencyFilter.create(s, IdempotencyFilter.Options.defaults()).destroy();
      String conflict;
      try {
        s.once("s", "no-lettuce", "another", () -> new byte[0]);
        conflict = "ran";
      } catch (IdempotencyStore.ConflictException e) {
        conflict = "conflict";
      } catch (Exception e) {
        conflict = e.toString();
      }
      return c.state() + " " + s.begin("s", "no-lettuce", "r").state() + " " + conflict;
    }
  }

  // The DDL docs/idempotency.md shows is the one the store writes (Go's
  // TestSchemaDocumented compares pgstore.Schema with the same block).
  @Test
  void schemaDocumented() {
    String doc = Repo.read("docs/idempotency.md");
    int at = doc.indexOf("```sql\n");
    assertTrue(at >= 0, "docs/idempotency.md has no ```sql block");
    String block = doc.substring(at + 7, doc.indexOf("```", at + 7));
    assertEquals(block, PgIdempotencyStore.schema(PgIdempotencyStore.DEFAULT_TABLE));
  }

  /** Every record the driver and the filter log while the test runs. */
  static final class Captured extends Handler {
    final StringBuilder text = new StringBuilder();

    @Override
    public synchronized void publish(LogRecord r) {
      text.append(r.getLoggerName()).append(' ').append(r.getMessage());
      if (r.getParameters() != null) for (Object p : r.getParameters()) text.append(' ').append(p);
      if (r.getThrown() != null) text.append(' ').append(r.getThrown());
      text.append('\n');
    }

    @Override
    public void flush() {}

    @Override
    public void close() {}
  }

  static String chain(Throwable e) {
    StringBuilder b = new StringBuilder();
    for (Throwable t = e; t != null; t = t.getCause()) {
      b.append(t).append('\n');
      for (Throwable s : t.getSuppressed()) b.append(s).append('\n');
    }
    return b.toString();
  }

  // The database's password never shows in an exception (its whole chain)
  // or a log line (the driver's included, at every level): a wrong password,
  // a server that went away (Go's TestPasswordNeverShown).
  @Test
  void passwordNeverShown() throws Exception {
    Captured logs = new Captured();
    List<Logger> loggers = List.of(Logger.getLogger("org.postgresql"), Logger.getLogger("dev.backstop.idempotency"));
    List<Level> levels = new ArrayList<>();
    for (Logger l : loggers) {
      levels.add(l.getLevel());
      l.setLevel(Level.ALL);
      l.addHandler(logs);
    }
    List<Throwable> errs = new ArrayList<>();
    try (PostgresServer own = new PostgresServer()) { // its own: the test stops it
      PGSimpleDataSource wrong = new PGSimpleDataSource();
      wrong.setUrl(own.secretUrl("postgres").replace(PostgresServer.PASSWORD, "wrong-" + PostgresServer.PASSWORD));
      errs.add(assertThrows(PgIdempotencyStore.StoreException.class,
          () -> PgIdempotencyStore.create(wrong, IdempotencyStore.Options.defaults()).begin("s", "k", "r")));
      PGSimpleDataSource right = new PGSimpleDataSource();
      right.setUrl(own.secretUrl("postgres"));
      PgIdempotencyStore s = PgIdempotencyStore.create(right, IdempotencyStore.Options.defaults().withMetrics(reg)
          .withLease(Duration.ofMillis(50)));
      s.createTable();
      IdempotencyStore.Claim c = s.begin("s", "k", "r");
      try (Connection conn = right.getConnection()) {
        conn.setAutoCommit(false);
        own.close();
        errs.add(assertThrows(PgIdempotencyStore.StoreException.class, () -> s.begin("s", "k2", "r")));
        errs.add(assertThrows(PgIdempotencyStore.StoreException.class,
            () -> s.complete("s", "k", c.token(), new IdempotencyStore.Response(200, Map.of(), new byte[0], false, false))));
        errs.add(assertThrows(PgIdempotencyStore.StoreException.class, () -> s.fail("s", "k", c.token())));
        errs.add(assertThrows(PgIdempotencyStore.StoreException.class, () -> s.onceTx(conn, "s", "k3", "r", x -> new byte[0])));
      }
    } finally {
      for (int i = 0; i < loggers.size(); i++) {
        loggers.get(i).removeHandler(logs);
        loggers.get(i).setLevel(levels.get(i));
      }
    }
    for (Throwable e : errs) {
      String text = chain(e);
      assertFalse(text.contains(PostgresServer.PASSWORD), "an error shows the password:\n" + text);
      assertFalse(text.contains(PostgresServer.SUPERUSER + ":"), text);
    }
    assertTrue(logs.text.toString().contains("org.postgresql"), "the driver logged nothing: the check below would prove nothing");
    assertFalse(logs.text.toString().contains(PostgresServer.PASSWORD), "the log shows the password:\n" + logs.text);
    MetricsTest.assertExposes(reg, "backstop_idempotency_store_errors_total{operation=\"begin\"} 2.0",
        "backstop_idempotency_store_errors_total{operation=\"complete\"} 1.0",
        "backstop_idempotency_store_errors_total{operation=\"fail\"} 1.0");
  }
}
