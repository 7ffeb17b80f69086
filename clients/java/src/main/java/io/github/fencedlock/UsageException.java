package io.github.fencedlock;

/**
 * The library was used in a way that cannot work, found before anything was sent: an acquire or
 * a renew on a connection inside a transaction (its grant would not be visible to the keepalive
 * until the caller commits), or a session-bound lease from a locker built for transaction pooling
 * (its session would be a pooled server connection that other clients share). It has no
 * SQLSTATE.
 */
public class UsageException extends FencedLockException {
  private static final long serialVersionUID = 1L;

  public UsageException(String message) {
    super(message, null, null, null, null);
  }
}
