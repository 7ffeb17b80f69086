package io.github.fencedlock;

import java.sql.SQLException;

/**
 * The work {@link FencedLock#run} does under a lease: read, then write with {@link Lease#token()}
 * on {@link Lease#connection()}. It may throw {@link SQLException} (the database's refusal of a
 * stale token, {@code FL001}, makes {@code run} start over from the acquire) and {@code E}.
 */
@FunctionalInterface
public interface LeaseFunction<T, E extends Exception> {
  T apply(Lease lease) throws E, SQLException;
}
