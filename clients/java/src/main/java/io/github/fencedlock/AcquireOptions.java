package io.github.fencedlock;

import java.sql.Connection;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/**
 * The arguments of an acquire besides the name, with the server's defaults: a ttl of 30 seconds,
 * no holder, not session-bound, exclusive ({@code shared = false}, {@code permits = 1}), waiting
 * until granted, keepalive on, on a connection the locker opens. Immutable: every method returns
 * a changed copy.
 *
 * <pre>{@code
 * AcquireOptions o = AcquireOptions.defaults().ttl(Duration.ofSeconds(10)).holder("worker-7");
 * }</pre>
 *
 * <p>The values are checked when the acquire is called, before anything is sent.
 */
public final class AcquireOptions {
  /** The server's default ttl. */
  public static final Duration DEFAULT_TTL = Duration.ofSeconds(30);

  private static final AcquireOptions DEFAULTS =
      new AcquireOptions(DEFAULT_TTL, null, null, false, false, 1, true, null, List.of(), List.of());

  final Duration ttl;
  final Duration maxWait;
  final String holder;
  final boolean sessionBound;
  final boolean shared;
  final int permits;
  final boolean keepalive;
  final Connection connection;
  final List<LostListener> lostListeners;
  final List<RenewListener> renewListeners;

  private AcquireOptions(Duration ttl, Duration maxWait, String holder, boolean sessionBound, boolean shared,
      int permits, boolean keepalive, Connection connection, List<LostListener> lostListeners,
      List<RenewListener> renewListeners) {
    this.ttl = ttl;
    this.maxWait = maxWait;
    this.holder = holder;
    this.sessionBound = sessionBound;
    this.shared = shared;
    this.permits = permits;
    this.keepalive = keepalive;
    this.connection = connection;
    this.lostListeners = lostListeners;
    this.renewListeners = renewListeners;
  }

  /** The server's defaults. */
  public static AcquireOptions defaults() {
    return DEFAULTS;
  }

  /** How long the lease lives unless renewed (the keepalive renews it); positive. */
  public AcquireOptions ttl(Duration ttl) {
    return new AcquireOptions(ttl, maxWait, holder, sessionBound, shared, permits, keepalive, connection,
        lostListeners, renewListeners);
  }

  /**
   * How long {@link FencedLock#acquire} waits in line before it gives up with a {@link
   * WaitTimeoutException}; zero or more, {@code null} (the default) waits until granted. An
   * argument of {@code acquire} only: {@code tryAcquire} never waits, and refuses it.
   */
  public AcquireOptions maxWait(Duration maxWait) {
    return new AcquireOptions(ttl, maxWait, holder, sessionBound, shared, permits, keepalive, connection,
        lostListeners, renewListeners);
  }

  /**
   * A text naming the worker (at most 512 bytes): an acquire by the same role and holder of a
   * name whose live lease it holds gets the same token back, so an acquire whose reply was lost
   * can be sent again.
   */
  public AcquireOptions holder(String holder) {
    return new AcquireOptions(ttl, maxWait, holder, sessionBound, shared, permits, keepalive, connection,
        lostListeners, renewListeners);
  }

  /**
   * The lease also ends when the session of its connection ends. The lease's connection is then
   * the one thing keeping it: do not give it to a transaction pooler (see {@link
   * FencedLock.Builder#transactionPooling}).
   */
  public AcquireOptions sessionBound(boolean sessionBound) {
    return new AcquireOptions(ttl, maxWait, holder, sessionBound, shared, permits, keepalive, connection,
        lostListeners, renewListeners);
  }

  /**
   * A shared lease: any number of shared leases of a name live together, each with its own
   * token; an exclusive one excludes them all. Needs fenced_lock 0.3.0 on the server.
   */
  public AcquireOptions shared(boolean shared) {
    return new AcquireOptions(ttl, maxWait, holder, sessionBound, shared, permits, keepalive, connection,
        lostListeners, renewListeners);
  }

  /**
   * A counting semaphore of {@code permits} (at least 1): up to that many leases of the name live
   * at once, each with its own token. 1 is a plain exclusive lease. More needs fenced_lock 0.3.0.
   */
  public AcquireOptions permits(int permits) {
    return new AcquireOptions(ttl, maxWait, holder, sessionBound, shared, permits, keepalive, connection,
        lostListeners, renewListeners);
  }

  /**
   * Whether a background thread renews the lease every keepalive interval (default: on). Off, the
   * lease lives its ttl unless you call {@link Lease#renew()}.
   */
  public AcquireOptions keepalive(boolean keepalive) {
    return new AcquireOptions(ttl, maxWait, holder, sessionBound, shared, permits, keepalive, connection,
        lostListeners, renewListeners);
  }

  /**
   * Acquire on this connection, and release on it, instead of one the locker opens. No
   * transaction may be open on it when the acquire is called (the grant commits on its own, also
   * with autocommit off). The lease never closes it.
   */
  public AcquireOptions connection(Connection connection) {
    return new AcquireOptions(ttl, maxWait, holder, sessionBound, shared, permits, keepalive, connection,
        lostListeners, renewListeners);
  }

  /** A listener added to the lease before its keepalive starts. */
  public AcquireOptions onLost(LostListener listener) {
    List<LostListener> l = new ArrayList<>(lostListeners);
    l.add(listener);
    return new AcquireOptions(ttl, maxWait, holder, sessionBound, shared, permits, keepalive, connection,
        Collections.unmodifiableList(l), renewListeners);
  }

  /** A listener added to the lease before its keepalive starts. */
  public AcquireOptions onRenewed(RenewListener listener) {
    List<RenewListener> l = new ArrayList<>(renewListeners);
    l.add(listener);
    return new AcquireOptions(ttl, maxWait, holder, sessionBound, shared, permits, keepalive, connection,
        lostListeners, Collections.unmodifiableList(l));
  }

  public Duration ttl() {
    return ttl;
  }

  public Duration maxWait() {
    return maxWait;
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

  public boolean keepalive() {
    return keepalive;
  }

  public Connection connection() {
    return connection;
  }
}
