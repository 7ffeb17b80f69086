import { DatabaseError } from 'pg';

/** The fields of a server error this library keeps on its own errors. */
const FIELDS = [
  'severity', 'code', 'detail', 'hint', 'position', 'internalPosition', 'internalQuery',
  'where', 'schema', 'table', 'column', 'dataType', 'constraint', 'file', 'line', 'routine',
] as const;

/**
 * Base of every error fenced-lock raises for a server error (and for the
 * client-side argument check, which uses the server's code). It is a
 * node-postgres `DatabaseError`, so code that already looks at `err.code`
 * keeps working; `sqlstate` is the same value under the name the SQL API uses.
 */
export class FencedLockError extends DatabaseError {
  constructor(message: string, code: string | undefined, cause?: unknown) {
    super(message, 0, 'error');
    // DatabaseError stores the protocol message name ("error") in `name`;
    // the class name is what a stack trace or a log line should show.
    Object.defineProperty(this, 'name', { value: new.target.name, configurable: true, writable: true });
    this.code = code;
    if (cause !== undefined) {
      Object.defineProperty(this, 'cause', { value: cause, configurable: true, writable: true });
      if (cause instanceof Error) {
        const src = cause as Partial<Record<(typeof FIELDS)[number], string>>;
        for (const f of FIELDS) {
          if (f !== 'code' && src[f] !== undefined) (this as unknown as Record<string, unknown>)[f] = src[f];
        }
      }
    }
  }

  /** The SQLSTATE (`FL001`, `55P03`, ...), or undefined when there is none. */
  get sqlstate(): string | undefined {
    return this.code;
  }
}

/** `FL001`: a guarded write or `fenced_lock_assert` with a token that is not live. */
export class StaleTokenError extends FencedLockError {}
/** `FL002`: a guarded write without a token. */
export class MissingTokenError extends FencedLockError {}
/** `FL003`: the request can never be granted as asked (another mode or permit count is live, an upgrade, waiting for a lease of this very session). */
export class ModeConflictError extends FencedLockError {}
/** `55P03`: `acquire` waited `wait` (or `lock_timeout`) without a grant. */
export class WaitTimeoutError extends FencedLockError {}
/** `25006`: a lease change on a standby or in a read-only transaction. */
export class ReadOnlyError extends FencedLockError {}
/** `42501`: renew or release of another role's lease, a role without EXECUTE, and the like. */
export class NotAllowedError extends FencedLockError {}

/**
 * `22023`: a bad argument value. Raised by the client, before anything is
 * sent, for what it can judge (then `argument` names the argument), and by
 * the server for the rest (an over-long name, a ttl above
 * `fenced_lock.max_ttl`).
 */
export class InvalidArgumentError extends FencedLockError {
  /** The argument the client refused; undefined when the server raised it. */
  readonly argument: string | undefined;
  constructor(message: string, argument?: string, cause?: unknown) {
    super(message, '22023', cause);
    this.argument = argument;
  }
}

/**
 * The reason `lease.signal` is aborted with and the argument of the `'lost'`
 * event. It is a StaleTokenError (`FL001`) because that is what a write with
 * the lost token gets from a guarded table: `withLock` retries on either.
 */
export class LeaseLostError extends StaleTokenError {
  readonly lockName: string;
  readonly token: bigint;
  /** Why the client knows: the renew said `false`, or the deadline passed without a renew. */
  readonly reason: 'renew_false' | 'deadline';
  constructor(lockName: string, token: bigint, reason: 'renew_false' | 'deadline') {
    super(
      reason === 'renew_false'
        ? `lease of ${JSON.stringify(lockName)} (token ${token}) was lost: the server says it is no longer live`
        : `lease of ${JSON.stringify(lockName)} (token ${token}) was lost: its ttl ran out before a renew succeeded`,
      'FL001',
    );
    this.lockName = lockName;
    this.token = token;
    this.reason = reason;
  }
}

/**
 * A call that cannot be right whatever the server says: an acquire on a
 * connection inside a transaction block, a session-bound lease through a
 * transaction pooler. Nothing was sent.
 */
export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'UsageError';
  }
}

type ErrorClass = new (message: string, code: string | undefined, cause?: unknown) => FencedLockError;

const BY_SQLSTATE: Record<string, ErrorClass> = {
  FL001: StaleTokenError,
  FL002: MissingTokenError,
  FL003: ModeConflictError,
  '55P03': WaitTimeoutError,
  '25006': ReadOnlyError,
  '42501': NotAllowedError,
};

/** The SQLSTATE of an error of node-postgres or of this library, if it has one. */
export function sqlstateOf(err: unknown): string | undefined {
  if (err === null || typeof err !== 'object') return undefined;
  const code = (err as { code?: unknown }).code;
  // Node's own errors (ECONNREFUSED, ...) also use `code`; SQLSTATEs are five
  // characters of digits and upper-case letters.
  return typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code) ? code : undefined;
}

/** Is this error a stale token (`FL001`), from a guarded write, an assert or a lost lease. */
export function isStaleToken(err: unknown): boolean {
  return sqlstateOf(err) === 'FL001';
}

/**
 * The typed error for a server error: a node-postgres `DatabaseError` with a
 * SQLSTATE of the table becomes its class, any other SQLSTATE a
 * FencedLockError; errors of this library are returned as they are, and so
 * are errors without a SQLSTATE (connection errors).
 */
export function mapError(err: unknown): unknown {
  if (err instanceof FencedLockError) return err;
  const code = sqlstateOf(err);
  if (code === undefined) return err;
  const message = err instanceof Error ? err.message : String(err);
  if (code === '22023') return new InvalidArgumentError(message, undefined, err);
  const Cls = BY_SQLSTATE[code] ?? FencedLockError;
  return new Cls(message, code, err);
}
