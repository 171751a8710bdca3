package dev.backstop;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Types;
import java.util.Base64;
import java.util.Map;
import java.util.TreeMap;
import java.util.stream.Stream;
import javax.sql.DataSource;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/**
 * Every shared case of testdata/idempotency/cases.json through
 * PgIdempotencyStore against a real PostgreSQL server (PostgresServer), by
 * IdempotencyCasesTest's runner: the replies and the record Go's pgstore
 * gives (idempotency/pgstore/cases_test.go). The steps under the store act on
 * the row (README.md there): lapse sets lease_until a second back, expire
 * moves expires_at into the past (the row stays: the store must treat it as
 * absent), write inserts the fields as columns; the record after is the row
 * shown as the Redis hash holds it.
 */
class PgIdempotencyCasesTest {
  static DataSource db;

  @BeforeAll
  static void start() throws Exception {
    PostgresServer pg = PostgresServer.get();
    db = pg.dataSource(pg.database());
    PgIdempotencyStore.create(db, IdempotencyStore.Options.defaults()).createTable();
  }

  @TestFactory
  Stream<DynamicTest> everySharedCase() {
    Map<String, Object> file = IdempotencyCasesTest.file();
    PgIdempotencyStore store = PgIdempotencyStore.create(db, IdempotencyCasesTest.options(file));
    return IdempotencyCasesTest.replay(file, store, new Row((String) file.get("scope"), (String) file.get("key"),
        (Long) file.get("retention_ms")));
  }

  /** The record as a row of backstop_idempotency. */
  record Row(String scope, String key, long retention) implements IdempotencyCasesTest.Raw {
    private void exec(String sql) throws SQLException {
      try (Connection c = db.getConnection(); PreparedStatement st = c.prepareStatement(sql)) {
        st.setString(1, scope);
        st.setString(2, key);
        st.executeUpdate();
      }
    }

    @Override
    public void reset() throws SQLException {
      exec("DELETE FROM backstop_idempotency WHERE scope = ? AND key = ?");
    }

    @Override
    public void lapse() throws SQLException {
      exec("UPDATE backstop_idempotency SET lease_until = clock_timestamp() - interval '1 second' WHERE scope = ? AND key = ?");
    }

    @Override
    public void expire() throws SQLException {
      exec("UPDATE backstop_idempotency SET expires_at = clock_timestamp() - interval '1 millisecond' WHERE scope = ? AND key = ?");
    }

    @Override
    public void write(Map<String, String> f) throws SQLException {
      try (Connection c = db.getConnection(); PreparedStatement st = c.prepareStatement("INSERT INTO backstop_idempotency (scope, key,"
          + " state, token, request, status, headers, body, too_large, truncated, expires_at)"
          + " VALUES (?, ?, ?, ?, ?, ?, ?::jsonb, ?, ?, ?, clock_timestamp() + ? * interval '1 millisecond')")) {
        st.setString(1, scope);
        st.setString(2, key);
        st.setString(3, f.get("state"));
        st.setString(4, f.get("token"));
        st.setString(5, f.get("request"));
        if (f.containsKey("status")) {
          st.setInt(6, Integer.parseInt(f.get("status")));
        } else {
          st.setNull(6, Types.INTEGER);
        }
        String h = f.get("headers");
        st.setString(7, h == null || h.isEmpty() ? null : h);
        st.setBytes(8, Base64.getDecoder().decode(f.getOrDefault("body", "")));
        st.setBoolean(9, "1".equals(f.get("too_large")));
        st.setBoolean(10, "1".equals(f.get("truncated")));
        st.setLong(11, retention);
        st.executeUpdate();
      }
    }

    @Override
    public Map<String, Object> record(Map<String, String> tokens) throws Exception {
      try (Connection c = db.getConnection(); PreparedStatement st = c.prepareStatement("SELECT state, token, request, status,"
          + " headers::text, body, too_large, truncated, extract(epoch FROM lease_until - clock_timestamp()) * 1000,"
          + " extract(epoch FROM expires_at - clock_timestamp()) * 1000 FROM backstop_idempotency"
          + " WHERE scope = ? AND key = ? AND expires_at > clock_timestamp()")) {
        st.setString(1, scope);
        st.setString(2, key);
        try (ResultSet rs = st.executeQuery()) {
          if (!rs.next()) return null;
          Map<String, Object> out = new TreeMap<>();
          String state = rs.getString(1);
          out.put("state", state);
          out.put("request", rs.getString(3));
          out.put("ttl_s", Math.round(rs.getDouble(10) / 1000));
          String token = rs.getString(2);
          if (token != null) {
            out.put("token", token);
            tokens.forEach((caller, tok) -> {
              if (tok.equals(token)) out.put("token", "{" + caller + "}");
            });
          }
          double lease = rs.getDouble(9);
          if (!rs.wasNull()) {
            long s = Math.round(lease / 1000);
            out.put("lease_until", "{now" + (s >= 0 ? "+" : "") + s + "s}");
          }
          if (state.equals("completed")) {
            out.put("status", Integer.toString(rs.getInt(4)));
            byte[] body = rs.getBytes(6);
            out.put("body", Base64.getEncoder().encodeToString(body == null ? new byte[0] : body));
            out.put("too_large", rs.getBoolean(7) ? "1" : "0");
            String headers = rs.getString(5);
            out.put("headers", headers == null ? "" : Json.parse(headers));
            if (rs.getBoolean(8)) out.put("truncated", "1");
          }
          return out;
        }
      }
    }
  }
}
