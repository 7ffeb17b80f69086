package io.github.fencedlock;

/**
 * Thrown by {@link Lease#checkNotLost()} when the client already knows the lease is lost, so the
 * work can stop before a write the database would refuse anyway. It is a {@link
 * StaleTokenException} ({@code FL001}), so {@link FencedLock#run} retries it like a refused
 * write.
 */
public class LeaseLostException extends StaleTokenException {
  private static final long serialVersionUID = 1L;

  public LeaseLostException(String name, long token) {
    super("lease " + token + " of lock \"" + name + "\" was lost", "lock: \"" + name + "\"; token: " + token,
        "Stop the work and do not write; acquire the lock again, re-read, and retry with the new token.", null);
  }
}
