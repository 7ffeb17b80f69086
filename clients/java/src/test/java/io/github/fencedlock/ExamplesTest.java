package io.github.fencedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * The conformance examples as {@code clients/run java ...} runs them: JSON lines only on stdout,
 * and the exit status of the contract (0 done, 3 lost, 1 another failure, 2 a bad command line).
 */
@ExtendWith(Db.Extension.class)
class ExamplesTest {
  private static final Duration START = Duration.ofSeconds(40); // a JVM's start on a busy machine
  private final Db db = Db.get();

  @AfterEach
  void cleanUp() throws Exception {
    Child.killAll();
    db.forceRelease("docs:50", "docs:51", "ex:wait", "ex:bad", "inventory:2");
  }

  private void row(int id) throws Exception {
    db.exec("INSERT INTO docs (id, body, fence_token) VALUES (?, 'row', fenced_lock_try_acquire('docs:' || ?, '5 s'))", id, id);
    db.forceRelease("docs:" + id);
  }

  @Test
  void holdPrintsAcquiredRenewedWriteAndReleasedAndExitsZero() throws Exception {
    row(50);
    Child hold = Child.start("hold", "--dsn", db.dsn, "--name", "docs:50", "--ttl", "1", "--hold", "1.5",
        "--write", "docs:50", "--holder", "examples");
    assertEquals(0, hold.waitFor(START), hold.describe());
    List<Child.Event> events = hold.events();
    assertEquals(List.of(), hold.badLines());
    assertEquals("acquired", events.get(0).name());
    long token = events.get(0).num("token");
    assertTrue(hold.events("renewed").size() >= 1, events.toString());
    assertTrue(hold.events("renewed").stream().allMatch(e -> e.num("token") == token));
    // A renew may come at any point, between the write and the release too.
    List<Child.Event> steps = events.stream().filter(e -> !"renewed".equals(e.name()))
        .collect(java.util.stream.Collectors.toList());
    assertEquals(List.of("acquired", "write", "released"),
        steps.stream().map(Child.Event::name).collect(java.util.stream.Collectors.toList()), events.toString());
    Child.Event write = steps.get(1);
    assertEquals(Boolean.TRUE, write.get("ok"));
    Child.Event released = steps.get(2);
    assertEquals(token, released.num("token"));
    assertEquals(Boolean.TRUE, released.get("released"));
    assertEquals(token, ((Number) db.scalar("SELECT fence_token FROM docs WHERE id = 50")).longValue());
    assertEquals("release", db.endedBy(token));
    assertEquals("examples", db.scalar("SELECT holder FROM fenced_lock_history WHERE token = ?", token));
  }

  @Test
  void holdExitsTwoOnABadCommandLineAndPrintsNothingOnStdout() throws Exception {
    String[][] bad = {
        {},
        {"--dsn", db.dsn, "--name", "ex:bad", "--ttl", "1"},
        {"--dsn", db.dsn, "--name", "ex:bad", "--ttl", "soon", "--hold", "1"},
        {"--dsn", db.dsn, "--name", "ex:bad", "--ttl", "1", "--hold", "1", "--colour", "red"},
        {"--dsn", db.dsn, "--name", "ex:bad", "--ttl", "1", "--hold", "1", "--write", "no-id"},
    };
    for (String[] args : bad) {
      Child hold = Child.start("hold", args);
      assertEquals(2, hold.waitFor(START), String.join(" ", args) + hold.describe());
      assertEquals(List.of(), hold.events(), String.join(" ", args));
      assertEquals(List.of(), hold.badLines(), String.join(" ", args));
    }
    assertEquals(null, db.scalar("SELECT token FROM fenced_lock_leases WHERE name = 'ex:bad'"));
  }

  @Test
  void holdReportsABadArgumentValueAsAnErrorEventWith22023AndExitsOne() throws Exception {
    Child hold = Child.start("hold", "--dsn", db.dsn, "--name", "ex:bad", "--ttl", "0", "--hold", "1");
    assertEquals(1, hold.waitFor(START), hold.describe());
    assertEquals(1, hold.events().size(), hold.events().toString());
    Child.Event e = hold.events().get(0);
    assertEquals("error", e.name());
    assertEquals("22023", e.get("sqlstate"));
    assertTrue(((String) e.get("message")).startsWith("ttl: "), (String) e.get("message"));
  }

  @Test
  void holdWhoseWaitRunsOutReportsTheErrorWithSqlstate55P03() throws Exception {
    try (Lease held = db.locker().acquire("ex:wait")) {
      Child hold = Child.start("hold", "--dsn", db.dsn, "--name", "ex:wait", "--ttl", "1", "--hold", "1",
          "--wait", "0.3");
      assertEquals(1, hold.waitFor(START), hold.describe());
      assertEquals(1, hold.events().size(), hold.events().toString());
      assertEquals("error", hold.events().get(0).name());
      assertEquals("55P03", hold.events().get(0).get("sqlstate"));
      assertTrue(held.release());
    }
  }

  @Test
  void holdOfASessionBoundLeaseWhoseSessionIsTerminatedPrintsLostAndItsWriteIsRefused() throws Exception {
    row(51);
    Child hold = Child.start("hold", "--dsn", db.dsn, "--name", "docs:51", "--ttl", "3", "--hold", "3",
        "--write", "docs:51", "--session-bound");
    long token = hold.await("acquired", START).num("token");
    // The session a session-bound lease belongs to holds fenced_lock's session lock, whose
    // advisory tag carries the token.
    Object pid = db.scalar("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 17997 "
        + "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        + "AND classid::bigint = ? >> 32 AND objid::bigint = ? & 4294967295", token, token);
    db.terminate((Integer) pid);
    Child.Event lost = hold.await("lost", Duration.ofSeconds(10));
    assertEquals(token, lost.num("token"));
    Child.Event write = hold.await("write", Duration.ofSeconds(15));
    assertEquals(Boolean.FALSE, write.get("ok"));
    assertEquals("FL001", write.get("sqlstate"));
    assertEquals(3, hold.waitFor(Duration.ofSeconds(20)), hold.describe());
    assertTrue(hold.events("released").isEmpty());
  }

  @Test
  void inventoryStopsWithSoldOutWhenItReadsAStockOfZero() throws Exception {
    db.exec("INSERT INTO inventory (item_id, stock, fence_token) VALUES (2, 3, fenced_lock_try_acquire('inventory:2', '5 s'))");
    db.forceRelease("inventory:2");
    Child inv = Child.start("inventory", "--dsn", db.dsn, "--item", "2", "--sales", "5", "--ttl", "2");
    assertEquals(0, inv.waitFor(START), inv.describe());
    List<String> names = inv.events().stream().map(Child.Event::name).collect(java.util.stream.Collectors.toList());
    assertEquals(List.of("sold", "sold", "sold", "sold_out", "done"), names);
    assertEquals(List.of(2L, 1L, 0L), inv.events("sold").stream().map(e -> e.num("stock")).collect(
        java.util.stream.Collectors.toList()));
    assertEquals(3, inv.events("done").get(0).num("sold"));
    assertEquals(0, ((Number) db.scalar("SELECT stock FROM inventory WHERE item_id = 2")).intValue());
  }
}
