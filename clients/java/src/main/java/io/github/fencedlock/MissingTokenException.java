package io.github.fencedlock;

/**
 * SQLSTATE {@code FL002}, missing token: a guarded write without a token (a {@code NULL} token
 * column, or a {@code DELETE} without {@code fenced_lock_assert} in its transaction).
 */
public class MissingTokenException extends FencedLockException {
  private static final long serialVersionUID = 1L;

  /** The SQLSTATE of this error. */
  public static final String SQLSTATE = "FL002";

  public MissingTokenException(String message, String detail, String hint, Throwable cause) {
    super(message, SQLSTATE, detail, hint, cause);
  }
}
