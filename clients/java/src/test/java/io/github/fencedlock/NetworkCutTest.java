package io.github.fencedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * The keepalive's connection through a loopback proxy that cuts it the way a network does (bytes
 * stop, nobody is told). The lease's own connection goes straight to the server.
 */
@ExtendWith(Db.Extension.class)
class NetworkCutTest {
  private final Db db = Db.get();
  private CutProxy proxy;
  private Connection direct;

  @BeforeEach
  void start() throws Exception {
    Dsn d = Dsn.parse(db.dsn);
    java.net.URI uri = java.net.URI.create(d.url.substring("jdbc:".length()));
    proxy = new CutProxy(uri.getHost(), uri.getPort());
    direct = db.admin();
  }

  @AfterEach
  void stop() throws Exception {
    proxy.close();
    direct.close();
    db.forceRelease("cut:partition", "cut:silent");
  }

  /** A locker whose connections (the keepalive's) go through the proxy. */
  private FencedLock throughProxy() throws Exception {
    Dsn d = Dsn.parse(db.dsn);
    String url = d.url.replaceFirst("//[^/]+/", "//127.0.0.1:" + proxy.port() + "/");
    return FencedLock.builder(() -> new org.postgresql.Driver().connect(url, d.properties)).build();
  }

  @Test
  void aCutLongerThanTheTtlIsSignalledLostAtTheClientsDeadlineWhileTheRenewHangs() throws Exception {
    AtomicInteger renewals = new AtomicInteger();
    AtomicLong lostAt = new AtomicLong();
    AtomicLong deadline = new AtomicLong();
    Lease lease = throughProxy().acquire("cut:partition", AcquireOptions.defaults().ttl(Duration.ofMillis(1500))
        .connection(direct).onRenewed(l -> renewals.incrementAndGet()).onLost(l -> {
          lostAt.set(System.nanoTime());
          deadline.set(l.deadline());
        }));
    Db.await("a renew through the proxy", Duration.ofSeconds(5), () -> renewals.get() >= 1);
    proxy.stallAll();
    int atCut = renewals.get();
    lease.lostFuture().get(10, TimeUnit.SECONDS);
    double late = (lostAt.get() - deadline.get()) / 1e6;
    System.out.printf("network cut: lost %.0f ms after the client's deadline, no answer from the server%n", late);
    assertTrue(late >= 0, "lost before the deadline: " + late + " ms");
    assertTrue(late < 500, "lost " + late + " ms after the deadline: a renew that hung held the signal up");
    assertEquals(atCut, renewals.get());
    // The deadline is never later than the server's expiry: the lease ends there too.
    Db.await("the server's expiry", Duration.ofSeconds(3), () -> !db.validate("cut:partition", lease.token()));
    proxy.heal();
    assertFalse(lease.release());
  }

  @Test
  void aConnectionThatSilentlyStopsIsGivenUpAndTheRenewRetriedOnANewOne() throws Exception {
    AtomicInteger renewals = new AtomicInteger();
    Lease lease = throughProxy().acquire("cut:silent", AcquireOptions.defaults().ttl(Duration.ofSeconds(4))
        .connection(direct).onRenewed(l -> renewals.incrementAndGet()));
    Db.await("a renew through the proxy", Duration.ofSeconds(5), () -> renewals.get() >= 1);
    proxy.stallExisting(); // that connection is dead; new ones go through
    long cut = System.nanoTime();
    int atCut = renewals.get();
    Db.await("a renew on a new connection", Duration.ofSeconds(5), () -> renewals.get() > atCut);
    System.out.printf("silent connection: renewed on a new one %.0f ms after the cut%n", (System.nanoTime() - cut) / 1e6);
    long left = cut + TimeUnit.MILLISECONDS.toNanos(5000) - System.nanoTime(); // past the ttl
    if (left > 0) {
      Db.sleep(left / 1_000_000);
    }
    assertFalse(lease.isLost());
    assertTrue(db.validate("cut:silent", lease.token()));
    assertTrue(lease.release());
  }
}
