package io.github.fencedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.IOException;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.extension.ExtendWith;

/** {@link FencedLock#run}: acquire, fn, release; FL001 starts over from the acquire. */
@ExtendWith(Db.Extension.class)
class RetryHelperTest {
  private final Db db = Db.get();

  @AfterEach
  void cleanUp() throws Exception {
    Child.killAll();
    db.forceRelease("inventory:1", "docs:20", "docs:21", "docs:22", "docs:23");
  }

  private static long longOf(Object o) {
    return ((Number) o).longValue();
  }

  @Test
  @Timeout(120)
  void fourInventoryProcessesOneSigstoppedPastItsTtlSellTheStockOfAHundredEachSaleCountedOnce() throws Exception {
    db.exec("INSERT INTO inventory (item_id, stock, fence_token) VALUES (1, 100, fenced_lock_try_acquire('inventory:1', '5 s'))");
    db.forceRelease("inventory:1");

    List<Child> sellers = new ArrayList<>();
    for (int i = 0; i < 4; i++) {
      sellers.add(Child.start("inventory", "--dsn", db.dsn, "--item", "1", "--sales", "25", "--ttl", "1"));
    }
    for (Child c : sellers) {
      c.await("a first sale", Duration.ofSeconds(60), 0, e -> "sold".equals(e.name()));
    }

    // Stop whichever seller holds the lease (between its acquire and its release), so that the
    // others take over at its expiry and its write after the pause is refused.
    Child victim = null;
    Long pausedToken = null;
    long stopped = 0;
    try (Connection look = db.admin(); PreparedStatement holding = look.prepareStatement(
        "SELECT holder, token FROM fenced_lock_leases WHERE name = 'inventory:1' AND live")) {
      for (int tries = 0; tries < 2000 && pausedToken == null; tries++) {
        String holder = null;
        long token = 0;
        try (ResultSet rs = holding.executeQuery()) {
          if (rs.next()) {
            holder = rs.getString(1);
            token = rs.getLong(2);
          }
        }
        Child candidate = null;
        for (Child c : sellers) {
          if (("inventory-" + c.pid()).equals(holder) && c.events("done").isEmpty()) {
            candidate = c;
          }
        }
        if (candidate == null) {
          Db.sleep(1);
          continue;
        }
        candidate.signal("STOP");
        stopped = System.nanoTime();
        Db.sleep(50); // what it had sent before the stop lands
        try (ResultSet rs = holding.executeQuery()) {
          if (rs.next() && rs.getLong(2) == token) {
            victim = candidate;
            pausedToken = token;
          }
        }
        if (pausedToken == null) {
          candidate.signal("CONT");
        }
      }
    }
    assertTrue(pausedToken != null, "could not stop a seller while it held the lease");
    String victimHolder = "inventory-" + victim.pid();
    long left = stopped + Duration.ofMillis(2500).toNanos() - System.nanoTime();
    if (left > 0) {
      Db.sleep(left / 1_000_000);
    }
    victim.signal("CONT");

    Map<Long, Integer> written = new TreeMap<>();
    int total = 0;
    for (Child c : sellers) {
      assertEquals(0, c.waitFor(Duration.ofSeconds(60)), c.describe());
      assertEquals(List.of(), c.badLines());
      List<Child.Event> done = c.events("done");
      assertEquals(1, done.size(), c.events().toString());
      assertEquals(25, done.get(0).num("sold"), "process " + c.pid() + " " + c.events() + c.describe());
      assertTrue(c.events("sold_out").isEmpty());
      for (Child.Event e : c.events("sold")) {
        written.merge(e.num("stock"), 1, Integer::sum);
        total++;
      }
    }
    StringBuilder sales = new StringBuilder();
    for (Child c : sellers) {
      sales.append("\n  ").append(c.pid()).append(c == victim ? " (stopped)" : "").append(": ");
      c.events("sold").forEach(e -> sales.append(e.num("stock")).append(' '));
    }
    assertEquals(100, total, "sales:" + sales);
    for (long s = 0; s < 100; s++) {
      assertEquals(1, written.getOrDefault(s, 0), "stock " + s + " written " + written.get(s) + " times; sales:" + sales);
    }
    assertEquals(0, ((Number) db.scalar("SELECT stock FROM inventory WHERE item_id = 1")).intValue());
    // The paused lease was taken over at its expiry, not released: the pause really did outlive
    // the ttl with the lease held, and the victim's next write came after someone else's.
    assertEquals("expiry", db.endedBy(pausedToken));
    Object later = db.scalar("SELECT count(*) FROM fenced_lock_history WHERE name = 'inventory:1' AND token > ? "
        + "AND holder <> ?", pausedToken, victimHolder);
    assertTrue(longOf(later) > 0, "nobody else sold while the victim was stopped");
    System.out.printf("retry helper: 4 processes sold 100, one stopped %.1f s holding token %d%n",
        2.5, pausedToken);
  }

  @Test
  void runReturnsWhatFnReturnedAndReleasesTheLease() throws Exception {
    AtomicInteger calls = new AtomicInteger();
    long[] token = new long[1];
    String result = db.locker().run("docs:20", lease -> {
      calls.incrementAndGet();
      token[0] = lease.token();
      assertTrue(lease.keepalive(), "run's lease has a keepalive");
      return "sold";
    });
    assertEquals("sold", result);
    assertEquals(1, calls.get());
    assertEquals("release", db.endedBy(token[0]));
  }

  private static void guardedWrite(Lease lease, int id) throws SQLException {
    try (PreparedStatement ps = lease.connection().prepareStatement(
        "INSERT INTO docs (id, body, fence_token) VALUES (?, 'run', ?) "
            + "ON CONFLICT (id) DO UPDATE SET body = excluded.body, fence_token = excluded.fence_token")) {
      ps.setInt(1, id);
      ps.setLong(2, lease.token());
      ps.executeUpdate();
    }
  }

  @Test
  void runStartsOverFromTheAcquireOnFL001AndDropsTheLostLeaseWithoutARelease() throws Exception {
    List<Long> tokens = new ArrayList<>();
    long result = db.locker().run("docs:21", lease -> {
      tokens.add(lease.token());
      if (tokens.size() == 1) {
        // Someone ends the lease behind the holder's back; its write is then refused.
        db.forceRelease("docs:21");
      }
      guardedWrite(lease, 21);
      return lease.token();
    });
    assertEquals(2, tokens.size());
    assertNotEquals(tokens.get(0), tokens.get(1));
    assertEquals(tokens.get(1), result);
    assertEquals("force_release", db.endedBy(tokens.get(0)), "the lost lease must not be released");
    assertEquals("release", db.endedBy(tokens.get(1)));
    assertEquals(tokens.get(1), longOf(db.scalar("SELECT fence_token FROM docs WHERE id = 21")));
  }

  @Test
  void runThrowsTheLastFL001AsAStaleTokenErrorAfterAllItsAttempts() throws Exception {
    AtomicInteger calls = new AtomicInteger();
    FencedLock locks = FencedLock.builder(db.dsn).retryAttempts(3).build();
    StaleTokenException e = assertThrows(StaleTokenException.class, () -> locks.run("docs:22", lease -> {
      calls.incrementAndGet();
      db.forceRelease("docs:22");
      guardedWrite(lease, 22);
      return null;
    }));
    assertEquals(3, calls.get());
    assertEquals("FL001", e.getSQLState());
    assertTrue(e.detail().contains("presented token"), e.detail());
  }

  @Test
  void runThrowsAnyOtherErrorAtOnceAfterTheRelease() throws Exception {
    AtomicInteger calls = new AtomicInteger();
    long[] token = new long[1];
    IOException thrown = new IOException("the disk is full");
    IOException e = assertThrows(IOException.class, () -> db.locker().run("docs:23", lease -> {
      calls.incrementAndGet();
      token[0] = lease.token();
      throw thrown;
    }));
    assertSame(thrown, e);
    assertEquals(1, calls.get());
    assertEquals("release", db.endedBy(token[0]));

    // An SQLSTATE that is not FL001 is not retried either.
    SQLException division = assertThrows(SQLException.class, () -> db.locker().run("docs:23", lease -> {
      calls.incrementAndGet();
      try (PreparedStatement ps = lease.connection().prepareStatement("SELECT 1 / 0")) {
        ps.executeQuery();
      }
      return null;
    }));
    assertEquals("22012", division.getSQLState());
    assertEquals(2, calls.get());
  }

  @Test
  void runSeesFL001ThroughAnExceptionThatWrapsItAndAfterALossTheClientSaw() throws Exception {
    List<Long> tokens = new ArrayList<>();
    long result = db.locker().run("docs:20", AcquireOptions.defaults().ttl(Duration.ofSeconds(1)), lease -> {
      tokens.add(lease.token());
      if (tokens.size() == 1) {
        db.forceRelease("docs:20");
        try {
          guardedWrite(lease, 20);
        } catch (SQLException e) {
          throw new IllegalStateException("a framework's unchecked wrapper", e);
        }
      }
      if (tokens.size() == 2) {
        db.forceRelease("docs:20");
        Db.await("the keepalive's next renew says the lease ended", Duration.ofSeconds(5), lease::isLost);
        lease.checkNotLost(); // stops the work before any write
      }
      return lease.token();
    });
    assertEquals(3, tokens.size());
    assertEquals(tokens.get(2), result);
    assertEquals("force_release", db.endedBy(tokens.get(0)));
    assertEquals("force_release", db.endedBy(tokens.get(1)));
    assertEquals("release", db.endedBy(tokens.get(2)));
  }

  @Test
  void runRollsBackTheFailedTransactionOfTheCallersConnectionBeforeItsNextAttempt() throws Exception {
    try (Connection own = db.admin()) {
      List<Long> tokens = new ArrayList<>();
      db.locker().run("docs:21", AcquireOptions.defaults().connection(own), lease -> {
        tokens.add(lease.token());
        own.setAutoCommit(false);
        if (tokens.size() == 1) {
          db.forceRelease("docs:21");
        }
        guardedWrite(lease, 21); // the first attempt leaves its transaction failed, not rolled back
        own.commit();
        own.setAutoCommit(true);
        return null;
      });
      assertEquals(2, tokens.size());
      assertFalse(own.isClosed(), "run must not close the caller's connection");
      assertEquals("release", db.endedBy(tokens.get(1)));
    }
  }
}
