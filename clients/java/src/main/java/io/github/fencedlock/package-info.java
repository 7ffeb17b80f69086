/**
 * The Java client of fenced_lock: leased named locks in PostgreSQL with fencing tokens, kept alive
 * in the background, released by try-with-resources, retried on a stale token.
 *
 * <p>Start with {@link io.github.fencedlock.FencedLock}: build a locker from a connection string,
 * a {@link javax.sql.DataSource} or a {@link io.github.fencedlock.ConnectionFactory}, then {@code
 * acquire}, {@code tryAcquire} or {@code run}. A {@link io.github.fencedlock.Lease} carries the
 * token to write with, tells when it is lost ({@code isLost()}, {@link
 * io.github.fencedlock.LostListener}, {@code lostFuture()}), and is released by {@code close()}.
 * Errors are {@link io.github.fencedlock.FencedLockException}s, a {@link java.sql.SQLException}
 * with a subclass per SQLSTATE of fenced_lock.
 */
package io.github.fencedlock;
