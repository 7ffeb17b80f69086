package io.github.fencedlock;

/**
 * SQLSTATE {@code 42501}, not allowed: renew or release of another role's lease, a role without
 * {@code EXECUTE} on fenced_lock's functions, and the like.
 */
public class NotAllowedException extends FencedLockException {
  private static final long serialVersionUID = 1L;

  /** The SQLSTATE of this error. */
  public static final String SQLSTATE = "42501";

  public NotAllowedException(String message, String detail, String hint, Throwable cause) {
    super(message, SQLSTATE, detail, hint, cause);
  }
}
