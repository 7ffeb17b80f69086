package io.github.fencedlock;

import java.lang.System.Logger.Level;
import java.sql.Connection;
import java.sql.SQLException;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicBoolean;
import org.postgresql.core.TransactionState;

/**
 * A granted lease of a lock name: its fencing {@link #token()}, the {@link #connection()} it was
 * acquired on, and (unless turned off) a keepalive thread renewing it every interval. Use it in a
 * try-with-resources block: {@link #close()} releases it, unless it was lost.
 *
 * <pre>{@code
 * try (Lease lease = locks.acquire("inventory:1")) {
 *   Connection c = lease.connection();
 *   // read, then write with lease.token() in the fence_token column
 * }
 * }</pre>
 *
 * <p><b>Lost.</b> When a renew says the lease ended, or the client's deadline (the send instant of
 * the acquire or of the last successful renew, plus the ttl: never later than the server's expiry)
 * passes first, the lease is lost: {@link #isLost()} turns true, the {@link LostListener}s run
 * once, {@link #lostFuture()} completes, and the keepalive stops. Stop the work: writes with the
 * token are refused by the database ({@code FL001}). A lost lease is never released by the client.
 *
 * <p>Methods may be called from any thread.
 */
public final class Lease implements AutoCloseable {
  private static final System.Logger LOG = System.getLogger("io.github.fencedlock");

  private final FencedLock locker;
  private final Connection connection;
  private final boolean ownsConnection;
  private final String name;
  private final long token;
  private final Duration ttl;
  private final long ttlNanos;
  private final String holder;
  private final boolean sessionBound;
  private final boolean shared;
  private final int permits;

  private final Object deadlineLock = new Object();
  private long deadline; // System.nanoTime() scale; guarded by deadlineLock

  private final AtomicBoolean lost = new AtomicBoolean();
  private final CompletableFuture<Void> lostFuture = new CompletableFuture<>();
  private final CopyOnWriteArrayList<Once> lostListeners = new CopyOnWriteArrayList<>();
  private final CopyOnWriteArrayList<RenewListener> renewListeners = new CopyOnWriteArrayList<>();

  private boolean ended; // released or abandoned; guarded by this
  private boolean connectionClosed; // guarded by this
  private Keepalive keepalive;

  Lease(FencedLock locker, Connection connection, boolean ownsConnection, String name, long token,
      AcquireOptions o, long ttlNanos, long grantSentAt) {
    this.locker = locker;
    this.connection = connection;
    this.ownsConnection = ownsConnection;
    this.name = name;
    this.token = token;
    this.ttl = o.ttl;
    this.ttlNanos = ttlNanos;
    this.holder = o.holder;
    this.sessionBound = o.sessionBound;
    this.shared = o.shared;
    this.permits = o.permits;
    this.deadline = grantSentAt + ttlNanos;
    for (LostListener l : o.lostListeners) {
      lostListeners.add(new Once(l));
    }
    renewListeners.addAll(o.renewListeners);
  }

  void startKeepalive(long intervalNanos) {
    keepalive = new Keepalive(this, locker.source, intervalNanos);
    keepalive.start();
  }

  /** The lock name. */
  public String name() {
    return name;
  }

  /** The fencing token: write it into the guarded table's token column. */
  public long token() {
    return token;
  }

  /** The ttl the lease was granted with, and that each renew gives it again. */
  public Duration ttl() {
    return ttl;
  }

  public String holder() {
    return holder;
  }

  public boolean sessionBound() {
    return sessionBound;
  }

  public boolean shared() {
    return shared;
  }

  public int permits() {
    return permits;
  }

  /** Whether a keepalive thread renews this lease. */
  public boolean keepalive() {
    return keepalive != null;
  }

  /**
   * The connection the lease was acquired on: the caller's, or one the locker opened (or took
   * from its pool) for this lease, which {@link #close()} closes (gives back). Do the guarded
   * writes here, or on any connection of the same role: the token is what the guard checks.
   */
  public Connection connection() {
    return connection;
  }

  // ---- lost ----

  /**
   * Whether the lease is known to be lost. Without a keepalive it is also lost once the ttl since
   * the acquire (or the last {@link #renew()}) has passed, as this call notices it.
   */
  public boolean isLost() {
    if (lost.get()) {
      return true;
    }
    if (keepalive == null && !isEnded() && System.nanoTime() - deadline() >= 0) {
      signalLost();
    }
    return lost.get();
  }

  /** Throws {@link LeaseLostException} (a {@link StaleTokenException}) if the lease is lost. */
  public void checkNotLost() throws LeaseLostException {
    if (isLost()) {
      throw new LeaseLostException(name, token);
    }
  }

  /**
   * Adds a listener told once when the lease is lost; at once, on this thread, if it already is.
   */
  public void addLostListener(LostListener listener) {
    if (listener == null) {
      throw new NullPointerException("listener");
    }
    Once once = new Once(listener);
    lostListeners.add(once);
    if (lost.get()) {
      once.fire(this);
    }
  }

  public void removeLostListener(LostListener listener) {
    lostListeners.removeIf(o -> o.listener == listener);
  }

  /** Adds a listener told after each successful renew of the keepalive. */
  public void addRenewListener(RenewListener listener) {
    if (listener == null) {
      throw new NullPointerException("listener");
    }
    renewListeners.add(listener);
  }

  /**
   * A future completed when the lease is lost. It never completes for a lease that ends by its
   * release. Completing or cancelling the returned future does not affect the lease.
   */
  public CompletableFuture<Void> lostFuture() {
    return lostFuture.copy();
  }

  void signalLost() {
    if (!lost.compareAndSet(false, true)) {
      return;
    }
    LOG.log(Level.DEBUG, "lease {0} of \"{1}\" lost", token, name);
    lostFuture.complete(null);
    for (Once o : lostListeners) {
      o.fire(this);
    }
  }

  // ---- deadline and renewals ----

  FencedLock locker() {
    return locker;
  }

  long deadline() {
    synchronized (deadlineLock) {
      return deadline;
    }
  }

  long ttlNanos() {
    return ttlNanos;
  }

  /**
   * A renew sent at {@code sentAt} succeeded. Renewals of one ttl sent at different instants may
   * finish in any order; the server's expiry is at least the latest send instant plus the ttl.
   */
  void renewedAt(long sentAt) {
    synchronized (deadlineLock) {
      if (sentAt + ttlNanos - deadline > 0) {
        deadline = sentAt + ttlNanos;
      }
    }
  }

  void fireRenewed() {
    for (RenewListener l : renewListeners) {
      try {
        l.onRenewed(this);
      } catch (RuntimeException e) {
        LOG.log(Level.WARNING, "a RenewListener of lock \"" + name + "\" failed", e);
      }
    }
  }

  /**
   * Renews the lease now, on its connection, for its ttl. Returns {@code false}, and the lease is
   * lost, if it was no longer live; {@code false} without a round trip if it was released or
   * already lost. No transaction may be open on the connection: the renew commits on its own, so
   * that the client knows the new expiry.
   */
  public boolean renew() throws FencedLockException {
    if (isEnded() || lost.get()) {
      return false;
    }
    FencedLock.requireOutsideTransaction(connection, "renew");
    long sent = System.nanoTime();
    boolean ok;
    try {
      ok = FencedLock.onItsOwn(connection, () -> locker.callRenew(connection, name, token, ttl));
    } catch (SQLException e) {
      throw FencedLockException.from(e);
    }
    if (ok) {
      renewedAt(sent);
    } else {
      signalLost();
    }
    return ok;
  }

  /**
   * Calls {@code fenced_lock_assert} on the lease's connection, inside its transaction if one is
   * open: {@link StaleTokenException} unless the token is live, and until that transaction ends no
   * other lease of the name can be granted. A guarded {@code DELETE} needs it earlier in its
   * transaction.
   */
  public void assertLive() throws FencedLockException {
    try {
      locker.callAssert(connection, name, token);
    } catch (SQLException e) {
      throw FencedLockException.from(e);
    }
  }

  // ---- the end ----

  private synchronized boolean isEnded() {
    return ended;
  }

  private synchronized boolean markEnded() {
    if (ended) {
      return false;
    }
    ended = true;
    return true;
  }

  /**
   * Ends the lease: stops the keepalive first (waiting for a renew in flight, and closing its
   * connection), then calls {@code fenced_lock_release} on the lease's connection. If that
   * connection is inside a transaction, the release is part of it and takes effect when the
   * caller commits (guarded writes, then release, then commit); a failed transaction there is
   * rolled back first. If the connection is gone, the release is sent on a new connection of the
   * locker.
   *
   * <p>Returns the server's answer: {@code false} if the lease was no longer live. A lost lease is
   * not released, and a second call sends nothing: both return {@code false} without a round trip.
   * A connection the locker opened for the lease is given back here, unless the release joined a
   * transaction, which {@link #close()} then ends.
   */
  public boolean release() throws FencedLockException {
    if (isEnded()) {
      return false;
    }
    isLost(); // a lease without a keepalive notices its deadline here
    if (!markEnded()) {
      return false;
    }
    stopKeepalive();
    if (lost.get()) {
      closeOwnedIfIdle();
      return false;
    }
    try {
      return sendRelease();
    } finally {
      closeOwnedIfIdle();
    }
  }

  /**
   * Releases the lease unless it was already released or lost, and gives back the connection the
   * locker opened for it. The scoped form: {@code try (Lease lease = locks.acquire(...)) {...}}.
   */
  @Override
  public void close() throws FencedLockException {
    try {
      release();
    } finally {
      closeOwned();
    }
  }

  /**
   * Stops the keepalive and gives back the lease's connection without releasing: the lease lives
   * on until its ttl runs out (or, session-bound, its session ends). For a lease you hand over, or
   * whose state you cannot trust. Sends nothing on the lease's connection.
   */
  public void abandon() {
    markEnded();
    stopKeepalive();
    closeOwned();
  }

  private void stopKeepalive() {
    Keepalive k = keepalive;
    if (k != null) {
      k.stopAndJoin();
    }
  }

  private boolean sendRelease() throws FencedLockException {
    SQLException failure = null;
    try {
      if (!connection.isClosed()) {
        TransactionState state = FencedLock.transactionState(connection);
        if (state == TransactionState.FAILED) {
          // A failed transaction can only roll back; the release must not be lost with it.
          FencedLock.rollback(connection);
          state = TransactionState.IDLE;
        }
        boolean own = state != TransactionState.OPEN;
        boolean released = locker.callRelease(connection, name, token);
        if (own && !connection.getAutoCommit()) {
          connection.commit();
        }
        return released;
      }
    } catch (SQLException e) {
      if (!FencedLock.isConnectionError(e, connection)) {
        throw FencedLockException.from(e);
      }
      failure = e;
    }
    // The lease's connection is gone: a plain lease is still live and must be ended, from
    // anywhere (a session-bound one ended with that session, and the server answers false).
    try (Connection fresh = locker.source.openLease()) {
      return locker.callRelease(fresh, name, token);
    } catch (SQLException e) {
      if (failure != null) {
        e.addSuppressed(failure);
      }
      throw FencedLockException.from(e);
    }
  }

  private void closeOwnedIfIdle() {
    if (!ownsConnection) {
      return;
    }
    try {
      if (!connection.isClosed() && FencedLock.transactionState(connection) == TransactionState.OPEN) {
        return; // the caller's transaction holds the release: close() ends it
      }
    } catch (SQLException e) {
      // A connection that cannot tell its state is not worth keeping.
    }
    closeOwned();
  }

  private void closeOwned() {
    if (!ownsConnection) {
      return;
    }
    synchronized (this) {
      if (connectionClosed) {
        return;
      }
      connectionClosed = true;
    }
    ConnectionSource.closeQuietly(connection);
  }

  @Override
  public String toString() {
    return "Lease[name=" + name + ", token=" + token + ", ttl=" + ttl + (lost.get() ? ", lost" : "") + "]";
  }

  /** A listener called at most once, whichever thread gets there first. */
  private static final class Once {
    final LostListener listener;
    private final AtomicBoolean fired = new AtomicBoolean();

    Once(LostListener listener) {
      this.listener = listener;
    }

    void fire(Lease lease) {
      if (!fired.compareAndSet(false, true)) {
        return;
      }
      try {
        listener.onLost(lease);
      } catch (RuntimeException e) {
        LOG.log(Level.WARNING, "a LostListener of lock \"" + lease.name + "\" failed", e);
      }
    }
  }
}
