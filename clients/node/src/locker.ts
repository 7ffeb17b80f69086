import './polyfill';
import type { ClientBase } from 'pg';
import {
  AcquireOptions,
  CheckedLeaseOptions,
  CheckedLockerOptions,
  LeaseOptions,
  LockerOptions,
  WithLockOptions,
  checkLeaseOptions,
  checkLockerOptions,
  checkName,
  invalid,
} from './args';
import { StaleTokenError, UsageError, isStaleToken, mapError } from './errors';
import { Lease, LeaseSql, now, rollbackOwned, startLease, txStatus } from './lease';
import { Conn, LockerSource, Source, borrow, makeSource } from './source';

function quoteIdent(s: string): string {
  return `"${s.replace(/"/g, '""')}"`;
}

/**
 * Hands out leases of named locks (fenced_lock) from a connection string (a
 * `postgresql://` URL or `key=value`), a pg.Pool, a client config or a
 * factory. Each lease uses one connection (its own, or the one given as
 * `options.client`) and its keepalive another.
 */
export class Locker {
  readonly #source: Source;
  readonly #options: CheckedLockerOptions;
  readonly #fn: (name: string) => string;
  readonly #leaseSql: LeaseSql;
  #ended = false;

  constructor(source: LockerSource, options?: LockerOptions) {
    this.#options = checkLockerOptions(options);
    this.#source = makeSource(source, this.#options.transactionPooling, this.#options.poolSize);
    const schema = this.#options.schema;
    this.#fn = (name) => (schema === null ? name : `${quoteIdent(schema)}.${name}`);
    this.#leaseSql = {
      renew: `SELECT ${this.#fn('fenced_lock_renew')}($1, $2::bigint) AS renewed`,
      renewTtl: `SELECT ${this.#fn('fenced_lock_renew')}($1, $2::bigint, make_interval(secs => $3::float8)) AS renewed`,
      release: `SELECT ${this.#fn('fenced_lock_release')}($1, $2::bigint) AS released`,
      assert: `SELECT ${this.#fn('fenced_lock_assert')}($1, $2::bigint)`,
    };
  }

  /** Default attempts of withLock. */
  get attempts(): number {
    return this.#options.attempts;
  }

  get transactionPooling(): boolean {
    return this.#options.transactionPooling;
  }

  /**
   * A lease of `name` now, or null when it cannot be granted without waiting
   * (`fenced_lock_try_acquire`).
   */
  async tryAcquire(name: string, options?: LeaseOptions): Promise<Lease | null> {
    return this.#grant('tryAcquire', checkName(name), checkLeaseOptions('tryAcquire', options, this.#options));
  }

  /**
   * A lease of `name`, waiting in line (FIFO) for at most `options.wait`
   * milliseconds, or until granted (`fenced_lock_acquire`). WaitTimeoutError
   * (55P03) when the wait runs out.
   */
  async acquire(name: string, options?: AcquireOptions): Promise<Lease> {
    const lease = await this.#grant('acquire', checkName(name), checkLeaseOptions('acquire', options, this.#options));
    if (lease === null) throw new Error('fenced_lock_acquire returned NULL');
    return lease;
  }

  /**
   * Acquire (waiting) with keepalive, run `fn(lease)`, release, and return
   * what `fn` returned. When `fn` throws a stale token (FL001: the lease was
   * lost and a guarded write was refused, or LeaseLostError), the lease is
   * dropped without a release and everything runs again from the acquire, up
   * to `attempts` times in all; then the last StaleTokenError is thrown. Any
   * other error is thrown at once, after the release.
   */
  async withLock<T>(name: string, fn: (lease: Lease) => Promise<T> | T, options?: WithLockOptions): Promise<T> {
    const lockName = checkName(name);
    if (typeof fn !== 'function') throw invalid('fn', 'must be a function', fn);
    const o = checkLeaseOptions('withLock', options, this.#options);
    let last: unknown;
    for (let attempt = 1; attempt <= o.attempts; attempt++) {
      const lease = await this.#grant('acquire', lockName, o);
      if (lease === null) throw new Error('fenced_lock_acquire returned NULL');
      let result: T;
      try {
        result = await fn(lease);
      } catch (err) {
        if (isStaleToken(err)) {
          // The token is not live: a release would be refused, and the name
          // may be someone else's by now. Start over from the acquire.
          last = err;
          await lease.abandon();
          continue;
        }
        try {
          // A transaction the work left open on the locker's connection
          // cannot be committed by anyone now, and would keep the release
          // (and the name) inside it.
          await rollbackOwned(lease);
          await lease.release();
        } catch {
          // The work's error is the one the caller needs to see.
        }
        throw err;
      }
      if (await rollbackOwned(lease)) {
        await lease.release();
        throw new UsageError(
          'withLock: fn returned with a transaction still open on the lease connection; it was rolled back. ' +
            'Commit inside fn, or pass your own connection as options.client to commit after withLock returns',
        );
      }
      await lease.release();
      return result;
    }
    const mapped = mapError(last);
    throw mapped instanceof StaleTokenError ? mapped : new StaleTokenError(String(last), 'FL001', last);
  }

  /** Closes the locker's own pool (a pool or factory given by the caller is left alone). */
  async end(): Promise<void> {
    if (this.#ended) return;
    this.#ended = true;
    await this.#source.end();
  }

  async #grant(kind: 'tryAcquire' | 'acquire', name: string, o: CheckedLeaseOptions): Promise<Lease | null> {
    if (this.#options.transactionPooling && o.sessionBound) {
      throw new UsageError(
        'sessionBound is refused with transactionPooling: behind a transaction pooler the session is a server ' +
          'connection that other clients share, so the lease would end with their session, not yours; ' +
          'use a plain lease (a ttl renewed by the keepalive)',
      );
    }
    if (this.#ended) throw new UsageError('this Locker was ended');
    let conn: Conn;
    let owned: boolean;
    if (o.client) {
      refuseTransaction(o.client, 'the connection given as options.client');
      conn = borrow(o.client);
      owned = false;
    } else {
      conn = await this.#source.open('lease', Infinity);
      owned = true;
      const st = txStatus(conn.client);
      if (st === 'T' || st === 'E') {
        await conn.close(true);
        throw new UsageError('the pool handed out a connection inside a transaction block; an acquire must run outside one');
      }
    }
    const [text, values] = this.#acquireSql(kind, name, o);
    const sent = now();
    let row: { token: string | number | bigint | null } | undefined;
    try {
      const r = await conn.client.query(text, values);
      row = r.rows[0];
    } catch (err) {
      await conn.close(conn.dead);
      throw mapError(err);
    }
    if (row === undefined || row.token === null || row.token === undefined) {
      await conn.close();
      return null;
    }
    const answered = now();
    const lease = new Lease({
      name,
      token: BigInt(row.token),
      ttl: o.ttl,
      holder: o.holder,
      sessionBound: o.sessionBound,
      shared: o.shared,
      permits: o.permits,
      keepalive: o.keepalive,
      keepaliveInterval: o.keepaliveInterval,
      conn,
      owned,
      sentAt: sent,
      source: this.#source,
      sql: this.#leaseSql,
    });
    // Its deadline counts from the send; after a wait in line of an interval
    // or more, a renew before the lease is handed over gives it back its ttl.
    await startLease(lease, kind === 'acquire' && answered - sent >= o.keepaliveInterval);
    return lease;
  }

  #acquireSql(kind: 'tryAcquire' | 'acquire', name: string, o: CheckedLeaseOptions): [string, unknown[]] {
    const values: unknown[] = [name, o.ttl / 1000];
    const args = ['name => $1', 'ttl => make_interval(secs => $2::float8)'];
    if (kind === 'acquire') {
      values.push(o.wait === null ? null : o.wait / 1000);
      args.push(`wait => make_interval(secs => $${values.length}::float8)`);
    }
    values.push(o.holder);
    args.push(`holder => $${values.length}::text`);
    values.push(o.sessionBound);
    args.push(`session_bound => $${values.length}::boolean`);
    // Sent only when they differ from the server's defaults, so exclusive
    // leases also work against a 0.2.0 server, which has neither parameter.
    if (o.shared) {
      values.push(true);
      args.push(`shared => $${values.length}::boolean`);
    }
    if (o.permits !== 1) {
      values.push(o.permits);
      args.push(`permits => $${values.length}::integer`);
    }
    const fn = this.#fn(kind === 'acquire' ? 'fenced_lock_acquire' : 'fenced_lock_try_acquire');
    return [`SELECT ${fn}(${args.join(', ')}) AS token`, values];
  }
}

function refuseTransaction(client: ClientBase, what: string): void {
  const st = txStatus(client);
  if (st === 'T' || st === 'E') {
    throw new UsageError(
      `${what} is inside a transaction block: an acquire must run outside one (the grant must be committed ` +
        'before a renew from another connection can see it); nothing was sent',
    );
  }
}
