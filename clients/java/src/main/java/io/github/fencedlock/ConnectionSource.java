package io.github.fencedlock;

import io.github.fencedlock.internal.KeepaliveSocketFactory;
import io.github.fencedlock.internal.KeepaliveSocketFactory.WaitingSocket;
import java.sql.Connection;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.Map;
import java.util.Properties;
import javax.sql.DataSource;

/** Where a locker's connections come from: a connection string, a DataSource (a pool) or a factory. */
abstract class ConnectionSource {
  static final String KEEPALIVE_APPLICATION_NAME = "fenced_lock_keepalive";

  /** A connection for a lease (when the caller passes none): autocommit on. */
  abstract Connection openLease() throws SQLException;

  /** A keepalive's connection: autocommit on, application_name {@code fenced_lock_keepalive}. */
  abstract Connection openKeepalive() throws SQLException;

  /**
   * Gives a keepalive's connection back, as it was handed out (a pool hands it out again). {@code
   * graceful}: the keepalive ends with its lease, and the connection is healthy; the close may
   * then wait (briefly) until the server has ended the session.
   */
  void closeKeepalive(Connection c, boolean graceful) {
    closeQuietly(c);
  }

  static void closeQuietly(AutoCloseable c) {
    if (c == null) {
      return;
    }
    try {
      c.close();
    } catch (Exception ignored) {
      // Nothing to do about a connection that cannot even close; it is dropped either way.
    }
  }

  static ConnectionSource of(Dsn dsn, boolean transactionPooling) {
    return new FromDsn(dsn, transactionPooling);
  }

  static ConnectionSource of(DataSource ds) {
    return new FromFactory(ds::getConnection);
  }

  static ConnectionSource of(ConnectionFactory f) {
    return new FromFactory(f);
  }

  private static final class FromDsn extends ConnectionSource {
    private final org.postgresql.Driver driver = new org.postgresql.Driver();
    private final String url;
    private final Properties lease;
    private final Properties keepalive;
    private final Map<Connection, WaitingSocket> sockets = Collections.synchronizedMap(new IdentityHashMap<>());

    FromDsn(Dsn dsn, boolean transactionPooling) {
      this.url = dsn.url;
      this.lease = new Properties();
      this.lease.putAll(dsn.properties);
      if (transactionPooling && !lease.containsKey("prepareThreshold")) {
        // A transaction pooler hands each transaction to any server connection: statements
        // prepared by name on one are missing on the next.
        lease.setProperty("prepareThreshold", "0");
      }
      this.keepalive = new Properties();
      this.keepalive.putAll(lease);
      this.keepalive.setProperty("ApplicationName", KEEPALIVE_APPLICATION_NAME);
      if (!keepalive.containsKey("socketFactory")) {
        this.keepalive.setProperty("socketFactory", KeepaliveSocketFactory.class.getName());
      }
    }

    @Override
    Connection openLease() throws SQLException {
      return open(lease);
    }

    @Override
    Connection openKeepalive() throws SQLException {
      KeepaliveSocketFactory.takeLast();
      Connection c = open(keepalive);
      // PgJDBC makes the socket on this thread (unless a loginTimeout has it connect on another:
      // then there is nothing to wait for at the close, and nothing is lost but the wait).
      WaitingSocket socket = KeepaliveSocketFactory.takeLast();
      if (socket != null) {
        sockets.put(c, socket);
      }
      return c;
    }

    @Override
    void closeKeepalive(Connection c, boolean graceful) {
      if (c == null) {
        return;
      }
      WaitingSocket socket = sockets.remove(c);
      if (graceful && socket != null) {
        socket.awaitPeerOnClose();
      }
      closeQuietly(c);
    }

    private Connection open(Properties props) throws SQLException {
      Connection c = driver.connect(url, props);
      if (c == null) {
        throw new SQLException("PgJDBC does not accept the URL " + url, "08001");
      }
      return c;
    }
  }

  private static final class FromFactory extends ConnectionSource {
    private final ConnectionFactory factory;

    FromFactory(ConnectionFactory factory) {
      this.factory = factory;
    }

    @Override
    Connection openLease() throws SQLException {
      Connection c = connect();
      try {
        // A pool may be configured to hand out connections with autocommit off; an acquire
        // must commit on its own before the keepalive can renew it from another connection.
        if (!c.getAutoCommit()) {
          c.setAutoCommit(true);
        }
        return c;
      } catch (SQLException | RuntimeException e) {
        closeQuietly(c);
        throw e;
      }
    }

    @Override
    Connection openKeepalive() throws SQLException {
      Connection c = connect();
      try {
        if (!c.getAutoCommit()) {
          c.setAutoCommit(true);
        }
        try (Statement st = c.createStatement()) {
          st.execute("SET application_name = '" + KEEPALIVE_APPLICATION_NAME + "'");
        }
        return c;
      } catch (SQLException | RuntimeException e) {
        closeQuietly(c);
        throw e;
      }
    }

    @Override
    void closeKeepalive(Connection c, boolean graceful) {
      if (c == null) {
        return;
      }
      try {
        if (!c.isClosed()) {
          try (Statement st = c.createStatement()) {
            st.execute("RESET application_name");
          }
        }
      } catch (SQLException ignored) {
        // A broken connection: the pool drops it when it is closed.
      }
      closeQuietly(c);
    }

    private Connection connect() throws SQLException {
      Connection c = factory.connect();
      if (c == null) {
        throw new SQLException("the connection factory returned null", "08001");
      }
      return c;
    }
  }
}
