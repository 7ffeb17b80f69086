package io.github.fencedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.DynamicTest.dynamicTest;

import java.sql.Connection;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * Every bad argument of every call gets {@link InvalidArgumentException} (SQLSTATE 22023), with a
 * message naming the argument, and sends nothing: the locker's factory opens no connection, and
 * nothing is sent on the caller's.
 */
@ExtendWith(Db.Extension.class)
class ArgumentsTest {
  /** The interval of the lockers under test: a ttl must be longer. */
  private static final Duration KEEPALIVE_INTERVAL = Duration.ofSeconds(10);

  private static Connection callers;
  private static Connection closed;
  private final Db db = Db.get();

  @BeforeAll
  static void open() throws Exception {
    callers = Db.get().admin();
    closed = Db.get().admin();
    closed.close();
  }

  @AfterAll
  static void close() throws Exception {
    callers.close();
  }

  @FunctionalInterface
  interface Call {
    void call(FencedLock locks, AcquireOptions base) throws Exception;
  }

  /** A bad argument, the name its message must start with, and the call that passes it. */
  private static final class Case {
    final String title;
    final String argument;
    final Call call;

    Case(String title, String argument, Call call) {
      this.title = title;
      this.argument = argument;
      this.call = call;
    }
  }

  /** The bad arguments an acquire can get; {@code waiting}: acquire and run, else tryAcquire. */
  private static List<Case> acquireArguments(boolean waiting, Acquirer a) {
    List<Case> cases = new ArrayList<>();
    cases.add(new Case("name null", "name", (l, o) -> a.acquire(l, null, o)));
    cases.add(new Case("name empty", "name", (l, o) -> a.acquire(l, "", o)));
    cases.add(new Case("name with a NUL", "name", (l, o) -> a.acquire(l, "a\0b", o)));
    cases.add(new Case("options null", "options", (l, o) -> a.acquire(l, "args", null)));
    cases.add(new Case("ttl null", "ttl", (l, o) -> a.acquire(l, "args", o.ttl(null))));
    cases.add(new Case("ttl zero", "ttl", (l, o) -> a.acquire(l, "args", o.ttl(Duration.ZERO))));
    cases.add(new Case("ttl negative", "ttl", (l, o) -> a.acquire(l, "args", o.ttl(Duration.ofSeconds(-5)))));
    cases.add(new Case("ttl under a microsecond", "ttl", (l, o) -> a.acquire(l, "args", o.ttl(Duration.ofNanos(999)))));
    cases.add(new Case("permits zero", "permits", (l, o) -> a.acquire(l, "args", o.permits(0))));
    cases.add(new Case("permits negative", "permits", (l, o) -> a.acquire(l, "args", o.permits(-3))));
    cases.add(new Case("shared with permits 2", "permits", (l, o) -> a.acquire(l, "args", o.shared(true).permits(2))));
    cases.add(new Case("holder with a NUL", "holder", (l, o) -> a.acquire(l, "args", o.holder("w\0"))));
    cases.add(new Case("a closed connection", "connection", (l, o) -> a.acquire(l, "args", o.connection(closed))));
    cases.add(new Case("ttl not longer than the keepalive interval", "ttl",
        (l, o) -> a.acquire(l, "args", o.ttl(KEEPALIVE_INTERVAL))));
    if (waiting) {
      cases.add(new Case("maxWait negative", "maxWait", (l, o) -> a.acquire(l, "args", o.maxWait(Duration.ofMillis(-1)))));
    } else {
      cases.add(new Case("maxWait given to tryAcquire", "maxWait", (l, o) -> a.acquire(l, "args", o.maxWait(Duration.ofSeconds(1)))));
    }
    return cases;
  }

  @FunctionalInterface
  interface Acquirer {
    void acquire(FencedLock locks, String name, AcquireOptions options) throws Exception;
  }

  private List<DynamicTest> run(String call, List<Case> cases, List<UnaryOperator<AcquireOptions>> bases) {
    List<DynamicTest> tests = new ArrayList<>();
    for (Case c : cases) {
      for (int b = 0; b < bases.size(); b++) {
        UnaryOperator<AcquireOptions> base = bases.get(b);
        String where = b == 0 ? "" : " (on the caller's connection)";
        tests.add(dynamicTest(call + ": " + c.title + where, () -> {
          Spy spy = Spy.of(db);
          FencedLock locks = FencedLock.builder(spy).keepaliveInterval(KEEPALIVE_INTERVAL).build();
          AcquireOptions options = base.apply(AcquireOptions.defaults());
          if (options.connection() != null) {
            options = options.connection(spy.wrap(options.connection()));
          }
          AcquireOptions o = options;
          InvalidArgumentException e = assertThrows(InvalidArgumentException.class, () -> c.call.call(locks, o));
          assertEquals("22023", e.getSQLState());
          assertTrue(e.getMessage().startsWith(c.argument + ": "), "message must name " + c.argument + ": " + e.getMessage());
          assertEquals(0, spy.opened.get(), "a connection was opened");
          assertEquals(List.of(), spy.sent, "something was sent on the caller's connection");
        }));
      }
    }
    return tests;
  }

  private static final List<UnaryOperator<AcquireOptions>> BOTH = List.of(o -> o, o -> o.connection(callers));

  @TestFactory
  List<DynamicTest> everyBadArgumentOfTryAcquireIsRefusedBeforeAnythingIsSent() {
    return run("tryAcquire", acquireArguments(false, (l, n, o) -> l.tryAcquire(n, o)), BOTH);
  }

  @TestFactory
  List<DynamicTest> everyBadArgumentOfAcquireIsRefusedBeforeAnythingIsSent() {
    return run("acquire", acquireArguments(true, (l, n, o) -> l.acquire(n, o)), BOTH);
  }

  @TestFactory
  List<DynamicTest> everyBadArgumentOfRunIsRefusedBeforeAnythingIsSent() {
    List<Case> cases = acquireArguments(true, (l, n, o) -> l.run(n, o, lease -> null));
    cases.add(new Case("attempts zero", "attempts", (l, o) -> l.run("args", o, 0, lease -> null)));
    cases.add(new Case("attempts negative", "attempts", (l, o) -> l.run("args", o, -1, lease -> null)));
    cases.add(new Case("fn null", "fn", (l, o) -> l.run("args", o, 3, (LeaseFunction<Object, RuntimeException>) null)));
    return run("run", cases, BOTH);
  }

  @TestFactory
  List<DynamicTest> everyBadArgumentOfTheLockerIsRefusedBeforeAnythingIsSent() {
    List<Case> cases = new ArrayList<>();
    cases.add(new Case("keepaliveInterval zero", "keepaliveInterval",
        (l, o) -> FencedLock.builder(db.dsn).keepaliveInterval(Duration.ZERO).build()));
    cases.add(new Case("keepaliveInterval negative", "keepaliveInterval",
        (l, o) -> FencedLock.builder(db.dsn).keepaliveInterval(Duration.ofSeconds(-1)).build()));
    cases.add(new Case("retryAttempts zero", "retryAttempts", (l, o) -> FencedLock.builder(db.dsn).retryAttempts(0).build()));
    cases.add(new Case("schema empty", "schema", (l, o) -> FencedLock.builder(db.dsn).schema("").build()));
    cases.add(new Case("dsn null", "dsn", (l, o) -> FencedLock.builder((String) null).build()));
    cases.add(new Case("dsn empty", "dsn", (l, o) -> FencedLock.builder(" ").build()));
    cases.add(new Case("dsn not a connection string", "dsn", (l, o) -> FencedLock.builder("db.example.com").build()));
    cases.add(new Case("dsn with a Unix-domain socket", "dsn",
        (l, o) -> FencedLock.builder("host=/var/run/postgresql dbname=x").build()));
    cases.add(new Case("dsn with a libpq parameter PgJDBC cannot honour", "dsn",
        (l, o) -> FencedLock.builder("postgresql://localhost/db?service=prod").build()));
    cases.add(new Case("dsn with a bad port", "dsn", (l, o) -> FencedLock.builder("postgresql://localhost:5x/db").build()));
    cases.add(new Case("dsn with an unterminated quote", "dsn", (l, o) -> FencedLock.builder("password='abc").build()));
    return run("builder", cases, List.of(o -> o));
  }

  @Test
  void renewAndReleaseOfALeaseTakeNoArgumentsToGetWrong() throws Exception {
    // The lease's own calls take their arguments from the lease; what is left to check is that
    // a lease nobody holds any more sends nothing.
    Spy spy = Spy.of(db);
    Lease lease = FencedLock.builder(spy).build().tryAcquire("args:lease",
        AcquireOptions.defaults().keepalive(false).connection(spy.wrap(callers)));
    assertNotNull(lease);
    assertTrue(lease.release());
    int sent = spy.sent.size();
    assertEquals(false, lease.renew());
    assertEquals(false, lease.release());
    assertEquals(sent, spy.sent.size());
  }

  @Test
  void whatOnlyTheServerCanJudgeComesBackFromItAsTheSameError() throws Exception {
    FencedLock locks = db.locker();
    String longName = "n".repeat(513);
    InvalidArgumentException e = assertThrows(InvalidArgumentException.class, () -> locks.tryAcquire(longName));
    assertEquals("22023", e.getSQLState());
    assertNotNull(e.hint(), "the server's hint");
    assertTrue(e.getMessage().contains("512"), e.getMessage());
    InvalidArgumentException ttl = assertThrows(InvalidArgumentException.class,
        () -> locks.tryAcquire("args:ttl", AcquireOptions.defaults().ttl(Duration.ofDays(2))));
    assertEquals("22023", ttl.getSQLState());
    assertTrue(ttl.getMessage().contains("max_ttl"), ttl.getMessage());
    assertEquals(List.of(), db.column("SELECT token FROM fenced_lock_leases WHERE name IN ('args:ttl', ?)", longName));
  }
}
