package io.github.fencedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;
import org.junit.jupiter.api.parallel.Isolated;

/** The keepalive: renewals, reconnects, the lost signal, and nothing sent after a release. */
@ExtendWith(Db.Extension.class)
@Isolated("counts the database's keepalive connections, which must all be its own")
class KeepaliveTest {
  private final Db db = Db.get();
  private final List<Lease> leases = new ArrayList<>();

  @AfterEach
  void cleanUp() throws Exception {
    for (Lease l : leases) {
      l.abandon();
    }
    db.forceRelease("ka:section", "ka:control", "ka:reconnect", "ka:session", "ka:release", "ka:inflight", "docs:7", "docs:8");
  }

  private Lease keep(Lease l) {
    leases.add(l);
    return l;
  }

  /** The keepalive connection that appears after {@code before} was taken (this database only). */
  private int newKeepalivePid(List<Object> before) {
    AtomicInteger pid = new AtomicInteger();
    Db.await("a new keepalive connection in pg_stat_activity", Duration.ofSeconds(10), () -> {
      for (Object p : db.keepalivePids()) {
        if (!before.contains(p)) {
          pid.set((Integer) p);
          return true;
        }
      }
      return false;
    });
    return pid.get();
  }

  @Test
  void keepaliveKeepsACriticalSectionOfThreeTtlsAlive() throws Exception {
    AtomicInteger renewals = new AtomicInteger();
    Lease lease = keep(db.locker().acquire("ka:section",
        AcquireOptions.defaults().ttl(Duration.ofSeconds(1)).onRenewed(l -> renewals.incrementAndGet())));
    long start = System.nanoTime();
    Db.sleep(3300); // the critical section: 3.3 x the ttl
    assertFalse(lease.isLost(), "lost during the section");
    assertTrue(db.validate("ka:section", lease.token()), "the server says the lease is not live after 3.3 ttl");
    assertEquals(Boolean.TRUE, db.scalar("SELECT live FROM fenced_lock_leases WHERE name = 'ka:section' AND token = ?",
        lease.token()));
    // At ttl/3 a section of 3.3 ttl sees about nine renewals; on a loaded machine fewer, but at
    // least one per ttl, or the lease would have expired.
    assertTrue(renewals.get() >= 3, "renewals: " + renewals.get());
    System.out.printf("keepalive: %d renewals in %.1f s at ttl 1 s%n", renewals.get(),
        (System.nanoTime() - start) / 1e9);
    assertTrue(lease.release());
    assertEquals("release", db.endedBy(lease.token()));
  }

  @Test
  void withoutKeepaliveTheSameSectionOutlivesItsLease() throws Exception {
    // The control of the test above: the same ttl, nobody renewing.
    Lease lease = keep(db.locker().acquire("ka:control",
        AcquireOptions.defaults().ttl(Duration.ofSeconds(1)).keepalive(false)));
    Db.sleep(1500);
    assertFalse(db.validate("ka:control", lease.token()));
    assertTrue(lease.isLost(), "past its ttl without a renew, the lease must count as lost");
    assertFalse(lease.release(), "a lost lease is not released");
  }

  @Test
  void terminatingTheKeepaliveConnectionReconnectsAndRenewsAndTheLeaseStaysLive() throws Exception {
    List<Object> before = db.keepalivePids();
    AtomicInteger renewals = new AtomicInteger();
    Lease lease = keep(db.locker().acquire("ka:reconnect",
        AcquireOptions.defaults().ttl(Duration.ofSeconds(2)).onRenewed(l -> renewals.incrementAndGet())));
    int first = newKeepalivePid(before);
    db.terminate(first);
    long terminated = System.nanoTime();
    int countAtTerminate = renewals.get();

    List<Object> without = new ArrayList<>(before);
    without.add(first);
    int second = newKeepalivePid(without);
    assertNotEquals(first, second);
    System.out.printf("keepalive: reconnected %.0f ms after pg_terminate_backend%n",
        (System.nanoTime() - terminated) / 1e6);

    Db.await("renewals on the new connection", Duration.ofSeconds(10), () -> renewals.get() >= countAtTerminate + 2);
    // Well past the ttl after the terminate: only renewals on the new connection can have kept it.
    long left = terminated + TimeUnit.MILLISECONDS.toNanos(3500) - System.nanoTime();
    if (left > 0) {
      Db.sleep(TimeUnit.NANOSECONDS.toMillis(left));
    }
    assertFalse(lease.isLost());
    assertTrue(db.validate("ka:reconnect", lease.token()), "the lease ended although the keepalive reconnected");
    List<Object> now = db.keepalivePids();
    now.removeAll(before);
    assertEquals(List.of(second), now, "one keepalive connection, the new one");
    assertTrue(lease.release());
  }

  @Test
  void terminatingASessionBoundLeasesOwnConnectionEndsItAndTheClientSignalsLostAtItsNextRenew() throws Exception {
    AtomicInteger lostCalls = new AtomicInteger();
    AtomicLong lostAt = new AtomicLong();
    AtomicLong deadlineAtLoss = new AtomicLong();
    Lease lease = keep(db.locker().acquire("ka:session",
        AcquireOptions.defaults().ttl(Duration.ofSeconds(3)).sessionBound(true).onLost(l -> {
          lostAt.set(System.nanoTime());
          deadlineAtLoss.set(l.deadline());
          lostCalls.incrementAndGet();
        })));
    int pid;
    try (Statement st = lease.connection().createStatement(); ResultSet rs = st.executeQuery("SELECT pg_backend_pid()")) {
      rs.next();
      pid = rs.getInt(1);
    }
    CompletableFuture<Void> lost = lease.lostFuture();
    db.terminate(pid);
    long terminated = System.nanoTime();

    Db.await("the server ends the session-bound lease", Duration.ofSeconds(5),
        () -> !db.validate("ka:session", lease.token()));
    lost.get(10, TimeUnit.SECONDS);
    double afterMs = (lostAt.get() - terminated) / 1e6;
    System.out.printf("keepalive: session-bound lease signalled lost %.0f ms after its session was terminated%n", afterMs);
    // Lost from the renew's false, before the client's own deadline would have said so.
    assertTrue(lostAt.get() - deadlineAtLoss.get() < 0,
        "lost only at the deadline, not from the next renew: " + afterMs + " ms");
    assertTrue(lease.isLost());
    Db.sleep(300);
    assertEquals(1, lostCalls.get(), "the lost listener must run exactly once");
    Db.await("the keepalive connection is closed after the loss", Duration.ofSeconds(5),
        () -> db.keepalivePids().isEmpty());
    assertFalse(lease.release(), "a lost lease is not released");
  }

  @Test
  void noRenewIsSentAfterReleaseTheKeepaliveConnectionIsGoneWhenReleaseReturns() throws Exception {
    List<Object> before = db.keepalivePids();
    AtomicInteger renewals = new AtomicInteger();
    FencedLock locks = FencedLock.builder(db.dsn).keepaliveInterval(Duration.ofMillis(100)).build();
    Lease lease = keep(locks.acquire("ka:release",
        AcquireOptions.defaults().ttl(Duration.ofSeconds(2)).onRenewed(l -> renewals.incrementAndGet())));
    int pid = newKeepalivePid(before);
    Db.await("a few renewals", Duration.ofSeconds(10), () -> renewals.get() >= 3);

    try (Connection look = db.admin(); PreparedStatement ps =
        look.prepareStatement("SELECT count(*) FROM pg_stat_activity WHERE pid = ?")) {
      ps.setInt(1, pid);
      assertTrue(lease.release());
      // Right when release returns: the keepalive connection was closed before the release was
      // sent, and its backend has left.
      try (ResultSet rs = ps.executeQuery()) {
        rs.next();
        assertEquals(0, rs.getInt(1), "keepalive backend " + pid + " still there when release returned");
      }
    }
    int atRelease = renewals.get();
    assertEquals("release", db.endedBy(lease.token()));

    Db.sleep(500); // five intervals: a keepalive still running would renew, or reconnect
    assertEquals(atRelease, renewals.get(), "a renew after the release");
    assertEquals(before, db.keepalivePids(), "a keepalive connection after the release");
  }

  @Test
  void aGuardedTransactionOpenForThreeTtlsKeepsItsLeaseAndItsCommitIsAccepted() throws Exception {
    // A renew takes the lease's lock in a mode the guard's does not conflict with: the keepalive
    // renews all through the holder's open guarded transaction.
    AtomicInteger renewals = new AtomicInteger();
    Lease lease = keep(db.locker().acquire("docs:7",
        AcquireOptions.defaults().ttl(Duration.ofSeconds(1)).onRenewed(l -> renewals.incrementAndGet())));
    Connection c = lease.connection();
    c.setAutoCommit(false);
    try (PreparedStatement ps = c.prepareStatement("INSERT INTO docs (id, body, fence_token) VALUES (7, ?, ?) "
        + "ON CONFLICT (id) DO UPDATE SET body = excluded.body, fence_token = excluded.fence_token")) {
      ps.setString(1, "opened");
      ps.setLong(2, lease.token());
      ps.executeUpdate();
      int atOpen = renewals.get();
      Db.sleep(3000); // three ttls with the transaction open
      ps.setString(1, "three ttls later");
      ps.executeUpdate();
      int during = renewals.get() - atOpen;
      assertTrue(db.validate("docs:7", lease.token()), "the lease expired under its open transaction");
      c.commit();
      System.out.printf("keepalive: %d renewals during a guarded transaction of 3 s at ttl 1 s%n", during);
      assertTrue(during >= 3, "renewals while the transaction was open: " + during);
    }
    c.setAutoCommit(true);
    assertFalse(lease.isLost());
    assertTrue(lease.release());
    assertEquals("three ttls later", db.scalar("SELECT body FROM docs WHERE id = 7"));
    assertEquals(lease.token(), ((Number) db.scalar("SELECT fence_token FROM docs WHERE id = 7")).longValue());
    assertEquals("release", db.endedBy(lease.token()));
  }

  @Test
  void aRenewHeldUpByTheHoldersOwnTransactionHoldsUpItsReleaseOnlyUntilTheAttemptIsGivenUp() throws Exception {
    // What a renew does wait for is another change of the same lease in an open transaction, here
    // the holder's own: a leader proclaims, writes, releases, then commits. The release waits for
    // the renew in flight, which waits for this very transaction until the attempt is given up
    // (max(interval, 1 s)): then the release goes out, long before the deadline.
    FencedLock locks = FencedLock.builder(db.dsn).keepaliveInterval(Duration.ofMillis(200)).build();
    List<Object> before = db.keepalivePids();
    Lease lease = keep(locks.acquire("docs:8", AcquireOptions.defaults().ttl(Duration.ofSeconds(20))));
    int keepalivePid = newKeepalivePid(before);
    Connection c = lease.connection();
    c.setAutoCommit(false);
    try (PreparedStatement proclaim = c.prepareStatement("SELECT fenced_lock_proclaim(?, ?, 'leader at 10.0.0.7')");
        PreparedStatement write = c.prepareStatement("INSERT INTO docs (id, body, fence_token) VALUES (8, 'led', ?)")) {
      proclaim.setString(1, "docs:8");
      proclaim.setLong(2, lease.token());
      try (ResultSet rs = proclaim.executeQuery()) {
        rs.next();
        assertTrue(rs.getBoolean(1));
      }
      write.setLong(1, lease.token());
      write.executeUpdate();
    }
    Db.await("the keepalive's renew waiting on the lease's lock", Duration.ofSeconds(5), () -> "Lock".equals(
        db.scalar("SELECT wait_event_type FROM pg_stat_activity WHERE pid = ?", keepalivePid)));
    long called = System.nanoTime();
    assertTrue(lease.release());
    double took = (System.nanoTime() - called) / 1e9;
    c.commit();
    c.setAutoCommit(true);
    System.out.printf("keepalive: release took %.2f s with a renew held up behind its own transaction%n", took);
    assertTrue(took < 3.0, "release took " + took + " s");
    assertFalse(lease.isLost());
    assertEquals("release", db.endedBy(lease.token()));
    assertEquals(lease.token(), ((Number) db.scalar("SELECT fence_token FROM docs WHERE id = 8")).longValue());
    assertEquals(0L, ((Number) db.scalar("SELECT count(*) FROM fenced_lock_leader('docs:8')")).longValue());
  }

  @Test
  void aRenewInFlightAtReleaseIsAnsweredBeforeTheReleaseIsSent() throws Exception {
    // A renew attempt may wait an interval (here 2 s) before it is given up for a new one: the
    // test holds it up for less.
    FencedLock locks = FencedLock.builder(db.dsn).keepaliveInterval(Duration.ofSeconds(2)).build();
    AtomicInteger renewals = new AtomicInteger();
    List<Object> before = db.keepalivePids();
    // The caller's connection, so that its backend, and its last query, are still there to see
    // after the release.
    Connection own = db.admin();
    Lease lease = keep(locks.acquire("ka:inflight", AcquireOptions.defaults().ttl(Duration.ofSeconds(8))
        .connection(own).onRenewed(l -> renewals.incrementAndGet())));
    int keepalivePid = newKeepalivePid(before);
    int leasePid;
    try (Statement st = lease.connection().createStatement(); ResultSet rs = st.executeQuery("SELECT pg_backend_pid()")) {
      rs.next();
      leasePid = rs.getInt(1);
    }

    try (Connection blocker = db.admin()) {
      // A renew of the lease in another open transaction holds the lease's lock until it ends;
      // the keepalive's next renew waits for it, and so stays in flight as long as we like.
      blocker.setAutoCommit(false);
      try (PreparedStatement ps = blocker.prepareStatement("SELECT fenced_lock_renew(?, ?)")) {
        ps.setString(1, "ka:inflight");
        ps.setLong(2, lease.token());
        try (ResultSet rs = ps.executeQuery()) {
          rs.next();
          assertTrue(rs.getBoolean(1));
        }
      }
      Db.await("the keepalive's renew waiting on the lease's lock", Duration.ofSeconds(5), () -> "Lock".equals(
          db.scalar("SELECT wait_event_type FROM pg_stat_activity WHERE pid = ?", keepalivePid)));
      int renewalsBefore = renewals.get();

      CompletableFuture<Boolean> release = CompletableFuture.supplyAsync(() -> {
        try {
          return lease.release();
        } catch (FencedLockException e) {
          throw new IllegalStateException(e);
        }
      });
      Db.sleep(700);
      assertFalse(release.isDone(), "release returned while a renew was in flight");
      String leaseQuery = (String) db.scalar("SELECT query FROM pg_stat_activity WHERE pid = ?", leasePid);
      assertFalse(leaseQuery.contains("fenced_lock_release"), "the release was sent while a renew was in flight");
      assertEquals("idle", db.scalar("SELECT state FROM pg_stat_activity WHERE pid = ?", leasePid));

      blocker.commit();
      assertTrue(release.get(10, TimeUnit.SECONDS));
      // The renew in flight was answered (true: the lease was live) before the release.
      assertEquals(renewalsBefore + 1, renewals.get());
    }
    Db.await("keepalive backend " + keepalivePid + " gone", Duration.ofSeconds(2),
        () -> db.scalar("SELECT 1 FROM pg_stat_activity WHERE pid = ?", keepalivePid) == null);
    assertTrue(((String) db.scalar("SELECT query FROM pg_stat_activity WHERE pid = ?", leasePid))
        .contains("fenced_lock_release"), "the release was not the lease connection's last statement");
    own.close();
    assertEquals("release", db.endedBy(lease.token()));
  }
}
