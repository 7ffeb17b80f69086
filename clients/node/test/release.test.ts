// Release: no renew after it, seen from the server; one release however
// often it is called; inside the caller's transaction; the scoped form.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type pg from 'pg';
import { Locker, UsageError } from 'fenced-lock';
import { DB, connect, dsn, ensureDatabase, keepalivePids, resetRow, rowIds, sleep, spy, uniqueName, validate, waitFor } from './support';

const nextRow = rowIds(100);
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

describe('no renew after a release', () => {
  test('the keepalive connection is gone from pg_stat_activity when release returns', { timeout: 20_000 }, async () => {
    const name = uniqueName('release-gone');
    const lease = await locker.acquire(name, { ttl: 1500 });
    let renewed = 0;
    lease.on('renewed', () => renewed++);
    await waitFor('two renewals', 5000, () => renewed >= 2);
    assert.equal((await keepalivePids(admin)).length, 1);
    assert.equal(await lease.release(), true);
    // Read right after release returned, with no wait: the connection a renew
    // could come from is already closed on the server.
    assert.deepEqual(await keepalivePids(admin), []);
    const after = renewed;
    // And none comes back over the next two intervals and more.
    const until = performance.now() + 3 * lease.keepaliveInterval;
    while (performance.now() < until) {
      assert.deepEqual(await keepalivePids(admin), []);
      await sleep(50);
    }
    assert.equal(renewed, after);
    assert.equal(await validate(admin, name, lease.token), false);
    const h = await admin.query('SELECT ended_by FROM fenced_lock_history WHERE name = $1', [name]);
    assert.deepEqual(h.rows.map((r) => r.ended_by), ['release']);
  });

  test('a renew in flight at release is waited for, and the release is sent after it', { timeout: 30_000 }, async () => {
    const name = uniqueName('release-inflight');
    const lease = await locker.acquire(name, { ttl: 8000, keepaliveInterval: 400 });
    const order: string[] = [];
    lease.on('renewed', () => order.push('renewed'));
    const leasePid = (lease.client as unknown as { processID: number }).processID;
    // Another transaction renews the lease and stays open: until it ends, the
    // keepalive's renew waits on the server for the lease's lock, and so
    // stays in flight.
    const blocker = await connect();
    try {
      await blocker.query('BEGIN');
      await blocker.query('SELECT fenced_lock_renew($1, $2::bigint)', [name, lease.token.toString()]);
      const renewing: number = await waitFor('a renew waiting on the server', 5000, async () => {
        const r = await admin.query(
          `SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = 'fenced_lock_keepalive'
              AND state = 'active' AND wait_event_type = 'Lock' AND query LIKE '%fenced_lock_renew%'`,
          [DB],
        );
        return r.rows[0]?.pid as number;
      });
      order.length = 0;
      let settled = false;
      const releasing = lease.release().then((v) => {
        settled = true;
        order.push('released');
        return v;
      });
      await sleep(500);
      assert.equal(settled, false, 'release waits for the renew in flight');
      // Server side: the lease's connection has not sent the release; the
      // renew is still waiting.
      const r = await admin.query('SELECT pid, state, query FROM pg_stat_activity WHERE pid = ANY($1)', [[leasePid, renewing]]);
      const byPid = new Map(r.rows.map((x) => [x.pid as number, x]));
      assert.equal(byPid.get(leasePid)?.state, 'idle');
      assert.doesNotMatch(String(byPid.get(leasePid)?.query), /fenced_lock_release/);
      assert.equal(byPid.get(renewing)?.state, 'active');
      await blocker.query('COMMIT');
      assert.equal(await releasing, true);
      assert.deepEqual(await keepalivePids(admin), [], 'the keepalive connection is closed when release returns');
      assert.deepEqual(order, ['renewed', 'released'], 'the renew finished before the release');
      assert.equal(await validate(admin, name, lease.token), false, 'the finished renew did not bring the lease back');
    } finally {
      await blocker.end();
    }
  });
});

describe('release', () => {
  test('releasing twice sends one release; the second returns false without a round trip', { timeout: 20_000 }, async () => {
    const s = spy();
    const client = s.watch(await connect());
    try {
      const lease = await locker.acquire(uniqueName('twice'), { ttl: 5000, client });
      assert.equal(await lease.release(), true);
      const before = s.queries.length;
      assert.equal(await lease.release(), false);
      assert.equal(s.queries.length, before);
      assert.equal(s.queries.filter((q) => /fenced_lock_release/.test(q)).length, 1);
      assert.equal(lease.released, true);
    } finally {
      await client.end();
    }
  });

  test("release inside the caller's transaction is part of it: guarded writes, then release, then COMMIT", { timeout: 20_000 }, async () => {
    const id = nextRow();
    const name = `row:${id}`;
    await resetRow(admin, 'UPDATE fenced SET fence_token = NULL WHERE id = $1', [id]);
    const client = await connect();
    try {
      const lease = await locker.acquire(name, { ttl: 5000, client });
      await client.query('BEGIN');
      await client.query('UPDATE fenced SET fence_token = $1 WHERE id = $2', [lease.token.toString(), id]);
      assert.equal(await lease.release(), true);
      // Not committed yet: to everyone else the lease is still live.
      assert.equal(await validate(admin, name, lease.token), true);
      await client.query('COMMIT');
      assert.equal(await validate(admin, name, lease.token), false);
      const row = await admin.query('SELECT fence_token FROM fenced WHERE id = $1', [id]);
      assert.equal(BigInt(row.rows[0].fence_token), lease.token);
    } finally {
      await client.end();
    }
  });

  test('on a connection of the locker, the same pattern through lease.client', { timeout: 20_000 }, async () => {
    const id = nextRow();
    const name = `row:${id}`;
    await resetRow(admin, 'UPDATE fenced SET fence_token = NULL WHERE id = $1', [id]);
    const lease = await locker.acquire(name, { ttl: 5000 });
    await lease.client.query('BEGIN');
    await lease.client.query('UPDATE fenced SET fence_token = $1 WHERE id = $2', [lease.token.toString(), id]);
    assert.equal(await lease.release(), true);
    assert.equal(await validate(admin, name, lease.token), true);
    await lease.client.query('COMMIT');
    assert.equal(await validate(admin, name, lease.token), false);
  });

  test('a failed transaction on the lease connection is rolled back first, then the release is sent', { timeout: 20_000 }, async () => {
    const client = await connect();
    try {
      const name = uniqueName('failed-tx');
      const lease = await locker.acquire(name, { ttl: 5000, client });
      await client.query('BEGIN');
      await assert.rejects(client.query('SELECT 1/0'));
      // The transaction has failed: only a rollback is accepted now.
      await assert.rejects(client.query('SELECT 1'), (e: { code?: string }) => e.code === '25P02');
      assert.equal(await lease.release(), true);
      assert.equal(client.getTransactionStatus(), 'I');
      assert.equal(await validate(admin, name, lease.token), false);
    } finally {
      await client.end();
    }
  });

  test("if the lease's connection is gone, the release is sent on a new connection", { timeout: 20_000 }, async () => {
    const name = uniqueName('conn-gone');
    const lease = await locker.acquire(name, { ttl: 10_000, keepalive: false });
    const pid = (lease.client as unknown as { processID: number }).processID;
    await admin.query('SELECT pg_terminate_backend($1)', [pid]);
    await waitFor('the backend to go', 5000, async () => (await admin.query('SELECT 1 FROM pg_stat_activity WHERE pid = $1', [pid])).rowCount === 0);
    assert.equal(await validate(admin, name, lease.token), true, 'a plain lease outlives its connection');
    assert.equal(await lease.release(), true);
    assert.equal(await validate(admin, name, lease.token), false);
  });

  test('an acquire on a connection inside a transaction block is refused with a usage error, nothing sent', { timeout: 20_000 }, async () => {
    const s = spy();
    const client = s.watch(await connect());
    try {
      await client.query('BEGIN');
      const before = s.queries.length;
      await assert.rejects(locker.acquire(uniqueName('in-tx'), { client }), UsageError);
      await assert.rejects(locker.tryAcquire(uniqueName('in-tx'), { client }), UsageError);
      await assert.rejects(locker.withLock(uniqueName('in-tx'), () => 1, { client }), UsageError);
      assert.equal(s.queries.length, before);
      await client.query('ROLLBACK');
    } finally {
      await client.end();
    }
  });
});

describe('the scoped form', () => {
  test('await using releases at the end of the block', { timeout: 20_000 }, async () => {
    const name = uniqueName('scoped');
    let token: bigint;
    {
      await using lease = await locker.acquire(name, { ttl: 5000 });
      token = lease.token;
      assert.equal(await validate(admin, name, token), true);
    }
    assert.equal(await validate(admin, name, token), false);
    assert.deepEqual(await keepalivePids(admin), []);
  });

  test('await using releases when the block throws', { timeout: 20_000 }, async () => {
    const name = uniqueName('scoped-throw');
    let token = 0n;
    await assert.rejects(
      (async () => {
        await using lease = await locker.acquire(name, { ttl: 5000 });
        token = lease.token;
        throw new Error('work failed');
      })(),
      /work failed/,
    );
    assert.ok(token > 0n);
    assert.equal(await validate(admin, name, token), false);
    const h = await admin.query('SELECT ended_by FROM fenced_lock_history WHERE name = $1', [name]);
    assert.deepEqual(h.rows.map((r) => r.ended_by), ['release']);
  });

  test("a transaction left open on the locker's connection is rolled back at the end of the block, then released", { timeout: 20_000 }, async () => {
    const id = nextRow();
    const name = `row:${id}`;
    await resetRow(admin, 'UPDATE fenced SET fence_token = NULL WHERE id = $1', [id]);
    let token = 0n;
    await assert.rejects(
      (async () => {
        await using lease = await locker.acquire(name, { ttl: 5000 });
        token = lease.token;
        await lease.client.query('BEGIN');
        await lease.client.query('UPDATE fenced SET fence_token = $1 WHERE id = $2', [token.toString(), id]);
        throw new Error('failed between the write and the commit');
      })(),
      /between the write/,
    );
    assert.equal(await validate(admin, name, token), false, 'released, and committed');
    const row = await admin.query('SELECT fence_token FROM fenced WHERE id = $1', [id]);
    assert.equal(row.rows[0].fence_token, null, 'the uncommitted write was rolled back');
    const next = await locker.tryAcquire(name, { ttl: 2000 });
    assert.ok(next, 'the name is free at once');
    assert.equal(await next.release(), true);
  });

  test('a lost lease is not released at the end of the block', { timeout: 20_000 }, async () => {
    const s = spy();
    const client = s.watch(await connect());
    const name = uniqueName('scoped-lost');
    try {
      {
        await using lease = await locker.acquire(name, { ttl: 1200, client });
        await admin.query('SELECT fenced_lock_force_release($1)', [name]);
        await waitFor('lost', 5000, () => lease.lost);
      }
      assert.equal(s.queries.filter((q) => /fenced_lock_release/.test(q)).length, 0);
      const h = await admin.query('SELECT ended_by FROM fenced_lock_history WHERE name = $1', [name]);
      assert.deepEqual(h.rows.map((r) => r.ended_by), ['force_release']);
    } finally {
      await client.end();
    }
  });
});
