package io.github.fencedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;
import org.junit.jupiter.api.parallel.Isolated;

/**
 * A locker over a real client-side pool (HikariCP): the lease keeps one connection of the pool
 * for its life, the keepalive takes another, so a pool needs two per lease held at once.
 */
@ExtendWith(Db.Extension.class)
@Isolated("counts the database's keepalive connections, which must all be its own")
class PoolTest {
  private final Db db = Db.get();
  private HikariDataSource pool;

  @AfterEach
  void cleanUp() throws Exception {
    if (pool != null) {
      pool.close();
    }
    db.forceRelease("pool:two", "pool:one", "pool:session");
  }

  private HikariDataSource pool(int size) throws Exception {
    Dsn d = Dsn.parse(db.dsn);
    HikariConfig config = new HikariConfig();
    config.setJdbcUrl(d.url);
    config.setDataSourceProperties(d.properties);
    config.setMaximumPoolSize(size);
    config.setMinimumIdle(0);
    config.setConnectionTimeout(250);
    config.setPoolName("fl_client_java_" + size);
    pool = new HikariDataSource(config);
    return pool;
  }

  @Test
  void aPoolOfTwoConnectionsKeepsALeaseAliveAndGetsBothBackAtTheRelease() throws Exception {
    HikariDataSource ds = pool(2);
    FencedLock locks = FencedLock.builder(ds).build();
    AtomicInteger renewals = new AtomicInteger();
    Lease lease = locks.acquire("pool:two",
        AcquireOptions.defaults().ttl(Duration.ofSeconds(1)).onRenewed(l -> renewals.incrementAndGet()));
    Db.await("the keepalive took the pool's second connection", Duration.ofSeconds(5),
        () -> ds.getHikariPoolMXBean().getActiveConnections() == 2);
    assertEquals(1, db.keepalivePids().size(), "the keepalive's connection names itself fenced_lock_keepalive");
    Db.sleep(2500);
    assertFalse(lease.isLost());
    assertTrue(db.validate("pool:two", lease.token()));
    assertTrue(renewals.get() >= 2, "renewals: " + renewals.get());

    assertTrue(lease.release());
    lease.close();
    assertEquals(0, ds.getHikariPoolMXBean().getActiveConnections(), "connections not given back to the pool");
    assertEquals(2, ds.getHikariPoolMXBean().getTotalConnections(), "the pool keeps them, open");
    // Back in the pool, the keepalive's connection no longer calls itself a keepalive.
    assertEquals(List.of(), db.keepalivePids());
  }

  @Test
  void aPoolOfOneConnectionCannotKeepALeaseAliveAndTheLeaseIsLostAtItsDeadline() throws Exception {
    // The control of the test above: the lease holds the only connection, the keepalive waits
    // for one in vain, and the client says lost when the ttl has run out.
    HikariDataSource ds = pool(1);
    FencedLock locks = FencedLock.builder(ds).build();
    long start = System.nanoTime();
    Lease lease = locks.acquire("pool:one", AcquireOptions.defaults().ttl(Duration.ofMillis(1500)));
    lease.lostFuture().get(10, TimeUnit.SECONDS);
    double s = (System.nanoTime() - start) / 1e9;
    System.out.printf("pool of one: lost %.2f s after the acquire (ttl 1.5 s)%n", s);
    assertTrue(s >= 1.4, "lost before its deadline: " + s);
    assertFalse(lease.release());
    lease.close();
  }

  @Test
  void aSessionBoundLeaseThroughASessionPoolEndsWithItsRelease() throws Exception {
    HikariDataSource ds = pool(2);
    FencedLock locks = FencedLock.builder(ds).build();
    long first;
    try (Lease lease = locks.acquire("pool:session", AcquireOptions.defaults().sessionBound(true))) {
      first = lease.token();
      assertTrue(db.validate("pool:session", first));
    }
    assertFalse(db.validate("pool:session", first));
    // The pooled session that held it is handed out again, and can take it again.
    try (Lease again = locks.acquire("pool:session", AcquireOptions.defaults().sessionBound(true))) {
      assertTrue(again.token() > first);
    }
  }
}
