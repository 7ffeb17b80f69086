package io.github.fencedlock;

/**
 * SQLSTATE {@code 22023}, invalid argument: a bad argument value. The client checks what it can
 * before anything is sent (an empty name, a ttl that is not positive, a negative wait, {@code
 * permits} below 1, {@code shared} with {@code permits} above 1, ...), with a message naming the
 * argument; what only the server can judge (a name over 512 bytes, a ttl above {@code
 * fenced_lock.max_ttl}) comes back from it with this same type.
 */
public class InvalidArgumentException extends FencedLockException {
  private static final long serialVersionUID = 1L;

  /** The SQLSTATE of this error. */
  public static final String SQLSTATE = "22023";

  public InvalidArgumentException(String message, String detail, String hint, Throwable cause) {
    super(message, SQLSTATE, detail, hint, cause);
  }

  /** A client-side check: nothing was sent. */
  static InvalidArgumentException argument(String argument, String problem) {
    return new InvalidArgumentException(argument + ": " + problem, null, null, null);
  }
}
