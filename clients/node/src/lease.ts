import './polyfill';
import { EventEmitter } from 'node:events';
import { performance } from 'node:perf_hooks';
import type { ClientBase, QueryResult, QueryResultRow } from 'pg';
import { LeaseLostError, mapError, sqlstateOf } from './errors';
import { invalid } from './args';
import type { Conn, Source } from './source';

/** The monotonic clock every deadline is kept on (never stepped by NTP or an operator). */
export const now = (): number => performance.now();

/** setTimeout takes at most 2^31 - 1 ms; longer waits are taken in steps. */
const MAX_TIMER = 2 ** 31 - 1;

export interface LeaseEvents {
  /** The lease was lost (once): stop the work; writes with its token are refused. */
  lost: [reason: LeaseLostError];
  /** The keepalive (or `renew()`) extended the lease. */
  renewed: [];
  /** A renew or a keepalive connect failed; the keepalive retries until the deadline. */
  keepaliveError: [error: unknown];
}

/** SQL the lease sends, with the extension's schema already in it. */
export interface LeaseSql {
  renew: string;
  renewTtl: string;
  release: string;
  assert: string;
}

/** @internal What the locker hands a new lease. */
export interface LeaseInit {
  name: string;
  token: bigint;
  ttl: number;
  holder: string | null;
  sessionBound: boolean;
  shared: boolean;
  permits: number;
  keepalive: boolean;
  keepaliveInterval: number;
  conn: Conn;
  owned: boolean;
  /** Monotonic instant the acquire was sent (before the grant): the deadline counts from it. */
  sentAt: number;
  source: Source;
  sql: LeaseSql;
}

type State = 'live' | 'lost' | 'released' | 'abandoned';

let rollbackOwnedImpl: (lease: Lease) => Promise<boolean>;
let startImpl: (lease: Lease, confirm: boolean) => Promise<void>;

/**
 * @internal For withLock: rolls back a transaction the work left open on a
 * connection of the locker (true if there was one).
 */
export function rollbackOwned(lease: Lease): Promise<boolean> {
  return rollbackOwnedImpl(lease);
}

/**
 * @internal For the locker: starts the lease's deadline timer and keepalive.
 * With `confirm` (the acquire waited in line), one renew first: the grant
 * came at some unknown instant of the wait, and the deadline, counted from
 * the acquire's send, may be (nearly) past; the renew's own send starts it
 * again, and a lease that is not live comes back lost.
 */
export function startLease(lease: Lease, confirm: boolean): Promise<void> {
  return startImpl(lease, confirm);
}

/** node-postgres' transaction status of a client: 'I' idle, 'T' in a transaction, 'E' in a failed one. */
export function txStatus(client: ClientBase): 'I' | 'T' | 'E' | null {
  const c = client as unknown as { getTransactionStatus?: () => 'I' | 'T' | 'E' | null; _txStatus?: 'I' | 'T' | 'E' | null };
  if (typeof c.getTransactionStatus === 'function') return c.getTransactionStatus();
  return c._txStatus ?? null;
}

/**
 * A granted lease: its name and fencing token, the connection it was taken
 * on (`client`), and a keepalive that renews it in the background on a
 * connection of its own until it is released or lost.
 *
 * Lost is signalled once, at once: `signal` is aborted (its reason a
 * LeaseLostError) and `'lost'` is emitted. `await using lease = ...` releases
 * it at the end of the block unless it was lost.
 */
export class Lease extends EventEmitter<LeaseEvents> implements AsyncDisposable {
  readonly name: string;
  /** The fencing token: write it into the guarded rows. */
  readonly token: bigint;
  /** Milliseconds the lease was granted for; each renew extends it by as much. */
  readonly ttl: number;
  readonly holder: string | null;
  readonly sessionBound: boolean;
  readonly shared: boolean;
  readonly permits: number;
  readonly keepalive: boolean;
  readonly keepaliveInterval: number;
  /** Aborted when the lease is lost, with a LeaseLostError as its reason. */
  readonly signal: AbortSignal;

  #state: State = 'live';
  readonly #controller = new AbortController();
  readonly #conn: Conn;
  readonly #owned: boolean;
  readonly #source: Source;
  readonly #sql: LeaseSql;
  readonly #tokenText: string;
  /** Send instant of the acquire or of the latest successful renew. */
  #lastSend: number;
  #deadline: number;
  #deadlineTimer: NodeJS.Timeout | undefined;
  #stopped = false;
  #kicked = false;
  #wake: (() => void) | null = null;
  #ka: Conn | null = null;
  /** The keepalive connection being cut after a loss. */
  #kaClosing: Promise<void> = Promise.resolve();
  #loop: Promise<void> = Promise.resolve();
  #ending: Promise<boolean> | null = null;

  /** @internal Leases come from Locker.tryAcquire, acquire and withLock. */
  constructor(init: LeaseInit) {
    super();
    this.name = init.name;
    this.token = init.token;
    this.ttl = init.ttl;
    this.holder = init.holder;
    this.sessionBound = init.sessionBound;
    this.shared = init.shared;
    this.permits = init.permits;
    this.keepalive = init.keepalive;
    this.keepaliveInterval = init.keepaliveInterval;
    this.signal = this.#controller.signal;
    this.#conn = init.conn;
    this.#owned = init.owned;
    this.#source = init.source;
    this.#sql = init.sql;
    this.#tokenText = init.token.toString();
    this.#lastSend = init.sentAt;
    this.#deadline = init.sentAt + init.ttl;
  }

  async #start(confirm: boolean): Promise<void> {
    if (confirm) {
      const sent = now();
      try {
        const r = await this.#conn.client.query<{ renewed: boolean }>(this.#sql.renew, [this.name, this.#tokenText]);
        if (r.rows[0]?.renewed !== true) {
          this.#markLost('renew_false');
          return;
        }
        this.#lastSend = sent;
        this.#deadline = sent + this.ttl;
      } catch (err) {
        // Granted all the same: the deadline stays counted from the acquire's
        // send, and the keepalive (renewing at once) or the deadline decides.
        this.#report(err);
      }
    }
    this.#armDeadline();
    if (this.sessionBound) {
      // The session is the lease: when its connection goes, renew at once to
      // learn from the server whether the lease went with it.
      this.#conn.onDead = () => this.#kick();
    }
    if (this.keepalive) this.#loop = this.#keepaliveLoop().catch(() => undefined);
  }

  /** The lease's connection: run the guarded writes here (or on any connection, with `token`). */
  get client(): ClientBase {
    return this.#conn.client;
  }

  /** The lease was lost (a renew said false, or its ttl ran out before a renew succeeded). */
  get lost(): boolean {
    return this.#state === 'lost';
  }

  /** release() was called (whatever it returned). */
  get released(): boolean {
    return this.#state === 'released';
  }

  /** Milliseconds left before the client's deadline (never later than the server's expiry); 0 once ended. */
  remaining(): number {
    if (this.#state !== 'live') return 0;
    return Math.max(0, this.#deadline - now());
  }

  /** Runs a query on the lease's connection; server errors come back as the typed errors. */
  async query<R extends QueryResultRow = QueryResultRow>(text: string, values?: unknown[]): Promise<QueryResult<R>> {
    try {
      return await this.#conn.client.query<R>(text, values);
    } catch (err) {
      throw mapError(err);
    }
  }

  /**
   * `fenced_lock_assert(name, token)` on the lease's connection: raises
   * StaleTokenError unless the lease is live, and holds the name until the
   * transaction ends (call it before a DELETE of guarded rows).
   */
  async assert(): Promise<void> {
    await this.query(this.#sql.assert, [this.name, this.#tokenText]);
  }

  /**
   * Renews now, on the lease's connection, for `ttl` milliseconds (default:
   * the lease's ttl). Returns false, and signals lost, when the lease is not
   * live; returns false without a round trip once it was lost or released.
   * Inside a transaction the renew is part of it, and the client's deadline
   * stays where it was (the transaction may still roll back).
   */
  async renew(ttl?: number): Promise<boolean> {
    if (ttl !== undefined && (typeof ttl !== 'number' || !Number.isFinite(ttl) || ttl <= 0)) {
      throw invalid('ttl', 'must be a finite number of milliseconds > 0', ttl);
    }
    if (this.#state !== 'live' || this.#ending) return false;
    if (now() >= this.#deadline) {
      this.#markLost('deadline');
      return false;
    }
    const inTransaction = txStatus(this.#conn.client) !== 'I';
    const sent = now();
    const r = await this.query<{ renewed: boolean }>(this.#sql.renewTtl, [
      this.name,
      this.#tokenText,
      ttl === undefined ? null : ttl / 1000,
    ]);
    if (r.rows[0]?.renewed !== true) {
      this.#markLost('renew_false');
      return false;
    }
    if (!inTransaction) this.#renewed(sent, ttl ?? this.ttl);
    return this.#state === 'live';
  }

  /**
   * Ends the lease on the server and returns its answer: false means it was
   * no longer live. The keepalive is stopped first (a renew in flight is
   * waited for, and its connection closed), so no renew follows the release.
   * Runs on the lease's connection, inside its transaction if it is in one
   * (rolled back first if that transaction failed), or on a new connection
   * if that one is gone. A lost lease is not released (false, nothing sent);
   * a second call sends nothing and returns false.
   */
  release(): Promise<boolean> {
    if (this.#ending) return this.#ending.then(() => false, () => false);
    this.#ending = this.#release();
    return this.#ending;
  }

  /**
   * Stops the keepalive and gives the connection back without releasing:
   * the lease ends at its ttl. What `withLock` does with a lease whose token
   * turned out stale.
   */
  async abandon(): Promise<void> {
    if (this.#ending) {
      await this.#ending.catch(() => undefined);
      return;
    }
    this.#ending = (async () => {
      await this.#stopKeepalive();
      if (this.#state === 'live') this.#state = 'abandoned';
      await this.#giveBack(true);
      return false;
    })();
    await this.#ending;
  }

  /**
   * `await using lease = await locker.acquire(...)`: released at the end of
   * the block, unless lost. A transaction left open on a connection of the
   * locker is rolled back first: nobody can commit it after the block, and
   * the release must not wait inside it. (On the caller's own connection the
   * release joins the caller's transaction, as `release()` does.)
   */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.#ending) {
      await this.#ending.catch(() => undefined);
      return;
    }
    await this.#rollbackOwned();
    await this.release();
  }

  static {
    rollbackOwnedImpl = (lease) => lease.#rollbackOwned();
    startImpl = (lease, confirm) => lease.#start(confirm);
  }

  /** Rolls back a transaction open on a connection of the locker; true if there was one. */
  async #rollbackOwned(): Promise<boolean> {
    if (!this.#owned || this.#conn.dead || this.#ending) return false;
    const st = txStatus(this.#conn.client);
    if (st !== 'T' && st !== 'E') return false;
    try {
      await this.#conn.client.query('ROLLBACK');
    } catch {
      // A connection that cannot roll back is not given back to the pool.
      await this.#conn.close(true);
    }
    return true;
  }

  // ---- keepalive ---------------------------------------------------------

  async #keepaliveLoop(): Promise<void> {
    const retry = Math.min(this.keepaliveInterval, 1000);
    // Opened now, so that the first renew does not wait for a connect.
    await this.#keepaliveConn();
    let due = this.#lastSend + this.keepaliveInterval;
    while (!this.#stopped) {
      await this.#sleepUntil(due);
      if (this.#stopped) return;
      // After a pause (GC, SIGSTOP, a stopped VM) the clock is looked at
      // before anything is sent: past the deadline the lease may already
      // belong to someone else, and a renew could not bring it back.
      if (now() >= this.#deadline) {
        this.#markLost('deadline');
        return;
      }
      const ok = await this.#renewOnce();
      if (this.#state !== 'live' || this.#stopped) return;
      // A failed renew is retried (on a new connection when the old one
      // broke) until one succeeds or the deadline passes: renewals never
      // stop because of one error.
      due = ok ? this.#lastSend + this.keepaliveInterval : now() + retry;
    }
  }

  /** Resolves at `due`, or sooner when stopped or kicked. */
  async #sleepUntil(due: number): Promise<void> {
    while (!this.#stopped && !this.#kicked && now() < due) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, Math.min(MAX_TIMER, Math.max(1, due - now())));
        this.#wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.#wake = null;
    }
    this.#kicked = false;
  }

  #kick(): void {
    this.#kicked = true;
    this.#wake?.();
  }

  /** The keepalive's connection, opened if needed; null when that failed (reported). */
  async #keepaliveConn(): Promise<Conn | null> {
    if (this.#ka && !this.#ka.dead) return this.#ka;
    if (this.#ka) {
      await this.#ka.close(true);
      this.#ka = null;
    }
    const timeout = Math.max(1000, Math.min(this.keepaliveInterval, this.#deadline - now()));
    try {
      const conn = await this.#source.open('keepalive', timeout);
      if (this.#stopped) {
        await conn.close();
        return null;
      }
      this.#ka = conn;
      return conn;
    } catch (err) {
      this.#report(err);
      return null;
    }
  }

  /** One renew: true renewed, false lost, null failed (to be retried). */
  async #renewOnce(): Promise<boolean | null> {
    const conn = await this.#keepaliveConn();
    if (!conn || this.#stopped) return null;
    if (now() >= this.#deadline) {
      this.#markLost('deadline');
      return false;
    }
    // A renew that hangs (a half-open connection, a lost packet) is cut, and
    // the next one goes out on a new connection; the deadline does not wait
    // for it either way.
    const cut = setTimeout(() => void conn.close(true), Math.max(2000, this.keepaliveInterval));
    const sent = now();
    try {
      const r = await conn.client.query<{ renewed: boolean }>(this.#sql.renew, [this.name, this.#tokenText]);
      if (r.rows[0]?.renewed !== true) {
        this.#markLost('renew_false');
        return false;
      }
      this.#renewed(sent, this.ttl);
      return this.#state === 'live';
    } catch (err) {
      this.#report(err);
      if (sqlstateOf(err) === undefined || conn.dead) {
        await conn.close(true);
        if (this.#ka === conn) this.#ka = null;
      }
      return null;
    } finally {
      clearTimeout(cut);
    }
  }

  /** A renew sent at `sent` for `ttl` succeeded. */
  #renewed(sent: number, ttl: number): void {
    if (this.#state !== 'live') return;
    // Renewals on two connections may answer out of order: the deadline
    // counts from the one sent last.
    if (sent >= this.#lastSend) {
      this.#lastSend = sent;
      this.#deadline = sent + ttl;
    }
    if (now() >= this.#deadline) {
      // It was sent before a pause and answered after the lease ran out.
      this.#markLost('deadline');
      return;
    }
    this.#armDeadline();
    this.#emitSafely('renewed');
  }

  #armDeadline(): void {
    clearTimeout(this.#deadlineTimer);
    if (this.#state !== 'live') return;
    // Its own timer, not the renew loop: a renew that hangs must not delay
    // the lost signal past the deadline.
    this.#deadlineTimer = setTimeout(() => {
      if (this.#state !== 'live') return;
      if (now() >= this.#deadline) this.#markLost('deadline');
      else this.#armDeadline();
    }, Math.min(MAX_TIMER, Math.max(1, Math.ceil(this.#deadline - now()))));
    // The lease's connection and the keepalive keep a process alive while it
    // holds the lease; this timer alone need not.
    this.#deadlineTimer.unref();
  }

  #markLost(reason: 'renew_false' | 'deadline'): void {
    if (this.#state !== 'live') return;
    this.#state = 'lost';
    this.#stopped = true;
    clearTimeout(this.#deadlineTimer);
    this.#wake?.();
    // The keepalive stops: its connection is cut (a renew hanging on it ends now).
    const ka = this.#ka;
    this.#ka = null;
    if (ka) this.#kaClosing = ka.close(true);
    const err = new LeaseLostError(this.name, this.token, reason);
    this.#controller.abort(err);
    this.#emitSafely('lost', err);
  }

  #report(err: unknown): void {
    // Errors of a keepalive being stopped (its connection cut on purpose) are not news.
    if (this.#stopped) return;
    this.#emitSafely('keepaliveError', err);
  }

  /** Emits without letting a listener's exception into the keepalive (it is rethrown on its own). */
  #emitSafely<K extends keyof LeaseEvents>(event: K, ...args: LeaseEvents[K]): void {
    try {
      (this.emit as (e: string, ...a: unknown[]) => boolean)(event, ...args);
    } catch (e) {
      process.nextTick(() => {
        throw e;
      });
    }
  }

  async #stopKeepalive(): Promise<void> {
    this.#stopped = true;
    this.#wake?.();
    // A renew in flight is waited for: after this line none is sent, and
    // none is on its way.
    await this.#loop;
    const ka = this.#ka;
    this.#ka = null;
    if (ka) await ka.close();
    await this.#kaClosing;
    clearTimeout(this.#deadlineTimer);
  }

  // ---- release -----------------------------------------------------------

  async #release(): Promise<boolean> {
    await this.#stopKeepalive();
    if (this.#state === 'live' && now() >= this.#deadline) this.#markLost('deadline');
    if (this.#state !== 'live') {
      // Lost: the name may be someone else's now; a release is not sent.
      await this.#giveBack(true);
      return false;
    }
    this.#state = 'released';
    try {
      const conn = this.#conn;
      if (!conn.dead) {
        try {
          if (txStatus(conn.client) === 'E') {
            // A failed transaction can only roll back; the release cannot be part of it.
            await conn.client.query('ROLLBACK');
          }
          try {
            const r = await conn.client.query<{ released: boolean }>(this.#sql.release, [this.name, this.#tokenText]);
            return r.rows[0]?.released === true;
          } catch (err) {
            // node-postgres learns that a transaction failed only from the
            // next ReadyForQuery, after the failed query's promise was
            // rejected: the status read above may still have said 'T'.
            if (sqlstateOf(err) !== '25P02') throw err;
            await conn.client.query('ROLLBACK');
            const r = await conn.client.query<{ released: boolean }>(this.#sql.release, [this.name, this.#tokenText]);
            return r.rows[0]?.released === true;
          }
        } catch (err) {
          if (sqlstateOf(err) !== undefined && !conn.dead) throw mapError(err);
          // The connection broke under the release: sent again below, on a
          // new connection (false if the first one got through).
        }
      }
      const other = await this.#source.open('lease', 30_000);
      try {
        const r = await other.client.query<{ released: boolean }>(this.#sql.release, [this.name, this.#tokenText]);
        return r.rows[0]?.released === true;
      } catch (err) {
        throw mapError(err);
      } finally {
        await other.close(other.dead);
      }
    } finally {
      await this.#giveBack(false);
    }
  }

  /**
   * The lease's connection goes back where it came from: nothing to do for
   * the caller's; a locker's one is given back to its pool or closed, after
   * the caller's transaction on it ends (when the release was part of it),
   * or rolled back first when the lease is being dropped.
   */
  async #giveBack(rollback: boolean): Promise<void> {
    const conn = this.#conn;
    if (!this.#owned || conn.dead) {
      await conn.close(conn.dead);
      return;
    }
    const st = txStatus(conn.client);
    if (st === 'I' || st === null) {
      await conn.close();
      return;
    }
    if (rollback || st === 'E') {
      try {
        await conn.client.query('ROLLBACK');
        await conn.close();
      } catch {
        await conn.close(true);
      }
      return;
    }
    // "guarded writes, then release, then COMMIT": the caller still has to
    // commit on this connection; it goes back once the transaction ends.
    this.#closeWhenIdle(conn);
  }

  #closeWhenIdle(conn: Conn): void {
    const connection = (conn.client as unknown as { connection?: EventEmitter }).connection;
    if (!connection || typeof connection.on !== 'function') {
      // No way to see the transaction end on this client: it is closed when it dies.
      conn.onDead = () => void conn.close(true);
      return;
    }
    const onReady = (msg: { status?: string }) => {
      if (msg?.status !== 'I') return;
      connection.removeListener('readyForQuery', onReady);
      // After node-postgres has handed the COMMIT's result to the caller.
      setImmediate(() => void conn.close());
    };
    connection.on('readyForQuery', onReady);
    conn.onDead = () => {
      connection.removeListener('readyForQuery', onReady);
      void conn.close(true);
    };
  }
}
