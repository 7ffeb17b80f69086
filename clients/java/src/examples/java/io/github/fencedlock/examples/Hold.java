package io.github.fencedlock.examples;

import io.github.fencedlock.AcquireOptions;
import io.github.fencedlock.FencedLock;
import io.github.fencedlock.FencedLockException;
import io.github.fencedlock.Lease;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.sql.Types;
import java.time.Duration;
import java.util.Set;
import java.util.regex.Pattern;

/**
 * The conformance example {@code hold} (clients/README.md): acquire with keepalive, hold, maybe
 * write with the token, release.
 *
 * <pre>
 * hold --dsn DSN --name NAME --ttl SECONDS --hold SECONDS [--wait SECONDS] [--write TABLE:ID]
 *      [--session-bound] [--shared] [--permits N] [--holder TEXT]
 * </pre>
 *
 * Exit status: 0 done, 3 the lease was lost, 1 another failure, 2 a bad command line.
 */
public final class Hold {
  private static final Pattern TABLE = Pattern.compile("[A-Za-z_][A-Za-z0-9_$]*(\\.[A-Za-z_][A-Za-z0-9_$]*)?");
  private static final String USAGE = "usage: hold --dsn DSN --name NAME --ttl SECONDS --hold SECONDS "
      + "[--wait SECONDS] [--write TABLE:ID] [--session-bound] [--shared] [--permits N] [--holder TEXT]";

  private Hold() {}

  public static void main(String[] args) {
    System.exit(run(args));
  }

  static int run(String[] args) {
    Cli cli;
    Duration ttl;
    Duration hold;
    Duration wait;
    Integer permits;
    String table = null;
    String id = null;
    try {
      cli = Cli.parse(args, Set.of("dsn", "name", "ttl", "hold"), Set.of("wait", "write", "permits", "holder"),
          Set.of("session-bound", "shared"));
      ttl = cli.seconds("ttl");
      hold = cli.seconds("hold");
      wait = cli.seconds("wait");
      permits = cli.integer("permits");
      if (hold.isNegative()) {
        throw new Cli.Usage("--hold must not be negative");
      }
      String write = cli.get("write");
      if (write != null) {
        int colon = write.lastIndexOf(':');
        if (colon <= 0 || colon == write.length() - 1 || !TABLE.matcher(write.substring(0, colon)).matches()) {
          throw new Cli.Usage("--write wants TABLE:ID, not " + write);
        }
        table = write.substring(0, colon);
        id = write.substring(colon + 1);
      }
    } catch (Cli.Usage e) {
      System.err.println("hold: " + e.getMessage());
      System.err.println(USAGE);
      return 2;
    }

    Cli.Out out = new Cli.Out();
    try {
      FencedLock locks = FencedLock.builder(cli.get("dsn")).build();
      AcquireOptions options = AcquireOptions.defaults()
          .ttl(ttl)
          .maxWait(wait)
          .holder(cli.get("holder"))
          .sessionBound(cli.flag("session-bound"))
          .shared(cli.flag("shared"))
          .permits(permits == null ? 1 : permits)
          .onRenewed(l -> out.event("event", "renewed", "token", l.token()))
          .onLost(l -> out.event("event", "lost", "token", l.token()));
      Lease lease = locks.acquire(cli.get("name"), options);
      out.open("event", "acquired", "token", lease.token());

      // Not cut short by a loss: the write below must still be tried, and refused.
      sleep(hold);

      if (table != null) {
        write(locks, lease, table, id, out);
      }
      if (lease.isLost()) {
        lease.abandon();
        return 3;
      }
      boolean released = lease.release();
      if (lease.isLost()) {
        // Lost while the release waited for the keepalive to stop: nothing was sent.
        lease.abandon();
        return 3;
      }
      out.event("event", "released", "token", lease.token(), "released", released);
      lease.close();
      return released ? 0 : 3;
    } catch (FencedLockException | RuntimeException e) {
      out.error(e);
      return 1;
    }
  }

  /** The guarded write, in a transaction of its own, on the lease's connection. */
  private static void write(FencedLock locks, Lease lease, String table, String id, Cli.Out out) {
    String sql = "UPDATE " + table + " SET fence_token = ? WHERE id = ?";
    try {
      update(lease.connection(), sql, lease.token(), id);
      out.event("event", "write", "ok", true);
    } catch (SQLException e) {
      if (isConnectionGone(e)) {
        // The lease's connection is gone (a session-bound lease's session was ended): the
        // write still goes to the database, which must refuse the token.
        System.err.println("hold: the lease's connection is gone (" + e.getMessage() + "); writing on a new one");
        try (Connection fresh = locks.openConnection()) {
          update(fresh, sql, lease.token(), id);
          out.event("event", "write", "ok", true);
        } catch (SQLException e2) {
          out.event("event", "write", "ok", false, "sqlstate", e2.getSQLState());
        }
        return;
      }
      out.event("event", "write", "ok", false, "sqlstate", e.getSQLState());
    }
  }

  private static void update(Connection c, String sql, long token, String id) throws SQLException {
    c.setAutoCommit(false);
    try (PreparedStatement ps = c.prepareStatement(sql)) {
      ps.setLong(1, token);
      ps.setObject(2, id, Types.OTHER); // typed by the server, whatever the column's type
      ps.executeUpdate();
      c.commit();
    } catch (SQLException e) {
      try {
        c.rollback();
      } catch (SQLException ignored) {
        // The connection is gone; so is the transaction.
      }
      throw e;
    } finally {
      try {
        c.setAutoCommit(true);
      } catch (SQLException ignored) {
        // As above.
      }
    }
  }

  private static boolean isConnectionGone(SQLException e) {
    String s = e.getSQLState();
    return s != null && (s.startsWith("08") || s.startsWith("57P0"));
  }

  static void sleep(Duration d) {
    long until = System.nanoTime() + d.toNanos();
    while (true) {
      long left = until - System.nanoTime();
      if (left <= 0) {
        return;
      }
      try {
        Thread.sleep(left / 1_000_000, (int) (left % 1_000_000));
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return;
      }
    }
  }
}
