// The retry helper, withLock: four inventory processes, one paused past its
// ttl, sell every unit exactly once; and what it does with each kind of error.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type pg from 'pg';
import { Lease, LeaseLostError, Locker, StaleTokenError, UsageError } from 'fenced-lock';
import { DB, Example, connect, dsn, ensureDatabase, killChildren, resetRow, rowIds, sleep, uniqueName, validate, waitFor } from './support';

const nextRow = rowIds(200);
let admin: pg.Client;
let locker: Locker;

before(async () => {
  await ensureDatabase();
  admin = await connect();
  locker = new Locker(dsn());
});

after(async () => {
  killChildren();
  await locker?.end();
  await admin?.end();
});

describe('the retry helper', () => {
  test('four inventory processes sell 25 each from stock 100, one SIGSTOPped past its ttl: stock 0, each sale once', { timeout: 90_000 }, async () => {
    const item = 1;
    const name = `inventory:${item}`;
    await resetRow(admin, 'UPDATE inventory SET stock = 100, fence_token = NULL WHERE item_id = $1', [item]);
    const since = (await admin.query('SELECT clock_timestamp() AS t')).rows[0].t;
    const ttl = 1;
    const procs = [1, 2, 3, 4].map(
      (i) =>
        // PGAPPNAME names each process's lease connections in pg_stat_activity
        // (its keepalive connections keep their own name).
        new Example('inventory', ['--dsn', dsn(), '--item', String(item), '--sales', '25', '--ttl', String(ttl)], {
          PGAPPNAME: `fl_node_inventory_${i}`,
        }),
    );
    const victim = procs[1]!;
    // Stopped in the middle of a sale: inside its transaction, so it holds the lease.
    const inSale = async () =>
      (
        await admin.query(
          "SELECT 1 FROM pg_stat_activity WHERE datname = $1 AND application_name = 'fl_node_inventory_2' AND xact_start IS NOT NULL",
          [DB],
        )
      ).rowCount! > 0;
    await waitFor('process 2 stopped inside a sale', 30_000, async () => {
      if (!(await inSale())) return false;
      victim.signal('SIGSTOP');
      // What it had sent before the stop may still end the transaction.
      await sleep(100);
      if (await inSale()) return true;
      victim.signal('SIGCONT');
      return false;
    }, 5);
    const stockAtStop = (await admin.query('SELECT stock FROM inventory WHERE item_id = $1', [item])).rows[0].stock;
    await sleep(ttl * 1000 * 2.5);
    victim.signal('SIGCONT');
    const codes = await Promise.all(procs.map((p) => p.exitCode(60_000)));
    const stock = (await admin.query('SELECT stock FROM inventory WHERE item_id = $1', [item])).rows[0].stock;
    const sold = procs.flatMap((p) => p.events.filter((e) => e.event === 'sold').map((e) => e.stock as number));
    const done = procs.map((p) => p.events.find((e) => e.event === 'done')?.sold as number);
    const endings = await admin.query(
      'SELECT ended_by, count(*)::int AS n FROM fenced_lock_history WHERE name = $1 AND acquired_at >= $2 GROUP BY ended_by ORDER BY ended_by',
      [name, since],
    );
    console.log(
      `inventory: exit codes ${codes.join(',')}, done ${done.join(',')}, stopped at stock ${stockAtStop}, ` +
        `lease endings ${endings.rows.map((r) => `${r.ended_by}=${r.n}`).join(' ')}`,
    );
    for (const p of procs) if (p.child.exitCode !== 0) console.log(p.stderr.join('\n'));
    assert.deepEqual(codes, [0, 0, 0, 0]);
    assert.equal(stock, 0);
    assert.deepEqual(done, [25, 25, 25, 25]);
    // Every stock level from 99 down to 0 was written by exactly one sale.
    assert.deepEqual([...sold].sort((a, b) => a - b), Array.from({ length: 100 }, (_, i) => i));
    // The paused process's lease did run out under it.
    assert.ok(endings.rows.some((r) => r.ended_by === 'expiry'), 'a lease expired during the pause');
  });

  test('a stale token in fn drops the lease without a release and runs again from the acquire', { timeout: 20_000 }, async () => {
    const id = nextRow();
    const name = `row:${id}`;
    await resetRow(admin, 'UPDATE fenced SET fence_token = NULL WHERE id = $1', [id]);
    const tokens: bigint[] = [];
    const result = await locker.withLock(
      name,
      async (lease: Lease) => {
        tokens.push(lease.token);
        if (tokens.length === 1) {
          // Lost under the work: an operator took it away before the write.
          await admin.query('SELECT fenced_lock_force_release($1)', [name]);
        }
        await lease.query('UPDATE fenced SET fence_token = $1 WHERE id = $2', [lease.token.toString(), id]);
        return 'written';
      },
      { ttl: 5000 },
    );
    assert.equal(result, 'written');
    assert.equal(tokens.length, 2);
    assert.ok(tokens[1]! > tokens[0]!);
    const h = await admin.query('SELECT token, ended_by FROM fenced_lock_history WHERE name = $1 ORDER BY token', [name]);
    assert.deepEqual(
      h.rows.map((r) => [BigInt(r.token), r.ended_by]),
      [
        [tokens[0], 'force_release'],
        [tokens[1], 'release'],
      ],
    );
  });

  test('after `attempts` stale tokens the last StaleTokenError is thrown', { timeout: 20_000 }, async () => {
    const id = nextRow();
    const name = `row:${id}`;
    let runs = 0;
    const err = await locker
      .withLock(
        name,
        async (lease) => {
          runs++;
          await admin.query('SELECT fenced_lock_force_release($1)', [name]);
          await lease.query('UPDATE fenced SET fence_token = $1 WHERE id = $2', [lease.token.toString(), id]);
        },
        { ttl: 5000, attempts: 3 },
      )
      .catch((e: unknown) => e);
    assert.ok(err instanceof StaleTokenError, String(err));
    assert.equal(err.sqlstate, 'FL001');
    assert.equal(runs, 3);
  });

  test('a LeaseLostError from lease.signal counts as a stale token and is retried', { timeout: 20_000 }, async () => {
    const name = uniqueName('retry-signal');
    let runs = 0;
    const result = await locker.withLock(
      name,
      async (lease) => {
        runs++;
        if (runs === 1) {
          await admin.query('SELECT fenced_lock_force_release($1)', [name]);
          await waitFor('lost', 5000, () => lease.signal.aborted);
          lease.signal.throwIfAborted();
        }
        return runs;
      },
      { ttl: 1200 },
    );
    assert.equal(result, 2);
  });

  test('any other error is thrown at once, after the release', { timeout: 20_000 }, async () => {
    const name = uniqueName('retry-other');
    let runs = 0;
    let token = 0n;
    await assert.rejects(
      locker.withLock(name, async (lease) => {
        runs++;
        token = lease.token;
        throw new RangeError('not a lock problem');
      }),
      RangeError,
    );
    assert.equal(runs, 1);
    assert.equal(await validate(admin, name, token), false);
    const h = await admin.query('SELECT ended_by FROM fenced_lock_history WHERE name = $1', [name]);
    assert.deepEqual(h.rows.map((r) => r.ended_by), ['release']);
  });

  test("fn leaving a transaction open on the locker's connection: rolled back and released; returning so is a usage error", { timeout: 20_000 }, async () => {
    const id = nextRow();
    const name = `row:${id}`;
    await resetRow(admin, 'UPDATE fenced SET fence_token = NULL WHERE id = $1', [id]);
    const write = async (lease: Lease) => {
      await lease.client.query('BEGIN');
      await lease.client.query('UPDATE fenced SET fence_token = $1 WHERE id = $2', [lease.token.toString(), id]);
    };
    await assert.rejects(
      locker.withLock(name, async (lease) => {
        await write(lease);
        throw new Error('failed before the commit');
      }),
      /before the commit/,
    );
    await assert.rejects(locker.withLock(name, write), UsageError);
    const row = await admin.query('SELECT fence_token FROM fenced WHERE id = $1', [id]);
    assert.equal(row.rows[0].fence_token, null, 'neither uncommitted write was kept');
    const h = await admin.query('SELECT ended_by FROM fenced_lock_history WHERE name = $1', [name]);
    assert.deepEqual(h.rows.map((r) => r.ended_by), ['release', 'release']);
  });

  test('returns what fn returned, and the lease was released', { timeout: 20_000 }, async () => {
    const name = uniqueName('retry-value');
    let seen: Lease | undefined;
    const v = await locker.withLock(name, (lease) => {
      seen = lease;
      return 42;
    });
    assert.equal(v, 42);
    assert.equal(seen!.released, true);
    assert.equal(await validate(admin, name, seen!.token), false);
    assert.ok(!(seen!.signal.reason instanceof LeaseLostError));
  });
});
