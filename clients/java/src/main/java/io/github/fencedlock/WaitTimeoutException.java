package io.github.fencedlock;

/**
 * SQLSTATE {@code 55P03}, wait timeout: {@link FencedLock#acquire} waited its {@code maxWait} (or
 * the session's {@code lock_timeout}) without a grant.
 */
public class WaitTimeoutException extends FencedLockException {
  private static final long serialVersionUID = 1L;

  /** The SQLSTATE of this error. */
  public static final String SQLSTATE = "55P03";

  public WaitTimeoutException(String message, String detail, String hint, Throwable cause) {
    super(message, SQLSTATE, detail, hint, cause);
  }
}
