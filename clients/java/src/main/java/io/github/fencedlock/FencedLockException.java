package io.github.fencedlock;

import java.sql.SQLException;
import org.postgresql.util.PSQLException;
import org.postgresql.util.ServerErrorMessage;

/**
 * An error of fenced_lock or of the database under it. It is a {@link SQLException}, so code that
 * already handles JDBC errors handles these too; {@link #getSQLState()} is the server's SQLSTATE
 * ({@code null} for a {@link UsageException}), and {@link #detail()} and {@link #hint()} carry the
 * server's DETAIL and HINT.
 *
 * <p>The SQLSTATEs of fenced_lock's reference each have a subclass: {@code FL001} {@link
 * StaleTokenException}, {@code FL002} {@link MissingTokenException}, {@code FL003} {@link
 * ModeConflictException}, {@code 55P03} {@link WaitTimeoutException}, {@code 25006} {@link
 * ReadOnlyException}, {@code 42501} {@link NotAllowedException}, {@code 22023} {@link
 * InvalidArgumentException}. Any other SQLSTATE (a lost connection, {@code 22004}, {@code 40001},
 * ...) is a plain {@code FencedLockException} with its code.
 */
public class FencedLockException extends SQLException {
  private static final long serialVersionUID = 1L;

  private final String detail;
  private final String hint;

  public FencedLockException(String message, String sqlState, String detail, String hint, Throwable cause) {
    super(message, sqlState, cause);
    this.detail = detail;
    this.hint = hint;
  }

  /** The server's DETAIL, or {@code null}. */
  public String detail() {
    return detail;
  }

  /** The server's HINT, or {@code null}. */
  public String hint() {
    return hint;
  }

  /** The server's SQLSTATE (the same as {@link #getSQLState()}); {@code null} when there is none. */
  public String sqlState() {
    return getSQLState();
  }

  /**
   * The typed error for a JDBC error, e.g. one a guarded {@code UPDATE} of your own raised: {@code
   * FL001} gives a {@link StaleTokenException}, and so on. An error that already is a {@code
   * FencedLockException} is returned as it is; otherwise the result has {@code e} as its cause.
   */
  public static FencedLockException from(SQLException e) {
    if (e instanceof FencedLockException) {
      return (FencedLockException) e;
    }
    String state = e.getSQLState();
    String message = e.getMessage();
    String detail = null;
    String hint = null;
    if (e instanceof PSQLException) {
      ServerErrorMessage server = ((PSQLException) e).getServerErrorMessage();
      if (server != null) {
        // PgJDBC's own message glues DETAIL, HINT and the position onto the primary message;
        // keep the parts apart, as the server sent them.
        if (server.getMessage() != null) {
          message = server.getMessage();
        }
        if (server.getSQLState() != null) {
          state = server.getSQLState();
        }
        detail = server.getDetail();
        hint = server.getHint();
      }
    }
    return of(state, message, detail, hint, e);
  }

  static FencedLockException of(String state, String message, String detail, String hint, Throwable cause) {
    if (state == null) {
      return new FencedLockException(message, null, detail, hint, cause);
    }
    switch (state) {
      case StaleTokenException.SQLSTATE:
        return new StaleTokenException(message, detail, hint, cause);
      case MissingTokenException.SQLSTATE:
        return new MissingTokenException(message, detail, hint, cause);
      case ModeConflictException.SQLSTATE:
        return new ModeConflictException(message, detail, hint, cause);
      case WaitTimeoutException.SQLSTATE:
        return new WaitTimeoutException(message, detail, hint, cause);
      case ReadOnlyException.SQLSTATE:
        return new ReadOnlyException(message, detail, hint, cause);
      case NotAllowedException.SQLSTATE:
        return new NotAllowedException(message, detail, hint, cause);
      case InvalidArgumentException.SQLSTATE:
        return new InvalidArgumentException(message, detail, hint, cause);
      default:
        return new FencedLockException(message, state, detail, hint, cause);
    }
  }

  /**
   * Whether {@code t}, or an exception in its chain of causes, is a JDBC error with SQLSTATE
   * {@code FL001}: the database refused a write or an assert because the token was not live. A
   * {@link LeaseLostException} counts too. Frameworks that wrap {@link SQLException} in their own
   * unchecked exceptions are seen through.
   */
  public static boolean isStaleToken(Throwable t) {
    return findStaleToken(t) != null;
  }

  static SQLException findStaleToken(Throwable t) {
    // Bounded: a cause chain can in principle be a cycle.
    for (int depth = 0; t != null && depth < 32; depth++, t = t.getCause()) {
      if (t instanceof SQLException) {
        SQLException s = (SQLException) t;
        if (StaleTokenException.SQLSTATE.equals(s.getSQLState())) {
          return s;
        }
        SQLException next = s.getNextException();
        if (next != null && StaleTokenException.SQLSTATE.equals(next.getSQLState())) {
          return next;
        }
      }
    }
    return null;
  }
}
