package io.github.fencedlock;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Types;
import java.time.Duration;
import javax.sql.DataSource;
import org.postgresql.core.BaseConnection;
import org.postgresql.core.TransactionState;

/**
 * A locker: acquires leases of fenced_lock's named locks over connections it opens from a
 * connection string, a {@link DataSource} (a pool) or a {@link ConnectionFactory}. Thread-safe;
 * build one per database and share it.
 *
 * <pre>{@code
 * FencedLock locks = FencedLock.builder("postgresql://app@db.example.com/shop").build();
 * try (Lease lease = locks.acquire("inventory:1")) {
 *   // read, then write with lease.token(); the keepalive renews the lease meanwhile
 * }
 * int stock = locks.run("inventory:1", lease -> sellOne(lease)); // retried on FL001
 * }</pre>
 *
 * <p>Every call checks its arguments before it sends anything ({@link InvalidArgumentException},
 * naming the argument), and raises the typed errors of {@link FencedLockException} for what the
 * server refuses.
 */
public final class FencedLock {
  /** The retry helper's attempts unless the builder says otherwise. */
  public static final int DEFAULT_RETRY_ATTEMPTS = 5;

  private static final long MAX_NANOS = Long.MAX_VALUE / 2;
  private static final System.Logger LOG = System.getLogger("io.github.fencedlock");

  final ConnectionSource source;
  private final Duration keepaliveInterval;
  private final int retryAttempts;
  private final boolean transactionPooling;
  private final String prefix; // "" or the quoted schema and a dot
  private final String renewSql;
  private final String releaseSql;
  private final String assertSql;

  private FencedLock(Builder b, ConnectionSource source) {
    this.source = source;
    this.keepaliveInterval = b.keepaliveInterval;
    this.retryAttempts = b.retryAttempts;
    this.transactionPooling = b.transactionPooling;
    this.prefix = b.schema == null ? "" : quoteIdent(b.schema) + ".";
    this.renewSql = "SELECT " + prefix + "fenced_lock_renew(name => ?, token => ?, ttl => ?::interval)";
    this.releaseSql = "SELECT " + prefix + "fenced_lock_release(name => ?, token => ?)";
    this.assertSql = "SELECT " + prefix + "fenced_lock_assert(name => ?, token => ?)";
  }

  /**
   * A locker over a connection string: a {@code postgresql://} URL or libpq {@code key=value}
   * pairs (as {@code psql} takes them; Unix-domain sockets are not supported by PgJDBC), or a
   * {@code jdbc:postgresql:} URL. Parameters PgJDBC knows by another name are renamed ({@code
   * application_name}, {@code connect_timeout}, {@code target_session_attrs}, ...); other URL
   * parameters are passed to PgJDBC as they are.
   */
  public static Builder builder(String dsn) {
    return new Builder(dsn, null, null);
  }

  /** A locker over a {@link DataSource}, such as a connection pool (HikariCP, ...). */
  public static Builder builder(DataSource dataSource) {
    return new Builder(null, dataSource, null);
  }

  /** A locker over a factory of new connections. */
  public static Builder builder(ConnectionFactory factory) {
    return new Builder(null, null, factory);
  }

  /** The options of a locker. */
  public static final class Builder {
    private final String dsn;
    private final DataSource dataSource;
    private final ConnectionFactory factory;
    private final boolean fromDsn;
    private Duration keepaliveInterval;
    private int retryAttempts = DEFAULT_RETRY_ATTEMPTS;
    private boolean transactionPooling;
    private String schema;

    private Builder(String dsn, DataSource dataSource, ConnectionFactory factory) {
      this.dsn = dsn;
      this.dataSource = dataSource;
      this.factory = factory;
      this.fromDsn = dataSource == null && factory == null;
    }

    /**
     * How often the keepalive renews a lease; {@code null} (the default) is a third of each
     * lease's ttl. Positive, and shorter than the ttl of the leases it keeps.
     */
    public Builder keepaliveInterval(Duration interval) {
      this.keepaliveInterval = interval;
      return this;
    }

    /** How many times in all {@link #run} tries before it gives up on {@code FL001}; at least 1. */
    public Builder retryAttempts(int attempts) {
      this.retryAttempts = attempts;
      return this;
    }

    /**
     * The connections go through PgBouncer (or another pooler) in transaction mode: session-bound
     * leases are refused with a {@link UsageException} (the session would be a pooled server
     * connection that other clients share, and the lease would end with their session, not
     * yours), and connections opened from a connection string do not keep named prepared
     * statements ({@code prepareThreshold=0}). Plain leases, kept by their ttl and the
     * keepalive, are right there.
     */
    public Builder transactionPooling(boolean transactionPooling) {
      this.transactionPooling = transactionPooling;
      return this;
    }

    /** The schema fenced_lock was created in, when it is not on the connections' search_path. */
    public Builder schema(String schema) {
      this.schema = schema;
      return this;
    }

    public FencedLock build() throws InvalidArgumentException {
      if (keepaliveInterval != null && (keepaliveInterval.isNegative() || keepaliveInterval.isZero())) {
        throw InvalidArgumentException.argument("keepaliveInterval", "must be positive, not " + keepaliveInterval);
      }
      if (retryAttempts < 1) {
        throw InvalidArgumentException.argument("retryAttempts", "must be at least 1, not " + retryAttempts);
      }
      if (schema != null && schema.isEmpty()) {
        throw InvalidArgumentException.argument("schema", "must not be empty");
      }
      ConnectionSource source;
      if (fromDsn) {
        source = ConnectionSource.of(Dsn.parse(dsn), transactionPooling);
      } else if (dataSource != null) {
        source = ConnectionSource.of(dataSource);
      } else {
        source = ConnectionSource.of(factory);
      }
      return new FencedLock(this, source);
    }
  }

  /**
   * A new connection from the locker's source (its connection string, pool or factory), in
   * autocommit mode; yours to close. A connection to pass to {@link AcquireOptions#connection} and
   * use for many leases, or to write on when a lease's own connection is gone.
   */
  public Connection openConnection() throws FencedLockException {
    try {
      return source.openLease();
    } catch (SQLException e) {
      throw FencedLockException.from(e);
    }
  }

  // ---- acquire ----

  /**
   * {@code fenced_lock_try_acquire} with the default options: a lease now, or {@code null} if the
   * name is taken (or busy, or others wait for it). Never waits for anyone.
   */
  public Lease tryAcquire(String name) throws FencedLockException {
    return tryAcquire(name, AcquireOptions.defaults());
  }

  /**
   * {@code fenced_lock_try_acquire}: a lease now, or {@code null} if it cannot be granted without
   * waiting. {@code maxWait} must not be set.
   */
  public Lease tryAcquire(String name, AcquireOptions options) throws FencedLockException {
    return grant(name, options, false);
  }

  /** {@code fenced_lock_acquire} with the default options: waits in line until granted. */
  public Lease acquire(String name) throws FencedLockException {
    return acquire(name, AcquireOptions.defaults());
  }

  /**
   * {@code fenced_lock_acquire}: waits in line (first come, first served) until granted, or
   * {@link WaitTimeoutException} after {@code maxWait}.
   */
  public Lease acquire(String name, AcquireOptions options) throws FencedLockException {
    return grant(name, options, true);
  }

  private Lease grant(String name, AcquireOptions o, boolean waiting) throws FencedLockException {
    long ttlNanos = check(name, o, waiting);
    Connection conn = o.connection;
    boolean owned = conn == null;
    if (!owned) {
      requireOutsideTransaction(conn, waiting ? "acquire" : "tryAcquire");
    } else {
      try {
        conn = source.openLease();
      } catch (SQLException e) {
        throw FencedLockException.from(e);
      }
    }
    boolean handedOver = false;
    try {
      Connection c = conn;
      long sent = System.nanoTime();
      Long token = onItsOwn(c, () -> callAcquire(c, name, o, waiting));
      long answered = System.nanoTime();
      if (token == null) {
        return null;
      }
      Lease lease = new Lease(this, conn, owned, name, token, o, ttlNanos, sent);
      handedOver = true;
      if (answered - sent >= ttlNanos / 3) {
        // The deadline counts from the send, but the grant came later (after waiting in line):
        // one renew now gives the lease back the ttl it really has.
        try {
          if (!lease.renew()) {
            return lease; // already lost; its user sees isLost()
          }
        } catch (FencedLockException e) {
          // The lease is granted all the same; its deadline stays counted from the send, and the
          // keepalive (which renews at once) or isLost() tells what became of it.
          LOG.log(System.Logger.Level.WARNING, "renew after a long acquire of \"" + name + "\" failed: " + e);
        }
      }
      if (o.keepalive) {
        lease.startKeepalive(intervalNanos(ttlNanos));
      }
      return lease;
    } catch (SQLException e) {
      throw FencedLockException.from(e);
    } finally {
      if (owned && !handedOver) {
        ConnectionSource.closeQuietly(conn);
      }
    }
  }

  private long intervalNanos(long ttlNanos) {
    return keepaliveInterval == null ? Math.max(1, ttlNanos / 3) : nanos(keepaliveInterval);
  }

  /** Checks the arguments of an acquire, before anything is sent; returns the ttl in nanoseconds. */
  private long check(String name, AcquireOptions o, boolean waiting) throws FencedLockException {
    if (name == null) {
      throw InvalidArgumentException.argument("name", "must not be null");
    }
    if (name.isEmpty()) {
      throw InvalidArgumentException.argument("name", "must not be empty");
    }
    if (o == null) {
      throw InvalidArgumentException.argument("options", "must not be null");
    }
    if (o.ttl == null) {
      throw InvalidArgumentException.argument("ttl", "must not be null");
    }
    if (o.ttl.isNegative() || o.ttl.isZero()) {
      throw InvalidArgumentException.argument("ttl", "must be positive, not " + o.ttl);
    }
    if (o.ttl.compareTo(Duration.ofNanos(1000)) < 0) {
      throw InvalidArgumentException.argument("ttl", "must be at least a microsecond (the server's resolution), not " + o.ttl);
    }
    if (o.maxWait != null) {
      if (!waiting) {
        throw InvalidArgumentException.argument("maxWait", "is an argument of acquire; tryAcquire never waits");
      }
      if (o.maxWait.isNegative()) {
        throw InvalidArgumentException.argument("maxWait", "must not be negative, not " + o.maxWait);
      }
    }
    if (o.permits < 1) {
      throw InvalidArgumentException.argument("permits", "must be at least 1, not " + o.permits);
    }
    if (o.shared && o.permits > 1) {
      throw InvalidArgumentException.argument("permits", "a shared lease takes no permits (shared with permits " + o.permits + ")");
    }
    if (o.holder != null && o.holder.indexOf('\0') >= 0) {
      throw InvalidArgumentException.argument("holder", "must not contain a NUL character");
    }
    if (name.indexOf('\0') >= 0) {
      throw InvalidArgumentException.argument("name", "must not contain a NUL character");
    }
    long ttlNanos = nanos(o.ttl);
    if (o.keepalive && keepaliveInterval != null && keepaliveInterval.compareTo(o.ttl) >= 0) {
      throw InvalidArgumentException.argument("ttl", "must be longer than the locker's keepaliveInterval ("
          + keepaliveInterval + "), not " + o.ttl);
    }
    if (transactionPooling && o.sessionBound) {
      throw new UsageException("sessionBound: refused with transactionPooling: behind a transaction pooler the "
          + "session is a pooled server connection that other clients share, so the lease would end with "
          + "their session, not yours; use a plain lease (ttl and keepalive) there");
    }
    if (o.connection != null) {
      try {
        if (o.connection.isClosed()) {
          throw InvalidArgumentException.argument("connection", "is closed");
        }
      } catch (SQLException e) {
        throw FencedLockException.from(e);
      }
    }
    return ttlNanos;
  }

  private static long nanos(Duration d) {
    try {
      return Math.min(d.toNanos(), MAX_NANOS);
    } catch (ArithmeticException e) {
      return MAX_NANOS;
    }
  }

  // ---- the retry helper ----

  /** {@link #run(String, AcquireOptions, int, LeaseFunction)} with the default options and attempts. */
  public <T, E extends Exception> T run(String name, LeaseFunction<T, E> fn) throws E, SQLException {
    return run(name, AcquireOptions.defaults(), retryAttempts, fn);
  }

  /** {@link #run(String, AcquireOptions, int, LeaseFunction)} with the locker's attempts. */
  public <T, E extends Exception> T run(String name, AcquireOptions options, LeaseFunction<T, E> fn)
      throws E, SQLException {
    return run(name, options, retryAttempts, fn);
  }

  /**
   * Acquires {@code name} (waiting, with keepalive unless the options turn it off), calls {@code
   * fn} with the lease, releases it and returns what {@code fn} returned. If {@code fn} throws the
   * database's {@code FL001} (a stale token: the lease was lost and the write refused; seen
   * through wrapping exceptions, see {@link FencedLockException#isStaleToken}), the lease is
   * dropped without a release and everything runs again from the acquire, up to {@code attempts}
   * times in all; then the last one is thrown as a {@link StaleTokenException}. Any other
   * exception of {@code fn} is thrown at once, after the release. A failed transaction left on
   * the lease's connection is rolled back before the next attempt.
   */
  public <T, E extends Exception> T run(String name, AcquireOptions options, int attempts, LeaseFunction<T, E> fn)
      throws E, SQLException {
    check(name, options, true);
    if (attempts < 1) {
      throw InvalidArgumentException.argument("attempts", "must be at least 1, not " + attempts);
    }
    if (fn == null) {
      throw InvalidArgumentException.argument("fn", "must not be null");
    }
    Throwable last = null;
    for (int attempt = 1; attempt <= attempts; attempt++) {
      Lease lease = acquire(name, options);
      T result;
      try {
        result = fn.apply(lease);
      } catch (Throwable t) {
        if (FencedLockException.isStaleToken(t)) {
          last = t;
          rollbackIfFailed(lease.connection());
          lease.abandon();
          continue;
        }
        try {
          lease.close();
        } catch (FencedLockException releaseError) {
          t.addSuppressed(releaseError);
        }
        throw Sneaky.<RuntimeException>sneak(t);
      }
      lease.close();
      return result;
    }
    SQLException stale = FencedLockException.findStaleToken(last);
    if (stale instanceof StaleTokenException) {
      throw (StaleTokenException) stale;
    }
    FencedLockException mapped = FencedLockException.from(stale);
    if (last != stale) {
      mapped.addSuppressed(last); // what fn threw, around the database's error
    }
    throw mapped;
  }

  private static void rollbackIfFailed(Connection c) {
    try {
      if (!c.isClosed() && transactionState(c) == TransactionState.FAILED) {
        rollback(c);
      }
    } catch (SQLException e) {
      // The next acquire on this connection reports what is wrong with it.
    }
  }

  // ---- SQL ----

  Long callAcquire(Connection c, String name, AcquireOptions o, boolean waiting) throws SQLException {
    StringBuilder sql = new StringBuilder("SELECT ").append(prefix)
        .append(waiting ? "fenced_lock_acquire" : "fenced_lock_try_acquire")
        .append("(name => ?, ttl => ?::interval");
    if (waiting) {
      sql.append(", wait => ?::interval");
    }
    sql.append(", holder => ?, session_bound => ?");
    // Sent only when they differ from the server's defaults, so that exclusive leases also
    // work against a server older than 0.3.0, whose functions do not have them.
    if (o.shared) {
      sql.append(", shared => ?");
    }
    if (o.permits != 1) {
      sql.append(", permits => ?");
    }
    sql.append(')');
    try (PreparedStatement ps = c.prepareStatement(sql.toString())) {
      int i = 1;
      ps.setString(i++, name);
      ps.setString(i++, interval(o.ttl));
      if (waiting) {
        if (o.maxWait == null) {
          ps.setNull(i++, Types.VARCHAR);
        } else {
          ps.setString(i++, interval(o.maxWait));
        }
      }
      if (o.holder == null) {
        ps.setNull(i++, Types.VARCHAR);
      } else {
        ps.setString(i++, o.holder);
      }
      ps.setBoolean(i++, o.sessionBound);
      if (o.shared) {
        ps.setBoolean(i++, true);
      }
      if (o.permits != 1) {
        ps.setInt(i++, o.permits);
      }
      try (ResultSet rs = ps.executeQuery()) {
        rs.next();
        long token = rs.getLong(1);
        return rs.wasNull() ? null : token;
      }
    }
  }

  boolean callRenew(Connection c, String name, long token, Duration ttl) throws SQLException {
    try (PreparedStatement ps = c.prepareStatement(renewSql)) {
      ps.setString(1, name);
      ps.setLong(2, token);
      ps.setString(3, interval(ttl));
      return bool(ps);
    }
  }

  boolean callRelease(Connection c, String name, long token) throws SQLException {
    try (PreparedStatement ps = c.prepareStatement(releaseSql)) {
      ps.setString(1, name);
      ps.setLong(2, token);
      return bool(ps);
    }
  }

  void callAssert(Connection c, String name, long token) throws SQLException {
    try (PreparedStatement ps = c.prepareStatement(assertSql)) {
      ps.setString(1, name);
      ps.setLong(2, token);
      ps.executeQuery().close();
    }
  }

  String renewSql() {
    return renewSql;
  }

  private static boolean bool(PreparedStatement ps) throws SQLException {
    try (ResultSet rs = ps.executeQuery()) {
      rs.next();
      return rs.getBoolean(1);
    }
  }

  /** A duration as an interval literal, to the microsecond (the server's resolution). */
  static String interval(Duration d) {
    long micros = d.getNano() / 1000;
    return d.getSeconds() + "." + String.format("%06d", micros) + " seconds";
  }

  static String quoteIdent(String s) {
    return '"' + s.replace("\"", "\"\"") + '"';
  }

  // ---- transactions and connections ----

  /** The connection's transaction state as PgJDBC tracks it; null for a connection that is not PgJDBC's. */
  static TransactionState transactionState(Connection c) throws SQLException {
    if (c.isWrapperFor(BaseConnection.class)) {
      return c.unwrap(BaseConnection.class).getTransactionState();
    }
    return null;
  }

  /**
   * Usage error if a transaction is open on {@code c}: a lease change there would take effect only
   * when the caller commits, and the keepalive, on another connection, could not renew it until
   * then. Sends nothing.
   */
  static void requireOutsideTransaction(Connection c, String call) throws FencedLockException {
    try {
      TransactionState state = transactionState(c);
      if ((state != null && state != TransactionState.IDLE) || (state == null && !c.getAutoCommit())) {
        throw new UsageException(call + ": the connection is inside a transaction; the lease change must "
            + "commit on its own before the keepalive, on another connection, can see it. Commit or roll back "
            + "first, or use another connection");
      }
    } catch (UsageException e) {
      throw e;
    } catch (SQLException e) {
      throw FencedLockException.from(e);
    }
  }

  @FunctionalInterface
  interface SqlCall<T> {
    T call() throws SQLException;
  }

  /**
   * Runs {@code call} so that it commits on its own: on a connection with autocommit off (and no
   * transaction open, see {@link #requireOutsideTransaction}) autocommit is turned on for the call
   * and off again, which sends nothing more.
   */
  static <T> T onItsOwn(Connection c, SqlCall<T> call) throws SQLException {
    boolean autoCommit = c.getAutoCommit();
    if (autoCommit) {
      return call.call();
    }
    c.setAutoCommit(true);
    try {
      return call.call();
    } finally {
      c.setAutoCommit(false);
    }
  }

  static void rollback(Connection c) throws SQLException {
    if (c.getAutoCommit()) {
      // A transaction opened with a BEGIN of the caller's own: JDBC's rollback() refuses it.
      try (Statement st = c.createStatement()) {
        st.execute("ROLLBACK");
      }
    } else {
      c.rollback();
    }
  }

  /** Whether {@code e} means the connection is gone (rather than the statement refused). */
  static boolean isConnectionError(SQLException e, Connection c) {
    String state = e.getSQLState();
    if (state != null && (state.startsWith("08") || state.equals("57P01") || state.equals("57P02")
        || state.equals("57P03"))) {
      return true;
    }
    try {
      return c.isClosed();
    } catch (SQLException ignored) {
      return true;
    }
  }

  @Override
  public String toString() {
    return "FencedLock[keepaliveInterval=" + (keepaliveInterval == null ? "ttl/3" : keepaliveInterval)
        + ", retryAttempts=" + retryAttempts + ", transactionPooling=" + transactionPooling + "]";
  }
}
