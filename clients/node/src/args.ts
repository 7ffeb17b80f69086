import type { ClientBase } from 'pg';
import { InvalidArgumentError } from './errors';

/** Options of a lease, for `tryAcquire`, `acquire` and `withLock`. Durations are milliseconds. */
export interface LeaseOptions {
  /** How long the lease lives unless renewed, in milliseconds (default 30 000). */
  ttl?: number;
  /** Identifies the worker for a retry-safe acquire (the server's `holder`). */
  holder?: string | null;
  /** The lease also ends when the session of its connection ends (default false). */
  sessionBound?: boolean;
  /** A shared lease (0.3.0 servers): any number live together, an exclusive one excludes them. */
  shared?: boolean;
  /** A counting semaphore of this many permits (0.3.0 servers; default 1, an exclusive lease). */
  permits?: number;
  /** Renew in the background with a connection of its own (default true). */
  keepalive?: boolean;
  /** Milliseconds between renewals (default: the locker's, else ttl / 3). */
  keepaliveInterval?: number;
  /**
   * Run the acquire and the release on this connection (it must not be
   * inside a transaction block). Default: one the locker opens or takes from
   * its pool and keeps for the lease's life.
   */
  client?: ClientBase;
}

export interface AcquireOptions extends LeaseOptions {
  /** How long to wait in line, in milliseconds; null or absent: until granted. */
  wait?: number | null;
}

export interface WithLockOptions extends AcquireOptions {
  /** How many times in all to run when the work hits a stale token (default: the locker's, 5). */
  attempts?: number;
}

export interface LockerOptions {
  /** Milliseconds between renewals for every lease (default: each lease's ttl / 3). */
  keepaliveInterval?: number;
  /** Default attempts of `withLock` (default 5). */
  attempts?: number;
  /**
   * The locker talks to PgBouncer or another pooler in transaction mode:
   * session-bound leases are refused, and no session state (SET) is sent.
   */
  transactionPooling?: boolean;
  /** Schema of the extension's functions, when they are not on the search_path. */
  schema?: string;
  /** Size of the locker's own pool of lease connections, when built from a connection string or config (default 10). */
  poolSize?: number;
}

/** The server's int4 bound, for `permits`. */
const INT4_MAX = 2147483647;

export function invalid(argument: string, requirement: string, value: unknown): InvalidArgumentError {
  return new InvalidArgumentError(`invalid argument "${argument}": ${requirement}, got ${describe(value)}`, argument);
}

function describe(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'bigint') return `${value}n`;
  if (typeof value === 'function') return 'a function';
  if (Array.isArray(value)) return 'an array';
  if (value === null) return 'null';
  if (typeof value === 'object') return 'an object';
  return String(value);
}

function checkKeys(what: string, options: object, allowed: readonly string[]): void {
  for (const key of Object.keys(options)) {
    if (!allowed.includes(key)) {
      // A misspelt option (sessionbound, ttlMs) would otherwise be dropped in
      // silence and give a lease the caller did not ask for.
      throw new InvalidArgumentError(`invalid argument "${key}": not an option of ${what} (options: ${allowed.join(', ')})`, key);
    }
  }
}

export function checkOptionsObject(what: string, options: unknown): Record<string, unknown> {
  if (options === undefined) return {};
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw invalid('options', `the options of ${what} must be an object`, options);
  }
  return options as Record<string, unknown>;
}

export function checkName(name: unknown): string {
  if (typeof name !== 'string' || name.length === 0) throw invalid('name', 'must be a non-empty string', name);
  return name;
}

function positiveMs(argument: string, value: unknown): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0) {
    throw invalid(argument, 'must be a finite number of milliseconds > 0', value);
  }
  return value;
}

function bool(argument: string, value: unknown, dflt: boolean): boolean {
  if (value === undefined) return dflt;
  if (typeof value !== 'boolean') throw invalid(argument, 'must be a boolean', value);
  return value;
}

function positiveInt(argument: string, value: unknown, max: number): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 1 || value > max) {
    throw invalid(argument, `must be an integer from 1 to ${max}`, value);
  }
  return value;
}

export interface CheckedLockerOptions {
  keepaliveInterval: number | null;
  attempts: number;
  transactionPooling: boolean;
  schema: string | null;
  poolSize: number;
}

export function checkLockerOptions(options: unknown): CheckedLockerOptions {
  const o = checkOptionsObject('Locker', options);
  checkKeys('Locker', o, ['keepaliveInterval', 'attempts', 'transactionPooling', 'schema', 'poolSize']);
  const schema = o.schema;
  if (schema !== undefined && (typeof schema !== 'string' || schema.length === 0)) {
    throw invalid('schema', 'must be a non-empty string', schema);
  }
  return {
    keepaliveInterval: o.keepaliveInterval === undefined ? null : positiveMs('keepaliveInterval', o.keepaliveInterval),
    attempts: o.attempts === undefined ? 5 : positiveInt('attempts', o.attempts, 1000),
    transactionPooling: bool('transactionPooling', o.transactionPooling, false),
    schema: (schema as string | undefined) ?? null,
    poolSize: o.poolSize === undefined ? 10 : positiveInt('poolSize', o.poolSize, 10000),
  };
}

export interface CheckedLeaseOptions {
  ttl: number;
  wait: number | null;
  holder: string | null;
  sessionBound: boolean;
  shared: boolean;
  permits: number;
  keepalive: boolean;
  keepaliveInterval: number;
  client: ClientBase | null;
  attempts: number;
}

const LEASE_KEYS = ['ttl', 'holder', 'sessionBound', 'shared', 'permits', 'keepalive', 'keepaliveInterval', 'client'] as const;

/**
 * Every argument of an acquire, checked before anything is sent, in the
 * order of the server's parameters (so the first bad one is the one named).
 */
export function checkLeaseOptions(
  what: 'tryAcquire' | 'acquire' | 'withLock',
  options: unknown,
  locker: CheckedLockerOptions,
): CheckedLeaseOptions {
  const o = checkOptionsObject(what, options);
  const keys: string[] = [...LEASE_KEYS];
  if (what !== 'tryAcquire') keys.push('wait');
  if (what === 'withLock') keys.push('attempts');
  checkKeys(what, o, keys);

  const ttl = o.ttl === undefined ? 30_000 : positiveMs('ttl', o.ttl);
  let wait: number | null = null;
  if (o.wait !== undefined && o.wait !== null) {
    if (typeof o.wait !== 'number' || !Number.isFinite(o.wait) || o.wait < 0) {
      throw invalid('wait', 'must be a finite number of milliseconds >= 0, or null to wait until granted', o.wait);
    }
    wait = o.wait;
  }
  let holder: string | null = null;
  if (o.holder !== undefined && o.holder !== null) {
    if (typeof o.holder !== 'string') throw invalid('holder', 'must be a string or null', o.holder);
    holder = o.holder;
  }
  const sessionBound = bool('sessionBound', o.sessionBound, false);
  const shared = bool('shared', o.shared, false);
  const permits = o.permits === undefined ? 1 : positiveInt('permits', o.permits, INT4_MAX);
  if (shared && permits > 1) {
    throw new InvalidArgumentError(
      `invalid argument "permits": a shared lease has no permit count (shared with permits ${permits}); use one or the other`,
      'permits',
    );
  }
  const keepalive = bool('keepalive', o.keepalive, true);
  let keepaliveInterval = ttl / 3;
  if (o.keepaliveInterval !== undefined) {
    keepaliveInterval = positiveMs('keepaliveInterval', o.keepaliveInterval);
  } else if (locker.keepaliveInterval !== null) {
    keepaliveInterval = locker.keepaliveInterval;
  }
  if (keepalive && keepaliveInterval >= ttl) {
    // Every renew would come after the lease expired: it could never be kept.
    throw invalid('keepaliveInterval', `must be shorter than the ttl (${ttl} ms)`, keepaliveInterval);
  }
  let client: ClientBase | null = null;
  if (o.client !== undefined) {
    const c = o.client as { query?: unknown } | null;
    if (c === null || typeof c !== 'object' || typeof c.query !== 'function') {
      throw invalid('client', 'must be a node-postgres client (Client or PoolClient)', o.client);
    }
    client = o.client as ClientBase;
  }
  const attempts = o.attempts === undefined ? locker.attempts : positiveInt('attempts', o.attempts, 1000);
  return { ttl, wait, holder, sessionBound, shared, permits, keepalive, keepaliveInterval, client, attempts };
}
