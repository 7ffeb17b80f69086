package io.github.fencedlock;

/**
 * SQLSTATE {@code FL003}, mode conflict: the request can never be granted as asked (another permit
 * count or mode is live on the name, an upgrade from shared to exclusive, or waiting for a lease
 * of this very session). Waiting would not help.
 */
public class ModeConflictException extends FencedLockException {
  private static final long serialVersionUID = 1L;

  /** The SQLSTATE of this error. */
  public static final String SQLSTATE = "FL003";

  public ModeConflictException(String message, String detail, String hint, Throwable cause) {
    super(message, SQLSTATE, detail, hint, cause);
  }
}
