package io.github.fencedlock.examples;

import io.github.fencedlock.AcquireOptions;
import io.github.fencedlock.FencedLock;
import io.github.fencedlock.FencedLockException;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.util.Set;

/**
 * The conformance example {@code inventory} (clients/README.md): sells up to N units of an item
 * of {@code inventory(item_id int PRIMARY KEY, stock int NOT NULL, fence_token bigint)}, guarded
 * by {@code fenced_lock_guard('inventory:{item_id}', 'fence_token')}, each sale through the retry
 * helper: acquire, read the stock, write stock - 1 with the token, release.
 *
 * <pre>
 * inventory --dsn DSN --item ID --sales N --ttl SECONDS
 * </pre>
 */
public final class Inventory {
  private static final int SOLD_OUT = -1;

  private Inventory() {}

  public static void main(String[] args) {
    System.exit(run(args));
  }

  static int run(String[] args) {
    Cli cli;
    int item;
    int sales;
    Duration ttl;
    try {
      cli = Cli.parse(args, Set.of("dsn", "item", "sales", "ttl"), Set.of(), Set.of());
      item = cli.integer("item");
      sales = cli.integer("sales");
      ttl = cli.seconds("ttl");
      if (sales < 0) {
        throw new Cli.Usage("--sales must not be negative");
      }
    } catch (Cli.Usage e) {
      System.err.println("inventory: " + e.getMessage());
      System.err.println("usage: inventory --dsn DSN --item ID --sales N --ttl SECONDS");
      return 2;
    }

    Cli.Out out = new Cli.Out();
    out.flushEarly();
    int sold = 0;
    try {
      FencedLock locks = FencedLock.builder(cli.get("dsn")).build();
      try (Connection conn = locks.openConnection()) {
        // One connection for every sale's lease (the keepalive of each opens its own). The
        // holder names this process in fenced_lock_leases and the history.
        AcquireOptions options = AcquireOptions.defaults().ttl(ttl).connection(conn)
            .holder("inventory-" + ProcessHandle.current().pid());
        String name = "inventory:" + item;
        while (sold < sales) {
          int stock = locks.run(name, options, lease -> sellOne(lease.connection(), item, lease.token()));
          if (stock == SOLD_OUT) {
            out.event("event", "sold_out");
            break;
          }
          sold++;
          out.event("event", "sold", "stock", stock);
        }
      }
      out.event("event", "done", "sold", sold);
      return 0;
    } catch (SQLException | RuntimeException e) {
      out.error(e instanceof SQLException ? FencedLockException.from((SQLException) e) : e);
      return 1;
    }
  }

  /** Reads the stock and writes one less with the token; FL001 when the lease was lost meanwhile. */
  private static int sellOne(Connection c, int item, long token) throws SQLException {
    c.setAutoCommit(false);
    try {
      int stock;
      try (PreparedStatement ps = c.prepareStatement("SELECT stock FROM inventory WHERE item_id = ?")) {
        ps.setInt(1, item);
        try (ResultSet rs = ps.executeQuery()) {
          if (!rs.next()) {
            throw new SQLException("no inventory row with item_id " + item, "P0002");
          }
          stock = rs.getInt(1);
        }
      }
      if (stock <= 0) {
        c.commit();
        return SOLD_OUT;
      }
      try (PreparedStatement ps =
          c.prepareStatement("UPDATE inventory SET stock = ?, fence_token = ? WHERE item_id = ?")) {
        ps.setInt(1, stock - 1);
        ps.setLong(2, token);
        ps.setInt(3, item);
        ps.executeUpdate();
      }
      c.commit();
      return stock - 1;
    } catch (SQLException e) {
      try {
        c.rollback();
      } catch (SQLException ignored) {
        // The connection is gone: so is the transaction.
      }
      throw e;
    } finally {
      try {
        c.setAutoCommit(true);
      } catch (SQLException ignored) {
        // As above; the next acquire reports it.
      }
    }
  }
}
