package io.github.fencedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * Each SQLSTATE of the contract's table comes back as its error type, from a real refusal of the
 * server, carrying the server's SQLSTATE, message, detail and hint.
 */
@ExtendWith(Db.Extension.class)
class ErrorsTest {
  private final Db db = Db.get();

  @AfterEach
  void cleanUp() throws Exception {
    db.forceRelease("err:stale", "docs:30", "docs:31", "err:wait", "err:ro", "err:role", "err:noexec", "err:mode");
  }

  @Test
  void fl001StaleTokenIsAStaleTokenException() throws Exception {
    FencedLock locks = db.locker();
    try (Lease lease = locks.acquire("err:stale", AcquireOptions.defaults().keepalive(false))) {
      db.forceRelease("err:stale");
      StaleTokenException e = assertThrows(StaleTokenException.class, lease::assertLive);
      assertEquals("FL001", e.getSQLState());
      assertTrue(e.getMessage().contains("err:stale"), e.getMessage());
      assertTrue(e.detail().contains("presented token: " + lease.token()), e.detail());
      assertNotNull(e.hint());
      assertTrue(e.getCause() instanceof SQLException, "the driver's error is kept as the cause");
    }
    // A guarded write of your own, mapped by FencedLockException.from.
    try (Lease lease = locks.acquire("docs:30", AcquireOptions.defaults().keepalive(false))) {
      db.forceRelease("docs:30");
      SQLException raw = assertThrows(SQLException.class, () -> write(lease.connection(), 30, lease.token()));
      FencedLockException e = FencedLockException.from(raw);
      assertTrue(e instanceof StaleTokenException, e.getClass().getName());
      assertTrue(FencedLockException.isStaleToken(new RuntimeException(raw)));
    }
  }

  private static void write(Connection c, int id, Long token) throws SQLException {
    try (PreparedStatement ps = c.prepareStatement("INSERT INTO docs (id, body, fence_token) VALUES (?, 'e', ?) "
        + "ON CONFLICT (id) DO UPDATE SET fence_token = excluded.fence_token")) {
      ps.setInt(1, id);
      ps.setObject(2, token, java.sql.Types.BIGINT);
      ps.executeUpdate();
    }
  }

  @Test
  void fl002MissingTokenIsAMissingTokenException() throws Exception {
    try (Connection c = db.admin()) {
      SQLException raw = assertThrows(SQLException.class, () -> write(c, 31, null));
      FencedLockException e = FencedLockException.from(raw);
      assertTrue(e instanceof MissingTokenException, e.getClass().getName());
      assertEquals("FL002", e.getSQLState());
      assertNotNull(e.hint());
    }
    assertNull(db.scalar("SELECT 1 FROM docs WHERE id = 31"));
  }

  @Test
  void fl003ModeConflictIsAModeConflictException() throws Exception {
    FencedLock locks = db.locker();
    try (Lease two = locks.tryAcquire("err:mode", AcquireOptions.defaults().permits(2))) {
      assertNotNull(two);
      ModeConflictException e = assertThrows(ModeConflictException.class,
          () -> locks.tryAcquire("err:mode", AcquireOptions.defaults().permits(3)));
      assertEquals("FL003", e.getSQLState());
      assertNotNull(e.hint());
    }
  }

  @Test
  void waitTimeout55P03IsAWaitTimeoutException() throws Exception {
    Spy spy = Spy.of(db);
    FencedLock locks = FencedLock.builder(spy).build();
    try (Lease held = locks.acquire("err:wait")) {
      long start = System.nanoTime();
      WaitTimeoutException e = assertThrows(WaitTimeoutException.class,
          () -> locks.acquire("err:wait", AcquireOptions.defaults().maxWait(Duration.ofMillis(300))));
      assertEquals("55P03", e.getSQLState());
      assertTrue(System.nanoTime() - start >= Duration.ofMillis(300).toNanos(), "gave up before its wait");
      assertTrue(held.release());
    }
    // The connection opened for the acquire that timed out was given back.
    assertEquals(spy.opened.get(), spy.closed.get());
  }

  @Test
  void readOnly25006IsAReadOnlyException() throws Exception {
    try (Connection c = db.admin()) {
      try (Statement st = c.createStatement()) {
        st.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY");
      }
      ReadOnlyException e = assertThrows(ReadOnlyException.class,
          () -> db.locker().tryAcquire("err:ro", AcquireOptions.defaults().connection(c)));
      assertEquals("25006", e.getSQLState());
    }
    assertNull(db.scalar("SELECT token FROM fenced_lock_leases WHERE name = 'err:ro'"));
  }

  @Test
  void notAllowed42501IsANotAllowedException() throws Exception {
    try (Connection c = db.admin()) {
      try (Statement st = c.createStatement()) {
        st.execute("SET ROLE " + Db.OWNER);
      }
      Lease lease = db.locker().tryAcquire("err:role", AcquireOptions.defaults().connection(c).keepalive(false));
      assertNotNull(lease);
      try (Statement st = c.createStatement()) {
        st.execute("SET ROLE " + Db.OTHER);
      }
      // Release of another role's lease.
      NotAllowedException e = assertThrows(NotAllowedException.class, lease::release);
      assertEquals("42501", e.getSQLState());
      assertTrue(db.validate("err:role", lease.token()), "the refused release ended the lease");

      // A role without EXECUTE on fenced_lock's functions.
      try (Statement st = c.createStatement()) {
        st.execute("SET ROLE " + Db.NOEXEC);
      }
      NotAllowedException noexec = assertThrows(NotAllowedException.class,
          () -> db.locker().tryAcquire("err:noexec", AcquireOptions.defaults().connection(c)));
      assertEquals("42501", noexec.getSQLState());
    }
  }

  @Test
  void invalidArgument22023FromTheServerIsAnInvalidArgumentException() throws Exception {
    InvalidArgumentException e = assertThrows(InvalidArgumentException.class,
        () -> db.locker().tryAcquire("err:ttl", AcquireOptions.defaults().ttl(Duration.ofDays(3))));
    assertEquals("22023", e.getSQLState());
    assertNotNull(e.hint());
  }

  @Test
  void anotherSqlstateKeepsItsCodeInTheBaseType() throws Exception {
    try (Connection c = db.admin(); Statement st = c.createStatement()) {
      SQLException raw = assertThrows(SQLException.class, () -> st.executeQuery("SELECT 1 / 0"));
      FencedLockException e = FencedLockException.from(raw);
      assertSame(FencedLockException.class, e.getClass());
      assertEquals("22012", e.getSQLState());
      assertSame(e, FencedLockException.from(e));
    }
  }

  @Test
  void aLostConnectionIsAFencedLockExceptionWithItsSqlstate() throws Exception {
    FencedLock locks = FencedLock.builder("postgresql://postgres@127.0.0.1:1/nowhere?connectTimeout=2").build();
    FencedLockException e = assertThrows(FencedLockException.class, () -> locks.tryAcquire("err:down"));
    assertTrue(e.getSQLState().startsWith("08"), e.getSQLState());
  }
}
