// Each SQLSTATE of the contract's table comes back as its error type,
// raised by a real server, carrying the server's sqlstate, message, detail
// and hint.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import {
  FencedLockError,
  InvalidArgumentError,
  Locker,
  MissingTokenError,
  ModeConflictError,
  NotAllowedError,
  ReadOnlyError,
  StaleTokenError,
  WaitTimeoutError,
  mapError,
} from 'fenced-lock';
import { DB, ROLE_APP, ROLE_NOEXEC, connect, dsn, dsnFor, ensureDatabase, resetRow, rowIds, uniqueName } from './support';

const nextRow = rowIds(300);
let admin: pg.Client;
let locker: Locker;

before(async () => {
  await ensureDatabase();
  admin = await connect();
  locker = new Locker(dsn());
});

after(async () => {
  await locker?.end();
  await admin?.end();
});

function serverError<T extends FencedLockError>(err: unknown, type: new (...a: never[]) => T, sqlstate: string): T {
  assert.ok(err instanceof type, `expected ${type.name}, got ${err instanceof Error ? `${err.name}: ${err.message}` : String(err)}`);
  assert.ok(err instanceof FencedLockError);
  assert.ok(err instanceof pg.DatabaseError, 'a node-postgres DatabaseError too');
  assert.equal(err.sqlstate, sqlstate);
  assert.equal(err.code, sqlstate);
  assert.equal(err.name, type.name);
  assert.ok(err.message.length > 0);
  return err;
}

describe('each SQLSTATE maps to its error type', () => {
  test('FL001 -> StaleTokenError (a guarded write with a token that is not live), with the server detail and hint', { timeout: 20_000 }, async () => {
    const id = nextRow();
    const name = `row:${id}`;
    await resetRow(admin, 'UPDATE fenced SET fence_token = NULL WHERE id = $1', [id]);
    const lease = await locker.acquire(name, { ttl: 5000 });
    try {
      await admin.query('SELECT fenced_lock_force_release($1)', [name]);
      const err = await lease.query('UPDATE fenced SET fence_token = $1 WHERE id = $2', [lease.token.toString(), id]).catch((e) => e);
      const e = serverError(err, StaleTokenError, 'FL001');
      assert.match(String(e.detail), new RegExp(`presented token: ${lease.token}`));
      assert.ok(e.hint);
      const assertErr = await lease.assert().catch((x) => x);
      serverError(assertErr, StaleTokenError, 'FL001');
    } finally {
      await lease.release();
    }
  });

  test('FL002 -> MissingTokenError (a guarded write without a token)', { timeout: 20_000 }, async () => {
    const id = nextRow();
    const lease = await locker.acquire(`row:${id}`, { ttl: 5000 });
    try {
      const err = await lease.query('UPDATE fenced SET fence_token = NULL WHERE id = $1', [id]).catch((e) => e);
      serverError(err, MissingTokenError, 'FL002');
    } finally {
      assert.equal(await lease.release(), true);
    }
  });

  test('FL003 -> ModeConflictError (another permit count live on the name)', { timeout: 20_000 }, async () => {
    const name = uniqueName('mode');
    const lease = await locker.acquire(name, { ttl: 5000, permits: 3 });
    try {
      const err = await locker.tryAcquire(name, { ttl: 5000, permits: 2 }).catch((e) => e);
      serverError(err, ModeConflictError, 'FL003');
    } finally {
      await lease.release();
    }
  });

  test('55P03 -> WaitTimeoutError (acquire waited `wait` without a grant)', { timeout: 20_000 }, async () => {
    const name = uniqueName('wait');
    const lease = await locker.acquire(name, { ttl: 10_000 });
    try {
      const start = performance.now();
      const err = await locker.acquire(name, { ttl: 5000, wait: 200 }).catch((e) => e);
      serverError(err, WaitTimeoutError, '55P03');
      assert.ok(performance.now() - start >= 190);
    } finally {
      await lease.release();
    }
  });

  test('25006 -> ReadOnlyError (a lease change in a read-only transaction)', { timeout: 20_000 }, async () => {
    const url = new URL(dsn());
    // A key=value connection string, with the session read-only from its start.
    const kv = `host=${url.hostname} port=${url.port || 5432} user=${decodeURIComponent(url.username)} dbname=${DB} options='-c default_transaction_read_only=on'`;
    const ro = new Locker(kv);
    try {
      const err = await ro.tryAcquire(uniqueName('ro'), { ttl: 5000 }).catch((e) => e);
      serverError(err, ReadOnlyError, '25006');
    } finally {
      await ro.end();
    }
  });

  test('42501 -> NotAllowedError (a role without EXECUTE; a release of another role\'s lease)', { timeout: 20_000 }, async () => {
    const noexec = new Locker(dsnFor(DB, ROLE_NOEXEC));
    try {
      const err = await noexec.tryAcquire(uniqueName('noexec'), { ttl: 5000 }).catch((e) => e);
      serverError(err, NotAllowedError, '42501');
    } finally {
      await noexec.end();
    }
    const client = await connect();
    try {
      const name = uniqueName('other-role');
      const lease = await locker.acquire(name, { ttl: 5000, client, keepalive: false });
      // The lease's connection now acts as another role, which does not own it.
      await client.query(`SET ROLE ${ROLE_APP}`);
      const err = await lease.release().catch((e) => e);
      serverError(err, NotAllowedError, '42501');
      await client.query('RESET ROLE');
      await admin.query('SELECT fenced_lock_force_release($1)', [name]);
    } finally {
      await client.end();
    }
  });

  test('22023 -> InvalidArgumentError from the server (a name over 512 bytes, a ttl above max_ttl)', { timeout: 20_000 }, async () => {
    const long = await locker.tryAcquire('n'.repeat(513), { ttl: 5000 }).catch((e) => e);
    const e = serverError(long, InvalidArgumentError, '22023');
    assert.equal(e.argument, undefined, 'judged by the server, not the client');
    // Whatever the server's fenced_lock.max_ttl, a day more is too long. (The
    // library is loaded by the validate, so that the setting is its own.)
    const r = await admin.query(
      "SELECT fenced_lock_validate('x', 1), extract(epoch FROM current_setting('fenced_lock.max_ttl')::interval) * 1000 AS ms",
    );
    const tooLong = Number(r.rows[0].ms) + 86_400_000;
    const ttl = await locker.tryAcquire(uniqueName('max-ttl'), { ttl: tooLong }).catch((x) => x);
    serverError(ttl, InvalidArgumentError, '22023');
  });

  test('any other SQLSTATE -> FencedLockError with its code; errors without one pass through', { timeout: 20_000 }, async () => {
    const lease = await locker.acquire(uniqueName('other'), { ttl: 5000 });
    try {
      const err = await lease.query('SELECT 1/0').catch((e) => e);
      serverError(err, FencedLockError, '22012');
    } finally {
      await lease.release();
    }
    const plain = new Error('ECONNRESET');
    assert.equal(mapError(plain), plain);
    const raw = Object.assign(new pg.DatabaseError('stale', 0, 'error'), { code: 'FL001' });
    const mapped = mapError(raw);
    assert.ok(mapped instanceof StaleTokenError);
    assert.equal((mapped as StaleTokenError).cause, raw);
  });
});
