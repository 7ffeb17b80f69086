package io.github.fencedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/** The lease: what it carries, its connection, release in and out of transactions, the scoped form. */
@ExtendWith(Db.Extension.class)
class LeaseTest {
  private final Db db = Db.get();

  @AfterEach
  void cleanUp() throws Exception {
    db.forceRelease("lease:carry", "lease:busy", "lease:twice", "docs:40", "docs:41", "lease:gone", "lease:scoped",
        "lease:lostscope", "lease:waited", "lease:sql", "lease:shared", "lease:permits", "lease:tx", "lease:pool",
        "lease:listeners", "lease:renew", "lease:readers", "lease:sem");
  }

  private static int backendPid(Connection c) throws SQLException {
    try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery("SELECT pg_backend_pid()")) {
      rs.next();
      return rs.getInt(1);
    }
  }

  @Test
  void aLeaseCarriesItsNameTokenTtlAndTheOptionsItWasTakenWith() throws Exception {
    Lease lease = db.locker().tryAcquire("lease:carry",
        AcquireOptions.defaults().ttl(Duration.ofSeconds(7)).holder("worker-1").keepalive(false));
    try (lease) {
      assertEquals("lease:carry", lease.name());
      assertEquals(Duration.ofSeconds(7), lease.ttl());
      assertEquals("worker-1", lease.holder());
      assertFalse(lease.sessionBound());
      assertFalse(lease.shared());
      assertEquals(1, lease.permits());
      assertFalse(lease.keepalive());
      assertEquals(lease.token(), ((Number) db.scalar(
          "SELECT token FROM fenced_lock_leases WHERE name = 'lease:carry' AND holder = 'worker-1' AND live")).longValue());
      Object ttl = db.scalar("SELECT extract(epoch FROM expires_at - acquired_at) FROM fenced_lock_leases WHERE name = 'lease:carry'");
      assertEquals(7.0, ((Number) ttl).doubleValue(), 0.001);
    }
  }

  @Test
  void tryAcquireReturnsNullWhenTheNameIsTakenAndGivesItsConnectionBack() throws Exception {
    Spy spy = Spy.of(db);
    FencedLock locks = FencedLock.builder(spy).build();
    try (Lease held = db.locker().acquire("lease:busy")) {
      assertNull(locks.tryAcquire("lease:busy"));
      assertEquals(1, spy.opened.get());
      assertEquals(1, spy.closed.get(), "the connection opened for a refused try must be closed");
      assertTrue(held.release());
    }
  }

  @Test
  void releasingTwiceSendsOneReleaseAndTheSecondReturnsFalse() throws Exception {
    Spy spy = Spy.of(db);
    try (Connection c = db.admin()) {
      Lease lease = FencedLock.builder(spy).build().acquire("lease:twice", AcquireOptions.defaults().connection(spy.wrap(c)));
      assertTrue(lease.release());
      assertFalse(lease.release());
      lease.close();
      assertEquals(1, spy.sentMatching("fenced_lock_release"), spy.sent.toString());
    }
  }

  private static void guardedUpdate(Connection c, int id, long token, String body) throws SQLException {
    try (PreparedStatement ps = c.prepareStatement("INSERT INTO docs (id, body, fence_token) VALUES (?, ?, ?) "
        + "ON CONFLICT (id) DO UPDATE SET body = excluded.body, fence_token = excluded.fence_token")) {
      ps.setInt(1, id);
      ps.setString(2, body);
      ps.setLong(3, token);
      ps.executeUpdate();
    }
  }

  @Test
  void guardedWritesThenReleaseThenCommitTheReleaseTakesEffectWithTheCommit() throws Exception {
    Lease lease = db.locker().acquire("docs:40");
    Connection c = lease.connection();
    c.setAutoCommit(false);
    guardedUpdate(c, 40, lease.token(), "written under the lease");
    assertTrue(lease.release());
    assertTrue(db.validate("docs:40", lease.token()), "the release took effect before the commit");
    assertFalse(c.isClosed(), "the connection of an open transaction must stay open until close()");
    c.commit();
    assertFalse(db.validate("docs:40", lease.token()));
    assertEquals("written under the lease", db.scalar("SELECT body FROM docs WHERE id = 40"));
    assertEquals("release", db.endedBy(lease.token()));
    lease.close();
    assertTrue(c.isClosed(), "close() gives the lease's own connection back");
  }

  @Test
  void aReleaseAfterAFailedTransactionRollsItBackFirstAndStillReleases() throws Exception {
    Lease lease = db.locker().acquire("docs:41");
    Connection c = lease.connection();
    c.setAutoCommit(false);
    guardedUpdate(c, 41, lease.token(), "rolled back");
    try (Statement st = c.createStatement()) {
      assertThrows(SQLException.class, () -> st.execute("SELECT 1 / 0"));
    }
    assertTrue(lease.release());
    assertFalse(db.validate("docs:41", lease.token()), "the release must not be lost with the failed transaction");
    assertNull(db.scalar("SELECT body FROM docs WHERE id = 41"));
    lease.close();
  }

  @Test
  void whenTheLeasesConnectionIsGoneTheReleaseIsSentOnANewConnection() throws Exception {
    Lease lease = db.locker().acquire("lease:gone");
    db.terminate(backendPid(lease.connection()));
    Db.sleep(100);
    assertTrue(lease.release(), "a plain lease outlives its connection and must still be released");
    assertEquals("release", db.endedBy(lease.token()));
    assertFalse(db.validate("lease:gone", lease.token()));
  }

  @Test
  void theScopedFormReleasesOnTheWayOutAlsoOnAnException() throws Exception {
    long[] token = new long[1];
    assertThrows(IllegalStateException.class, () -> {
      try (Lease lease = db.locker().acquire("lease:scoped")) {
        token[0] = lease.token();
        throw new IllegalStateException("the work failed");
      }
    });
    assertEquals("release", db.endedBy(token[0]));
  }

  @Test
  void theScopedFormDoesNotReleaseALostLease() throws Exception {
    Spy spy = Spy.of(db);
    FencedLock locks = FencedLock.builder(spy).build();
    long token;
    try (Lease lease = locks.acquire("lease:lostscope", AcquireOptions.defaults().ttl(Duration.ofMillis(900)))) {
      token = lease.token();
      db.forceRelease("lease:lostscope");
      lease.lostFuture().get(5, TimeUnit.SECONDS);
      Lease taken = db.locker().tryAcquire("lease:lostscope", AcquireOptions.defaults().keepalive(false));
      assertNotNull(taken, "someone else now holds the name");
      taken.close();
    }
    assertEquals(0, spy.sentMatching("fenced_lock_release"), spy.sent.toString());
    assertEquals("force_release", db.endedBy(token));
    assertEquals(spy.opened.get(), spy.closed.get(), "connections left open");
  }

  @Test
  void lostListenersRunExactlyOnceAndOneAddedAfterTheLossRunsAtOnce() throws Exception {
    AtomicInteger first = new AtomicInteger();
    AtomicInteger second = new AtomicInteger();
    AtomicInteger late = new AtomicInteger();
    Lease lease = db.locker().acquire("lease:listeners", AcquireOptions.defaults().ttl(Duration.ofMillis(900))
        .onLost(l -> first.incrementAndGet()));
    lease.addLostListener(l -> second.incrementAndGet());
    CompletableFuture<Void> lost = lease.lostFuture();
    lost.cancel(false); // the caller's copy: cancelling it changes nothing for the lease
    db.forceRelease("lease:listeners");
    lease.lostFuture().get(5, TimeUnit.SECONDS);
    assertTrue(lease.isLost());
    lease.addLostListener(l -> late.incrementAndGet());
    assertEquals(1, late.get(), "a listener added after the loss runs at once");
    Db.sleep(700); // more intervals: nothing may run twice
    assertEquals(1, first.get());
    assertEquals(1, second.get());
    assertEquals(1, late.get());
    assertThrows(LeaseLostException.class, lease::checkNotLost);
    assertFalse(lease.release());
  }

  @Test
  void anAcquireThatWaitedLongerThanAThirdOfItsTtlStartsWithItsWholeTtl() throws Exception {
    FencedLock locks = db.locker();
    Lease first = locks.acquire("lease:waited", AcquireOptions.defaults().ttl(Duration.ofMillis(1500)).keepalive(false));
    long start = System.nanoTime();
    // Waits about 1.5 s (the first lease's expiry), longer than its own ttl of 1 s: counted from
    // the send, its deadline would already have passed when it is granted.
    try (Lease second = locks.acquire("lease:waited", AcquireOptions.defaults().ttl(Duration.ofSeconds(1)))) {
      double waited = (System.nanoTime() - start) / 1e9;
      assertTrue(waited > 1.0, "waited only " + waited + " s");
      assertFalse(second.isLost(), "a lease granted after a wait must not start lost");
      Db.sleep(2000);
      assertFalse(second.isLost());
      assertTrue(db.validate("lease:waited", second.token()));
    }
    assertFalse(first.release());
  }

  @Test
  void sharedAndPermitsAreSentOnlyWhenTheyDifferFromTheirDefaults() throws Exception {
    Spy spy = Spy.of(db);
    try (Lease lease = FencedLock.builder(spy).build().acquire("lease:sql", AcquireOptions.defaults().keepalive(false))) {
      List<String> acquires = spy.sent.stream().filter(s -> s.contains("fenced_lock_acquire")).collect(
          java.util.stream.Collectors.toList());
      assertEquals(1, acquires.size(), spy.sent.toString());
      assertFalse(acquires.get(0).contains("shared"), acquires.get(0));
      assertFalse(acquires.get(0).contains("permits"), acquires.get(0));
      assertNotNull(lease);
    }
  }

  @Test
  void sharedLeasesLiveTogetherAndExcludeAnExclusiveOne() throws Exception {
    FencedLock locks = db.locker();
    try (Lease a = locks.tryAcquire("lease:shared", AcquireOptions.defaults().shared(true));
        Lease b = locks.tryAcquire("lease:shared", AcquireOptions.defaults().shared(true))) {
      assertNotNull(a);
      assertNotNull(b);
      assertNotEquals(a.token(), b.token());
      assertTrue(a.shared());
      assertNull(locks.tryAcquire("lease:shared"));
      assertEquals("shared", db.scalar("SELECT mode FROM fenced_lock_leases WHERE token = ?", a.token()));
    }
  }

  @Test
  void permitsLetThatManyLeasesLiveAtOnce() throws Exception {
    FencedLock locks = db.locker();
    AcquireOptions two = AcquireOptions.defaults().permits(2);
    try (Lease a = locks.tryAcquire("lease:permits", two); Lease b = locks.tryAcquire("lease:permits", two)) {
      assertNotNull(a);
      assertNotNull(b);
      assertNull(locks.tryAcquire("lease:permits", two));
      assertEquals(2, b.permits());
      assertEquals("permit", db.scalar("SELECT mode FROM fenced_lock_leases WHERE token = ?", b.token()));
    }
  }

  /** The server's live leases of {@code name}: token to "mode/permits". */
  private java.util.Map<Long, String> liveLeases(String name) throws SQLException {
    java.util.Map<Long, String> out = new java.util.TreeMap<>();
    for (Object row : db.column("SELECT token || ' ' || mode || '/' || coalesce(permits::text, '-') "
        + "FROM fenced_lock_leases WHERE name = ? AND live", name)) {
      String[] parts = ((String) row).split(" ");
      out.put(Long.parseLong(parts[0]), parts[1]);
    }
    return out;
  }

  @Test
  void sharedAndPermitsThroughEveryCallAreKeptAliveAndEachReleaseEndsItsOwn() throws Exception {
    // tryAcquire, acquire and run all send shared and permits; the keepalive renews such leases
    // past their ttl (a renew is per token), and a release ends that one lease only.
    FencedLock locks = db.locker();
    AcquireOptions shared = AcquireOptions.defaults().ttl(Duration.ofSeconds(1)).shared(true);
    AcquireOptions two = AcquireOptions.defaults().ttl(Duration.ofSeconds(1)).permits(2);
    Duration wait = Duration.ofSeconds(5);
    List<Long> tokens = new java.util.ArrayList<>();
    try (Lease r1 = locks.tryAcquire("lease:readers", shared);
        Lease r2 = locks.acquire("lease:readers", shared.maxWait(wait));
        Lease p1 = locks.tryAcquire("lease:sem", two); Lease p2 = locks.acquire("lease:sem", two.maxWait(wait))) {
      List.of(r1, r2, p1, p2).forEach(l -> tokens.add(l.token()));
      Db.sleep(2500); // two and a half ttls: only renewals keep them
      for (Lease l : List.of(r1, r2, p1, p2)) {
        assertFalse(l.isLost(), "lost: " + l.name() + " " + l.token());
      }
      assertEquals(java.util.Map.of(r1.token(), "shared/-", r2.token(), "shared/-"), liveLeases("lease:readers"));
      assertEquals(java.util.Map.of(p1.token(), "permit/2", p2.token(), "permit/2"), liveLeases("lease:sem"));
      // A third reader beside the two; no third permit beside two.
      long third = locks.run("lease:readers", shared.maxWait(wait), l -> {
        assertEquals(3, liveLeases("lease:readers").size());
        return l.token();
      });
      tokens.add(third);
      assertNull(locks.tryAcquire("lease:sem", two));
      assertTrue(p2.release());
      assertEquals(java.util.Set.of(p1.token()), liveLeases("lease:sem").keySet());
      long permit = locks.run("lease:sem", two.maxWait(wait), l -> {
        assertEquals(2, l.permits());
        assertEquals(java.util.Set.of(p1.token(), l.token()), liveLeases("lease:sem").keySet());
        return l.token();
      });
      tokens.add(permit);
    }
    assertEquals(java.util.Map.of(), liveLeases("lease:readers"));
    assertEquals(java.util.Map.of(), liveLeases("lease:sem"));
    for (long t : tokens) {
      assertEquals("release", db.endedBy(t), "token " + t);
    }
  }

  @Test
  void anAcquireOnAConnectionInsideATransactionIsAUsageErrorAndSendsNothing() throws Exception {
    Spy spy = Spy.of(db);
    try (Connection c = db.admin()) {
      c.setAutoCommit(false);
      try (Statement st = c.createStatement()) {
        st.execute("SELECT 1"); // the transaction is open now
      }
      Connection watched = spy.wrap(c);
      UsageException e = assertThrows(UsageException.class,
          () -> db.locker().acquire("lease:tx", AcquireOptions.defaults().connection(watched)));
      assertNull(e.getSQLState());
      assertTrue(e.getMessage().contains("inside a transaction"), e.getMessage());
      assertEquals(List.of(), spy.sent);
      c.rollback();
      // Autocommit off with no transaction open is fine: the grant commits on its own.
      try (Lease lease = db.locker().acquire("lease:tx", AcquireOptions.defaults().connection(c).keepalive(false))) {
        assertFalse(c.getAutoCommit(), "the caller's autocommit setting is kept");
        c.rollback(); // nothing of the grant to roll back
        assertTrue(db.validate("lease:tx", lease.token()));
        assertTrue(lease.renew());
      }
      assertNull(db.scalar("SELECT token FROM fenced_lock_leases WHERE name = 'lease:tx'"));
    }
  }

  @Test
  void aManualRenewExtendsALeaseWithoutKeepaliveAndItsLossIsSeen() throws Exception {
    Lease lease = db.locker().acquire("lease:renew", AcquireOptions.defaults().ttl(Duration.ofSeconds(1)).keepalive(false));
    for (int i = 0; i < 3; i++) {
      Db.sleep(500);
      assertTrue(lease.renew());
    }
    assertTrue(db.validate("lease:renew", lease.token()), "renewed every half ttl, it must be live after 1.5 ttl");
    db.forceRelease("lease:renew");
    assertFalse(lease.renew());
    assertTrue(lease.isLost());
    assertFalse(lease.release());
    lease.close();
  }

  @Test
  void sessionBoundIsRefusedWithTransactionPoolingAndSaysWhyBeforeAnythingIsSent() throws Exception {
    Spy spy = Spy.of(db);
    FencedLock pooled = FencedLock.builder(spy).transactionPooling(true).build();
    UsageException e = assertThrows(UsageException.class,
        () -> pooled.acquire("lease:pool", AcquireOptions.defaults().sessionBound(true)));
    assertTrue(e.getMessage().contains("pooled server connection"), e.getMessage());
    assertEquals(0, spy.opened.get());
    // Plain leases are right there.
    try (Lease plain = pooled.acquire("lease:pool", AcquireOptions.defaults().ttl(Duration.ofSeconds(2)))) {
      assertTrue(db.validate("lease:pool", plain.token()));
    }
  }
}
