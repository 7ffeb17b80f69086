package io.github.fencedlock;

import java.lang.System.Logger.Level;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The keepalive of one lease: a thread of its own with a connection of its own, so the caller's
 * work never delays a renew, and a renew never blocks the caller's work or waits behind other
 * leases' timers (a shared timer stalled under load is a known way for a lock's heartbeat to
 * stop).
 *
 * <p>It keeps the lease's deadline on the monotonic clock: the send instant of the acquire or of
 * the last successful renew, plus the ttl, never later than the server's expiry. Every blocking
 * step is bounded by that deadline (the connect waits at most until it, a renew's socket reads
 * time out at it), so lost is signalled at the deadline even when the server does not answer;
 * and by an attempt's time, so that a silent connection is replaced well before it. After any
 * wait, a pause of the process included, it looks at the clock before sending anything.
 */
final class Keepalive implements Runnable {
  private static final System.Logger LOG = System.getLogger("io.github.fencedlock");
  private static final long MAX_RETRY_NANOS = TimeUnit.SECONDS.toNanos(1);

  /** Connects keepalive connections, so that a connect that hangs can be given up at the deadline. */
  private static final ExecutorService CONNECTOR = Executors.newCachedThreadPool(r -> {
    Thread t = new Thread(r, "fenced_lock connect");
    t.setDaemon(true);
    return t;
  });

  private final Lease lease;
  private final ConnectionSource source;
  private final long intervalNanos;
  private final long retryNanos;
  private final long attemptNanos;
  private final Thread thread;

  private final ReentrantLock lock = new ReentrantLock();
  private final Condition wake = lock.newCondition();
  private boolean stop; // guarded by lock

  private Connection connection; // the keepalive thread's alone
  private PreparedStatement renew;

  Keepalive(Lease lease, ConnectionSource source, long intervalNanos) {
    this.lease = lease;
    this.source = source;
    this.intervalNanos = intervalNanos;
    this.retryNanos = Math.min(intervalNanos, MAX_RETRY_NANOS);
    // One attempt (a connect, a renew) may take an interval, and at least a second, before it is
    // given up and tried again on a new connection: a connection that silently stopped (a NAT or
    // firewall dropping it) must not hold the renewals until the deadline. A renew waiting on the
    // lease's lock (another renew, a proclaim or a release of the lease in a transaction still
    // open, the holder's own included) is not hurt: the next attempt waits in its place, and a
    // release waits for the attempt in flight at most this long.
    this.attemptNanos = Math.max(intervalNanos, MAX_RETRY_NANOS);
    this.thread = new Thread(this, "fenced_lock keepalive " + lease.name());
    this.thread.setDaemon(true);
  }

  void start() {
    thread.start();
  }

  /**
   * Stops the keepalive and waits until its thread has finished: a renew in flight has been
   * answered (or timed out) and the keepalive's connection is closed. Nothing is sent from it
   * after this returns.
   */
  void stopAndJoin() {
    lock.lock();
    try {
      stop = true;
      wake.signalAll();
    } finally {
      lock.unlock();
    }
    if (Thread.currentThread() == thread) {
      return; // called from a listener: the loop ends when the listener returns
    }
    boolean interrupted = false;
    while (true) {
      try {
        thread.join();
        break;
      } catch (InterruptedException e) {
        // The guarantee (no renew after the release) matters more than the interrupt; keep it
        // for the caller.
        interrupted = true;
      }
    }
    if (interrupted) {
      Thread.currentThread().interrupt();
    }
  }

  @Override
  public void run() {
    // The first renew one interval after the acquire was sent (or after the renew that followed
    // a long wait in line).
    long next = lease.deadline() - lease.ttlNanos() + intervalNanos;
    try {
      while (true) {
        long now = System.nanoTime();
        long deadline = lease.deadline();
        if (now - deadline >= 0) {
          lease.signalLost();
          return;
        }
        if (stopping()) {
          return;
        }
        if (connection == null) {
          if (!connect(earlier(now + attemptNanos, deadline))) {
            if (!sleepUntil(earlier(now + retryNanos, deadline))) {
              return;
            }
          }
          continue; // a connect takes time: look at the clock again
        }
        if (next - now > 0) {
          if (!sleepUntil(earlier(next, deadline))) {
            return;
          }
          continue;
        }
        long sent = System.nanoTime();
        Boolean live;
        try {
          live = sendRenew(sent, earlier(sent + attemptNanos, deadline));
        } catch (SQLException | RuntimeException e) {
          // Renewals never stop for one failure: drop the connection, try again on a new one
          // every min(interval, 1 s) until the deadline.
          LOG.log(Level.WARNING, "renew of lock \"" + lease.name() + "\" failed, retrying: " + e);
          dropConnection(false);
          next = sent + retryNanos;
          continue;
        }
        if (live == null || !live) {
          lease.signalLost();
          return;
        }
        lease.renewedAt(sent);
        if (System.nanoTime() - lease.deadline() >= 0) {
          // The answer came back after the deadline it set (the process was paused meanwhile).
          lease.signalLost();
          return;
        }
        lease.fireRenewed();
        next = sent + intervalNanos;
      }
    } catch (Throwable t) {
      // A bug here must not leave a lease that looks kept alive while nobody renews it.
      LOG.log(Level.ERROR, "keepalive of lock \"" + lease.name() + "\" failed", t);
      lease.signalLost();
    } finally {
      dropConnection(true);
    }
  }

  private static long earlier(long a, long b) {
    return a - b < 0 ? a : b;
  }

  private boolean stopping() {
    lock.lock();
    try {
      return stop;
    } finally {
      lock.unlock();
    }
  }

  /** Sleeps until {@code until} on the monotonic clock; false if told to stop meanwhile. */
  private boolean sleepUntil(long until) {
    lock.lock();
    try {
      while (!stop) {
        long left = until - System.nanoTime();
        if (left <= 0) {
          return true;
        }
        try {
          wake.awaitNanos(left);
        } catch (InterruptedException e) {
          // Only stopAndJoin may end this thread, and it does so through stop.
        }
      }
      return false;
    } finally {
      lock.unlock();
    }
  }

  /** Opens the keepalive's connection, giving up at {@code until}. */
  private boolean connect(long until) {
    CompletableFuture<Connection> f = new CompletableFuture<>();
    CONNECTOR.execute(() -> {
      try {
        f.complete(source.openKeepalive());
      } catch (Throwable t) {
        f.completeExceptionally(t);
      }
    });
    try {
      connection = f.get(Math.max(1, until - System.nanoTime()), TimeUnit.NANOSECONDS);
      renew = connection.prepareStatement(lease.locker().renewSql());
      return true;
    } catch (TimeoutException e) {
      LOG.log(Level.WARNING, "keepalive connection for lock \"" + lease.name() + "\" not open in time");
      f.thenAccept(c -> source.closeKeepalive(c, false));
    } catch (ExecutionException e) {
      LOG.log(Level.WARNING, "keepalive connection for lock \"" + lease.name() + "\" failed: " + e.getCause());
    } catch (SQLException e) {
      LOG.log(Level.WARNING, "keepalive connection for lock \"" + lease.name() + "\" failed: " + e);
    } catch (InterruptedException e) {
      // Not ours to be interrupted; the loop looks at the clock and tries again.
    }
    dropConnection(false);
    return false;
  }

  /** Sends a renew whose socket reads time out at {@code until} (at the latest, the deadline). */
  private Boolean sendRenew(long sent, long until) throws SQLException {
    long leftMillis = Math.max(1, TimeUnit.NANOSECONDS.toMillis(until - sent) + 1);
    try {
      // Past the deadline the lease counts as lost whatever the answer would be; before it, a
      // silent connection is given up for a new one.
      connection.setNetworkTimeout(Runnable::run, (int) Math.min(Integer.MAX_VALUE, leftMillis));
    } catch (SQLException | UnsupportedOperationException | AbstractMethodError e) {
      // A pool's wrapper that cannot set it: the renew is then bounded by the driver's timeouts.
    }
    renew.setString(1, lease.name());
    renew.setLong(2, lease.token());
    renew.setString(3, FencedLock.interval(lease.ttl()));
    try (ResultSet rs = renew.executeQuery()) {
      if (!rs.next()) {
        return null;
      }
      boolean live = rs.getBoolean(1);
      return rs.wasNull() ? null : live;
    }
  }

  private void dropConnection(boolean graceful) {
    if (renew != null) {
      ConnectionSource.closeQuietly(renew);
      renew = null;
    }
    if (connection != null) {
      source.closeKeepalive(connection, graceful);
      connection = null;
    }
  }
}
