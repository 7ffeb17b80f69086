package io.github.fencedlock;

import static org.junit.jupiter.api.Assertions.fail;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.extension.BeforeAllCallback;
import org.junit.jupiter.api.extension.ExtensionContext;

/**
 * The suite's database, {@code fl_client_java}, on the server named by {@code FL_DSN} (a
 * superuser URL of database {@code postgres}): created once for the whole run with the extension,
 * the guarded tables and the roles, dropped (with the roles) when the run ends. Other clients'
 * suites may use the same server at the same time, each in its own database, so every look at
 * {@code pg_stat_activity} or {@code pg_locks} is limited to this database.
 */
final class Db implements ExtensionContext.Store.CloseableResource {
  static final String NAME = "fl_client_java";
  /** Roles are the cluster's: prefixed so that no other suite's roles are touched. */
  static final String OWNER = "fl_client_java_owner";
  static final String OTHER = "fl_client_java_other";
  static final String NOEXEC = "fl_client_java_noexec";

  private static Db instance;

  final String adminDsn;
  final String dsn;

  private Db() throws SQLException {
    adminDsn = System.getenv("FL_DSN");
    if (adminDsn == null || adminDsn.isEmpty()) {
      throw new IllegalStateException("FL_DSN is not set: a superuser postgresql:// URL of database postgres");
    }
    dsn = withDatabase(adminDsn, NAME);
    try (Connection c = connect(adminDsn); Statement st = c.createStatement()) {
      st.execute("DROP DATABASE IF EXISTS " + NAME + " WITH (FORCE)");
      for (String role : List.of(OWNER, OTHER, NOEXEC)) {
        st.execute("DROP ROLE IF EXISTS " + role);
      }
      st.execute("CREATE DATABASE " + NAME);
      for (String role : List.of(OWNER, OTHER, NOEXEC)) {
        st.execute("CREATE ROLE " + role + " NOLOGIN");
      }
    }
    try (Connection c = connect(dsn); Statement st = c.createStatement()) {
      st.execute("CREATE EXTENSION fenced_lock");
      st.execute("CREATE TABLE inventory (item_id int PRIMARY KEY, stock int NOT NULL, fence_token bigint)");
      st.execute("CREATE TRIGGER inventory_fence BEFORE INSERT OR UPDATE OR DELETE ON inventory "
          + "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('inventory:{item_id}', 'fence_token')");
      st.execute("CREATE TABLE docs (id int PRIMARY KEY, body text, fence_token bigint)");
      st.execute("CREATE TRIGGER docs_fence BEFORE INSERT OR UPDATE OR DELETE ON docs "
          + "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('docs:{id}', 'fence_token')");
      for (String role : List.of(OWNER, OTHER)) {
        st.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO " + role);
        st.execute("GRANT SELECT, INSERT, UPDATE ON docs TO " + role);
      }
    }
  }

  static synchronized Db get() {
    if (instance == null) {
      try {
        instance = new Db();
      } catch (SQLException e) {
        throw new IllegalStateException("cannot set up database " + NAME + ": " + e.getMessage(), e);
      }
    }
    return instance;
  }

  /** Sets the database up before a class's tests, and has the root context drop it at the end. */
  static final class Extension implements BeforeAllCallback {
    @Override
    public void beforeAll(ExtensionContext context) {
      context.getRoot().getStore(ExtensionContext.Namespace.GLOBAL)
          .getOrComputeIfAbsent(Db.class, k -> get(), Db.class);
    }
  }

  @Override
  public synchronized void close() throws SQLException {
    if (checks != null) {
      ConnectionSource.closeQuietly(checks);
    }
    try (Connection c = connect(adminDsn); Statement st = c.createStatement()) {
      st.execute("DROP DATABASE IF EXISTS " + NAME + " WITH (FORCE)");
      for (String role : List.of(OWNER, OTHER, NOEXEC)) {
        st.execute("DROP ROLE IF EXISTS " + role);
      }
    }
  }

  /** The same server, another database; a postgresql:// URL or key=value pairs. */
  static String withDatabase(String dsn, String db) {
    if (dsn.startsWith("postgresql://") || dsn.startsWith("postgres://")) {
      int start = dsn.indexOf("://") + 3;
      int q = dsn.indexOf('?', start);
      int end = q < 0 ? dsn.length() : q;
      int slash = dsn.indexOf('/', start);
      String head = slash >= 0 && slash < end ? dsn.substring(0, slash) : dsn.substring(0, end);
      return head + "/" + db + dsn.substring(end);
    }
    return dsn + " dbname=" + db;
  }

  static Connection connect(String dsn) throws SQLException {
    Dsn d = Dsn.parse(dsn);
    return new org.postgresql.Driver().connect(d.url, d.properties);
  }

  /** A new superuser connection to the suite's database, autocommit on. */
  Connection admin() throws SQLException {
    return connect(dsn);
  }

  FencedLock locker() throws InvalidArgumentException {
    return FencedLock.builder(dsn).build();
  }

  // ---- looking at the server ----

  /**
   * The connection the checks below share, opened once (and again if it broke): a connection per
   * check, polled every 20 ms by {@link #await}, would cost the server a backend each time.
   * Tests run in parallel, so the checks take turns on it.
   */
  private Connection checks;

  private Connection checks() throws SQLException {
    if (checks == null || checks.isClosed() || !checks.isValid(5)) {
      if (checks != null) {
        ConnectionSource.closeQuietly(checks);
      }
      checks = admin();
    }
    return checks;
  }

  synchronized Object scalar(String sql, Object... args) throws SQLException {
    try (PreparedStatement ps = prepare(sql, args); ResultSet rs = ps.executeQuery()) {
      return rs.next() ? rs.getObject(1) : null;
    }
  }

  synchronized List<Object> column(String sql, Object... args) throws SQLException {
    List<Object> out = new ArrayList<>();
    try (PreparedStatement ps = prepare(sql, args); ResultSet rs = ps.executeQuery()) {
      while (rs.next()) {
        out.add(rs.getObject(1));
      }
    }
    return out;
  }

  synchronized void exec(String sql, Object... args) throws SQLException {
    try (PreparedStatement ps = prepare(sql, args)) {
      ps.execute();
    }
  }

  private PreparedStatement prepare(String sql, Object... args) throws SQLException {
    PreparedStatement ps = checks().prepareStatement(sql);
    for (int i = 0; i < args.length; i++) {
      ps.setObject(i + 1, args[i]);
    }
    return ps;
  }

  boolean validate(String name, long token) throws SQLException {
    return (Boolean) scalar("SELECT fenced_lock_validate(?, ?)", name, token);
  }

  /** How the lease {@code token} ended per fenced_lock_history ({@code null}: not ended, or not yet known). */
  String endedBy(long token) throws SQLException {
    return (String) scalar("SELECT ended_by FROM fenced_lock_history WHERE token = ?", token);
  }

  /** Pids of this database's keepalive connections. */
  List<Object> keepalivePids() throws SQLException {
    return column("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        + "AND application_name = 'fenced_lock_keepalive' ORDER BY pid");
  }

  void terminate(int pid) throws SQLException {
    scalar("SELECT pg_terminate_backend(?)", pid);
  }

  /** Ends whatever lease is left on the names a test uses, so tests do not see each other's. */
  void forceRelease(String... names) throws SQLException {
    for (String n : names) {
      scalar("SELECT fenced_lock_force_release(?)", n);
    }
  }

  // ---- waiting, bounded ----

  /** Waits until {@code cond} holds, polling; fails the test with {@code what} after {@code limit}. */
  static void await(String what, Duration limit, SqlCondition cond) {
    long until = System.nanoTime() + limit.toNanos();
    while (true) {
      try {
        if (cond.test()) {
          return;
        }
      } catch (SQLException e) {
        throw new IllegalStateException(e);
      }
      if (System.nanoTime() - until > 0) {
        fail("not within " + limit + ": " + what);
      }
      sleep(20);
    }
  }

  @FunctionalInterface
  interface SqlCondition {
    boolean test() throws SQLException;
  }

  static void sleep(long millis) {
    try {
      Thread.sleep(millis);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException(e);
    }
  }
}
