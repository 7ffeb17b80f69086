package io.github.fencedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * A real pause of the client process: the {@code hold} example run as a child, stopped with
 * SIGSTOP past its ttl while another client takes the lock, then continued.
 */
@ExtendWith(Db.Extension.class)
class PausedProcessTest {
  private final Db db = Db.get();

  @AfterEach
  void cleanUp() throws Exception {
    Child.killAll();
    db.forceRelease("docs:3");
  }

  @Test
  void sigstopPastTheTtlSignalsLostWithinASecondOfSigcontAndTheGuardedWriteIsRefusedWithFL001() throws Exception {
    // Row 3 does not exist yet: the new holder inserts it while the child is stopped, so the
    // child's UPDATE has a row to be refused on.
    Child hold = Child.start("hold", "--dsn", db.dsn, "--name", "docs:3", "--ttl", "1", "--hold", "4",
        "--write", "docs:3");
    long stale = hold.await("acquired", Duration.ofSeconds(40)).num("token");
    hold.await("renewed", Duration.ofSeconds(5)); // the keepalive runs

    hold.signal("STOP");
    long stopped = System.nanoTime();
    // Another client takes the lock once the paused one's lease has expired, and writes.
    long fresh;
    try (Connection other = db.admin()) {
      FencedLock locks = db.locker();
      Lease taken = null;
      while (taken == null) {
        taken = locks.tryAcquire("docs:3", AcquireOptions.defaults().ttl(Duration.ofSeconds(20)).connection(other));
        if (taken == null) {
          Db.sleep(50);
        }
        assertTrue(System.nanoTime() - stopped < Duration.ofSeconds(10).toNanos(), "the paused lease never expired");
      }
      fresh = taken.token();
      try (PreparedStatement ps = other.prepareStatement("INSERT INTO docs (id, body, fence_token) VALUES (3, 'fresh', ?)")) {
        ps.setLong(1, fresh);
        ps.executeUpdate();
      }
      long left = stopped + Duration.ofMillis(2500).toNanos() - System.nanoTime();
      if (left > 0) {
        Db.sleep(left / 1_000_000);
      }
      int seenBefore = hold.events().size();
      hold.signal("CONT");
      long resumed = System.nanoTime();

      Child.Event lost = hold.await("lost", Duration.ofSeconds(10));
      double ms = (lost.at - resumed) / 1e6;
      System.out.printf("paused process: lost signalled %.0f ms after SIGCONT (stopped %.1f s, ttl 1 s)%n", ms,
          (resumed - stopped) / 1e9);
      assertEquals(stale, lost.num("token"));
      assertTrue(ms < 1000, "lost " + ms + " ms after SIGCONT; the contract says within a second");
      // After the pause the keepalive looked at its clock first: nothing was renewed.
      List<Child.Event> after = hold.events().subList(seenBefore, hold.events().size());
      assertEquals("lost", after.get(0).name(), "first event after SIGCONT: " + after);

      Child.Event write = hold.await("write", Duration.ofSeconds(15));
      assertEquals(Boolean.FALSE, write.get("ok"));
      assertEquals("FL001", write.get("sqlstate"));
      assertEquals(3, hold.waitFor(Duration.ofSeconds(20)), hold.describe());
      assertTrue(hold.events("released").isEmpty(), "a lost lease was released: " + hold.events());
      assertTrue(hold.events("renewed").stream().allMatch(e -> e.at < stopped), "renewed after the pause");
      assertEquals(List.of(), hold.badLines());

      // The row is the new holder's: the stale write changed nothing.
      assertEquals(fresh, ((Number) db.scalar("SELECT fence_token FROM docs WHERE id = 3")).longValue());
      assertEquals("fresh", db.scalar("SELECT body FROM docs WHERE id = 3"));
      assertTrue(db.validate("docs:3", fresh));
      assertNotNull(taken);
      assertTrue(taken.release());
    }
  }
}
