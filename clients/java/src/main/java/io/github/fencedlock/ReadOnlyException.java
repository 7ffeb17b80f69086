package io.github.fencedlock;

/**
 * SQLSTATE {@code 25006}, read only: a lease change on a hot standby or in a read-only
 * transaction.
 */
public class ReadOnlyException extends FencedLockException {
  private static final long serialVersionUID = 1L;

  /** The SQLSTATE of this error. */
  public static final String SQLSTATE = "25006";

  public ReadOnlyException(String message, String detail, String hint, Throwable cause) {
    super(message, SQLSTATE, detail, hint, cause);
  }
}
