package io.github.fencedlock;

/**
 * Told once when a lease is lost: a renew said {@code false} (the lease expired, was released or
 * force-released by someone else, or its session ended), or the client's deadline passed before a
 * renew succeeded. Stop the work and do not write; the database refuses writes with the lost
 * token anyway ({@code FL001}). It runs on the lease's keepalive thread (or on the thread that
 * added it, if the lease was already lost); keep it short, and do not release the lease from it.
 */
@FunctionalInterface
public interface LostListener {
  void onLost(Lease lease);
}
