package io.github.fencedlock;

/**
 * SQLSTATE {@code FL001}, stale token: a guarded write or {@code fenced_lock_assert} with a token
 * that is not the live lease (superseded, released, expired, its session ended). Nothing was
 * written; acquire again, re-read, and retry with the new token (that is what {@link
 * FencedLock#run} does).
 */
public class StaleTokenException extends FencedLockException {
  private static final long serialVersionUID = 1L;

  /** The SQLSTATE of this error. */
  public static final String SQLSTATE = "FL001";

  public StaleTokenException(String message, String detail, String hint, Throwable cause) {
    super(message, SQLSTATE, detail, hint, cause);
  }
}
