package dev.backstop;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Savepoint;
import java.sql.Statement;
import java.sql.Types;
import java.time.Duration;
import java.util.Map;
import java.util.Objects;
import javax.sql.DataSource;

/**
 * Idempotency records in a PostgreSQL table over JDBC (a {@link DataSource}:
 * HikariCP, Spring's, the driver's own): the table and claim every
 * language's store runs (the contract's scripts/idempotency.sql), so the
 * same answers as Go's {@code idempotency/pgstore}, Node's
 * {@code createPgIdempotencyStore} and Python's {@code PostgresIdempotencyStore}
 * (it replays testdata/idempotency as the Redis store does), so
 * {@link IdempotencyFilter} takes it as it takes {@link IdempotencyStore};
 * and {@link #onceTx}, which writes the record in the caller's transaction so
 * that the business write and the record commit (or roll back) together.
 *
 * <pre>{@code
 * PgIdempotencyStore store = PgIdempotencyStore.create(dataSource, IdempotencyStore.Options.defaults());
 * store.createTable(); // or run PgIdempotencyStore.schema(table) in a migration
 * }</pre>
 *
 * <p>The driver (org.postgresql:postgresql) is an optional dependency: add
 * it, or any DataSource to PostgreSQL. The store never sees the connection
 * string, and none of its errors shows the password.
 *
 * <p>Every claim ({@link #begin}, {@link #onceTx}) runs in a transaction that
 * first takes {@code pg_try_advisory_xact_lock} on a hash of the table, scope
 * and key without waiting (held elsewhere: in progress, retry after 1s), then
 * reads the row {@code FOR UPDATE} and decides as the Redis script does.
 * {@link #begin} commits its in_progress row with a lease at once;
 * {@link #complete} and {@link #fail} are one statement each, guarded by the
 * owner's token. A row past its retention counts as absent ({@link #purge}
 * reclaims the space). The options are the Redis store's
 * ({@link IdempotencyStore.Options}: lease, retention, max body, metrics; the
 * prefix and the call timeout are Redis's and unused here: bound a call with
 * the DataSource's timeouts); the table is {@link #withTable}'s.
 */
public final class PgIdempotencyStore implements IdempotencyBackend {
  /** The table's name unless {@link #withTable} says otherwise. */
  public static final String DEFAULT_TABLE = "backstop_idempotency";

  /** Thrown when PostgreSQL fails (its SQLException is the cause); counted as a store error of its operation. */
  public static final class StoreException extends BackstopException {
    private static final long serialVersionUID = 1L;

    StoreException(String message, Throwable cause) {
      super(message, cause);
    }
  }

  /** The work {@link #onceTx} runs once, on the caller's connection, inside a savepoint. */
  @FunctionalInterface
  public interface TxWork {
    byte[] run(Connection conn) throws SQLException;
  }

  private final DataSource db;
  private final IdempotencyStore.Options options;
  private final IdempotencyMetrics metrics; // null: none
  private final String name;
  private final String table; // quoted

  private PgIdempotencyStore(DataSource db, IdempotencyStore.Options options, String name) {
    this.db = db;
    this.options = options;
    this.metrics = options.registry == null ? null : IdempotencyMetrics.on(options.registry);
    this.name = name;
    this.table = ident(name);
  }

  /** A store over db, on {@link #DEFAULT_TABLE}. The table must exist ({@link #schema}, {@link #createTable}). */
  public static PgIdempotencyStore create(DataSource db, IdempotencyStore.Options options) {
    return new PgIdempotencyStore(Objects.requireNonNull(db, "db"), Objects.requireNonNull(options, "options"), DEFAULT_TABLE);
  }

  /** A copy of the store on table name (a plain identifier, quoted by the store; for another schema set search_path). */
  public PgIdempotencyStore withTable(String name) {
    if (name == null || name.isEmpty()) throw new IllegalArgumentException("idempotency: table must not be empty");
    return new PgIdempotencyStore(db, options, name);
  }

  public IdempotencyStore.Options options() {
    return options;
  }

  /** The table's name (unquoted). */
  public String table() {
    return name;
  }

  @Override
  public Duration lease() {
    return options.lease;
  }

  @Override
  public void countRequest(String outcome) {
    if (metrics != null) metrics.request(outcome);
  }

  private static String ident(String name) {
    return "\"" + name.replace("\"", "\"\"") + "\"";
  }

  private static String quote(String s) {
    return Json.quote(new StringBuilder(), s).toString();
  }

  /**
   * The DDL of the table and of its claim function (the contract's
   * scripts/idempotency.sql, which every language's store runs, as Go's
   * {@code pgstore.Schema} writes it): CREATE TABLE IF NOT EXISTS, its expiry
   * index, CREATE OR REPLACE FUNCTION. Run it in a migration or through
   * {@link #createTable}, and again after an upgrade: the table and its rows
   * stay as they are.
   */
  public static String schema(String table) {
    Map<String, String> names = Map.of("{table}", ident(table), "{index}", ident(table + "_expires_at"),
        "{function}", beginFunction(table), "{name}", "'" + table.replace("'", "''") + "'");
    return PLACEHOLDER.matcher(SQL).replaceAll(m -> java.util.regex.Matcher.quoteReplacement(names.get(m.group())));
  }

  private static final java.util.regex.Pattern PLACEHOLDER = java.util.regex.Pattern.compile("\\{(?:table|index|function|name)\\}");
  private static final String SQL = Redis.contractFile("idempotency.sql");

  /** The quoted name of table's claim function. */
  private static String beginFunction(String table) {
    return ident(table + "_begin_v1");
  }

  /** Runs {@link #schema} for the store's table. */
  public void createTable() {
    try (Connection c = db.getConnection(); Statement st = c.createStatement()) {
      st.execute(schema(name));
      if (!c.getAutoCommit()) c.commit();
    } catch (SQLException e) {
      throw new StoreException("idempotency: create table " + table + ": " + e.getMessage(), e);
    }
  }

  /**
   * Deletes up to limit rows past their retention and returns how many; run
   * it periodically (such a row already counts as absent: this only reclaims
   * the space).
   */
  public long purge(int limit) {
    try (Connection c = db.getConnection();
        PreparedStatement st = c.prepareStatement("DELETE FROM " + table + " WHERE ctid IN (SELECT ctid FROM " + table
            + " WHERE expires_at <= clock_timestamp() LIMIT ?)")) {
      st.setInt(1, limit);
      long n = st.executeUpdate();
      if (!c.getAutoCommit()) c.commit();
      return n;
    } catch (SQLException e) {
      throw new StoreException("idempotency: purge " + table + ": " + e.getMessage(), e);
    }
  }

  /** A token or a fingerprint as the script checks it: 1..128 printable ASCII characters, no spaces. */
  private static void word(String what, String v) {
    if (v == null || v.isEmpty() || v.length() > 128) {
      throw new IllegalArgumentException("idempotency: " + what + " must be 1..128 printable ASCII characters, got "
          + (v == null ? 0 : v.length()) + " characters");
    }
    for (int i = 0; i < v.length(); i++) {
      char ch = v.charAt(i);
      if (ch <= 0x20 || ch > 0x7e) {
        throw new IllegalArgumentException("idempotency: " + what + " must be 1..128 printable ASCII characters, character "
            + i + " is " + String.format("%#x", (int) ch));
      }
    }
  }

  private static void checks(String key, String request) {
    String bad = IdempotencyRules.checkKey(key);
    if (bad != null) throw new IllegalArgumentException(bad);
    word("request", request);
  }

  private void count(String storeErrorOp) {
    if (metrics != null) metrics.storeError(storeErrorOp);
  }

  /** The claim: one call of the table's function (idempotency.sql) on conn; on STARTED the row is in_progress with token. */
  private IdempotencyStore.Claim claim(Connection conn, String scope, String key, String request, String token)
      throws SQLException {
    try (PreparedStatement st = conn.prepareStatement("SELECT state, retry_after_s, taken_over, status, headers, body, too_large,"
        + " truncated FROM " + beginFunction(name) + "(?, ?, ?, ?, ?, ?)")) {
      st.setString(1, scope);
      st.setString(2, key);
      st.setString(3, request);
      st.setString(4, token);
      st.setLong(5, options.lease.toMillis());
      st.setLong(6, options.retention.toMillis());
      try (ResultSet rs = st.executeQuery()) {
        rs.next();
        String state = rs.getString(1);
        switch (state) {
          case "started":
            return new IdempotencyStore.Claim(IdempotencyStore.State.STARTED, token, rs.getBoolean(3), 0, null);
          case "in_progress":
            return new IdempotencyStore.Claim(IdempotencyStore.State.IN_PROGRESS, null, false, rs.getLong(2), null);
          case "conflict":
            return new IdempotencyStore.Claim(IdempotencyStore.State.CONFLICT, null, false, 0, null);
          case "completed": {
            boolean large = rs.getBoolean(7);
            String headers = rs.getString(5);
            Map<String, java.util.List<String>> h = large || headers == null ? Map.of() : IdempotencyRules.decodeHeaders(headers);
            return new IdempotencyStore.Claim(IdempotencyStore.State.COMPLETED, null, false, 0,
                new IdempotencyStore.Response(rs.getInt(4), h, large ? null : rs.getBytes(6), large, rs.getBoolean(8)));
          }
          default:
            throw new IllegalStateException("idempotency: " + beginFunction(name) + " answered " + quote(state));
        }
      }
    } catch (SQLException e) {
      if ("42883".equals(e.getSQLState())) { // undefined_function
        throw new SQLException(e.getMessage() + " (the store's DDL is older than the store: run createTable() or schema() again)",
            e.getSQLState(), e);
      }
      throw e;
    }
  }

  /**
   * Claims key (within scope) for a request whose fingerprint is request, in
   * one statement (a transaction of its own) that commits the in_progress row
   * with its lease.
   *
   * @throws IllegalArgumentException for a key {@link IdempotencyStore#checkKey} refuses, or a request
   *     that is not 1..128 printable ASCII characters
   * @throws StoreException when PostgreSQL fails (counted as a begin store error)
   */
  @Override
  public IdempotencyStore.Claim begin(String scope, String key, String request) {
    checks(key, request);
    IdempotencyStore.Claim c;
    try (Connection conn = db.getConnection()) {
      c = claim(conn, scope, key, request, IdempotencyRules.newToken()); // one statement
      if (!conn.getAutoCommit()) conn.commit();
    } catch (SQLException | IllegalStateException e) {
      count("begin");
      throw new StoreException("idempotency: begin " + quote(key) + ": " + e.getMessage(), e);
    }
    if (c.takenOver() && metrics != null) metrics.leaseExpiry();
    return c;
  }

  private static final String COMPLETE_SQL_TAIL = " SET state = 'completed', status = ?, headers = ?::jsonb, body = ?, too_large = ?,\n"
      + "  truncated = ?, lease_until = NULL, expires_at = clock_timestamp() + ? * interval '1 millisecond'\n"
      + "WHERE scope = ? AND key = ? AND state = 'in_progress' AND token = ? AND expires_at > clock_timestamp()";

  /** The complete statement on conn, its arguments set: only the owner of a live record may store. */
  private PreparedStatement completeStatement(Connection conn, String scope, String key, String token,
      IdempotencyStore.Response resp) throws SQLException {
    if (resp.status() < 100 || resp.status() > 999) {
      throw new IllegalArgumentException("idempotency: complete " + quote(key) + ": status must be a whole number in 100..999, got "
          + resp.status());
    }
    boolean large = resp.tooLarge() || resp.body().length > options.maxBody;
    PreparedStatement st = conn.prepareStatement("UPDATE " + table + COMPLETE_SQL_TAIL);
    try {
      st.setInt(1, resp.status());
      if (large) {
        st.setNull(2, Types.VARCHAR);
        st.setNull(3, Types.BINARY);
      } else {
        st.setString(2, IdempotencyRules.encodeHeaders(IdempotencyRules.safeHeaders(resp.headers())));
        st.setBytes(3, resp.body());
      }
      st.setBoolean(4, large);
      st.setBoolean(5, resp.truncated());
      st.setLong(6, options.retention.toMillis());
      st.setString(7, scope);
      st.setString(8, key);
      st.setString(9, token);
      return st;
    } catch (SQLException | RuntimeException e) {
      st.close();
      throw e;
    }
  }

  /**
   * Stores resp as the key's response; only the owner (token from begin)
   * may, even past its lease when nobody took the key over. A body over the
   * max body is stored as too large.
   *
   * @throws IdempotencyStore.LeaseLostException when the caller no longer owns the key: nothing was written
   * @throws StoreException when PostgreSQL fails (counted as a complete store error)
   */
  @Override
  public void complete(String scope, String key, String token, IdempotencyStore.Response resp) {
    word("token", token);
    Objects.requireNonNull(resp, "resp");
    owner("complete", key, conn -> {
      try (PreparedStatement st = completeStatement(conn, scope, key, token, resp)) {
        return st.executeUpdate();
      }
    });
  }

  /**
   * Releases the key (deletes the row) so that a retry may run; only the owner may.
   *
   * @throws IdempotencyStore.LeaseLostException when the caller no longer owns the key
   * @throws StoreException when PostgreSQL fails (counted as a fail store error)
   */
  @Override
  public void fail(String scope, String key, String token) {
    word("token", token);
    owner("fail", key, conn -> {
      try (PreparedStatement st = conn.prepareStatement("DELETE FROM " + table
          + " WHERE scope = ? AND key = ? AND state = 'in_progress' AND token = ? AND expires_at > clock_timestamp()")) {
        st.setString(1, scope);
        st.setString(2, key);
        st.setString(3, token);
        return st.executeUpdate();
      }
    });
  }

  private interface Update {
    int run(Connection conn) throws SQLException;
  }

  /** Runs one owner's statement on a connection of db and commits it; no row changed is a lost lease. */
  private void owner(String op, String key, Update u) {
    int n;
    try (Connection conn = db.getConnection()) {
      n = u.run(conn);
      if (!conn.getAutoCommit()) conn.commit(); // a pool may hand out connections in a transaction
    } catch (SQLException e) {
      count(op);
      throw new StoreException("idempotency: " + op + " " + quote(key) + ": " + e.getMessage(), e);
    }
    ownerCheck(op, key, n);
  }

  private void ownerCheck(String op, String key, int rows) {
    if (rows == 0) {
      if (metrics != null) metrics.leaseLost();
      throw new IdempotencyStore.LeaseLostException("idempotency: " + op + " " + quote(key)
          + ": lease lost: the record is gone, completed, or owned by another caller");
    }
  }

  /**
   * Runs fn at most once for key (within scope), with the record written in
   * conn's transaction, the caller's (autocommit off): fn's writes on conn
   * and the record commit together when the caller commits, or neither does.
   * A later call with the same key and request returns fn's result without
   * running it.
   *
   * <p>fn runs in a savepoint: when it throws, the savepoint is rolled back
   * (its writes and the claim with it) and the exception rethrown as it was;
   * conn's transaction stays usable. The key's advisory lock is held until
   * the transaction ends: meanwhile a duplicate (another onceTx, or begin
   * through the filter) is answered in progress at once. No lease is
   * involved: the record becomes visible completed, at commit, or never.
   * Commit promptly.
   *
   * <pre>{@code
   * try (Connection conn = dataSource.getConnection()) {
   *   conn.setAutoCommit(false);
   *   byte[] receipt = store.onceTx(conn, "charges", job.id(), job.id(), tx -> {
   *     try (PreparedStatement st = tx.prepareStatement("INSERT INTO charges (order_id, cents) VALUES (?, ?)")) {
   *       st.setString(1, job.orderId());
   *       st.setInt(2, job.cents());
   *       st.executeUpdate();
   *     }
   *     return "charged".getBytes(StandardCharsets.UTF_8);
   *   });
   *   conn.commit();
   * }
   * }</pre>
   *
   * @throws IdempotencyStore.InProgressException another transaction holds the key, or a begin's lease is live
   * @throws IdempotencyStore.ConflictException the key was used with another request
   * @throws IdempotencyStore.TooLargeException the first result was over the max body and was not kept
   * @throws StoreException PostgreSQL failed on the store's own statements
   * @throws SQLException fn's, as it threw it
   * @throws IllegalStateException conn is in autocommit mode (no transaction of the caller's to join)
   */
  public byte[] onceTx(Connection conn, String scope, String key, String request, TxWork fn) throws SQLException {
    checks(key, request);
    Objects.requireNonNull(fn, "fn");
    if (conn.getAutoCommit()) {
      throw new IllegalStateException("idempotency: onceTx needs the caller's transaction: the connection is in autocommit mode");
    }
    Savepoint sp;
    IdempotencyStore.Claim c;
    String token = IdempotencyRules.newToken();
    try {
      sp = conn.setSavepoint();
    } catch (SQLException e) {
      count("begin");
      throw new StoreException("idempotency: begin " + quote(key) + ": " + e.getMessage(), e);
    }
    boolean done = false;
    try {
      try {
        c = claim(conn, scope, key, request, token);
      } catch (SQLException | IllegalStateException e) {
        count("begin");
        throw new StoreException("idempotency: begin " + quote(key) + ": " + e.getMessage(), e);
      }
      byte[] replayed = IdempotencyRules.onceAnswer(this, c, key);
      if (replayed != null) return replayed;
      if (c.takenOver() && metrics != null) metrics.leaseExpiry();
      byte[] out = fn.run(conn);
      if (out == null) out = new byte[0];
      int n;
      try (PreparedStatement st = completeStatement(conn, scope, key, token,
          new IdempotencyStore.Response(200, Map.of(), out, false, false))) {
        n = st.executeUpdate();
      } catch (SQLException e) {
        count("complete");
        throw new StoreException("idempotency: complete " + quote(key) + ": " + e.getMessage(), e);
      }
      ownerCheck("complete", key, n);
      try {
        conn.releaseSavepoint(sp);
      } catch (SQLException e) {
        count("complete");
        throw new StoreException("idempotency: complete " + quote(key) + ": " + e.getMessage(), e);
      }
      done = true;
      return out;
    } finally {
      if (!done) {
        // fn's writes and the claim go; the caller's transaction stays usable.
        try {
          conn.rollback(sp);
          conn.releaseSavepoint(sp);
        } catch (SQLException e) {
          // the transaction is broken anyway: the caller's commit fails
        }
      }
    }
  }
}
