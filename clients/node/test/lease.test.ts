// The model: what a lease carries, try versus acquire, the connection
// sources (URL, key=value, pg.Pool, factory), transaction pooling, and the
// 0.3.0 modes (shared, permits).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { KEEPALIVE_APPLICATION_NAME, Locker, UsageError } from 'fenced-lock';
import { DB, connect, dsn, ensureDatabase, keepalivePids, sleep, spy, uniqueName, validate, waitFor } from './support';

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

describe('leases', () => {
  test('a lease carries name, token, ttl and its options; try returns null while it is held', { timeout: 20_000 }, async () => {
    const name = uniqueName('model');
    const lease = await locker.acquire(name, { ttl: 4000, holder: 'worker-1' });
    try {
      assert.equal(lease.name, name);
      assert.equal(typeof lease.token, 'bigint');
      assert.ok(lease.token > 0n);
      assert.equal(lease.ttl, 4000);
      assert.equal(lease.holder, 'worker-1');
      assert.equal(lease.sessionBound, false);
      assert.equal(lease.shared, false);
      assert.equal(lease.permits, 1);
      assert.equal(lease.keepalive, true);
      assert.ok(Math.abs(lease.keepaliveInterval - 4000 / 3) < 1e-9);
      assert.ok(lease.remaining() > 3000 && lease.remaining() <= 4000);
      assert.equal(await locker.tryAcquire(name), null);
      const r = await admin.query('SELECT token, holder, session_bound FROM fenced_lock_leases WHERE name = $1 AND live', [name]);
      assert.deepEqual(r.rows.map((x) => [BigInt(x.token), x.holder, x.session_bound]), [[lease.token, 'worker-1', false]]);
    } finally {
      assert.equal(await lease.release(), true);
    }
    const again = await locker.tryAcquire(name, { ttl: 2000 });
    assert.ok(again && again.token > lease.token);
    assert.equal(await again.release(), true);
  });

  test('the same holder gets its own live lease back (retry-safe acquire), same token', { timeout: 20_000 }, async () => {
    const name = uniqueName('holder');
    const a = await locker.acquire(name, { ttl: 4000, holder: 'me', keepalive: false });
    const b = await locker.tryAcquire(name, { ttl: 4000, holder: 'me', keepalive: false });
    assert.ok(b);
    assert.equal(b.token, a.token);
    assert.equal(await b.release(), true);
    assert.equal(await a.release(), false);
  });

  test('a session-bound lease ends with its connection and lives while it does', { timeout: 20_000 }, async () => {
    const client = await connect();
    const name = uniqueName('sb');
    const lease = await locker.acquire(name, { ttl: 5000, sessionBound: true, client, keepalive: false });
    const r = await admin.query('SELECT session_bound FROM fenced_lock_leases WHERE name = $1 AND live', [name]);
    assert.deepEqual(r.rows, [{ session_bound: true }]);
    await client.end();
    await waitFor('the lease to end with its session', 5000, async () => !(await validate(admin, name, lease.token)));
    await lease.abandon();
  });

  test('renew() extends the lease on the lease connection; false once it is not live', { timeout: 20_000 }, async () => {
    const name = uniqueName('renew');
    const lease = await locker.acquire(name, { ttl: 800, keepalive: false });
    await sleep(500);
    assert.equal(await lease.renew(3000), true);
    assert.ok(lease.remaining() > 2500);
    await sleep(600);
    assert.equal(await validate(admin, name, lease.token), true, 'still live past its first ttl');
    await admin.query('SELECT fenced_lock_force_release($1)', [name]);
    assert.equal(await lease.renew(), false);
    assert.equal(lease.lost, true);
    assert.equal(await lease.release(), false);
  });
});

describe('connection sources and pools', () => {
  test('a key=value connection string', { timeout: 20_000 }, async () => {
    const url = new URL(dsn());
    const kv = new Locker(`host=${url.hostname} port=${url.port || 5432} user=${decodeURIComponent(url.username)} dbname=${DB}`);
    try {
      const lease = await kv.acquire(uniqueName('kv'), { ttl: 3000 });
      assert.equal(await validate(admin, lease.name, lease.token), true);
      assert.equal(await lease.release(), true);
    } finally {
      await kv.end();
    }
  });

  test('a pg.Pool: a lease takes two of its connections (lease and keepalive) and gives both back', { timeout: 20_000 }, async () => {
    const pool = new pg.Pool({ connectionString: dsn(), max: 4 });
    const pooled = new Locker(pool);
    try {
      const lease = await pooled.acquire(uniqueName('pool'), { ttl: 1500 });
      let renewed = 0;
      lease.on('renewed', () => renewed++);
      await waitFor('a renew', 5000, () => renewed > 0);
      assert.equal(pool.totalCount - pool.idleCount, 2, 'two connections in use');
      assert.deepEqual((await keepalivePids(admin)).length, 1, 'the keepalive is named in pg_stat_activity');
      assert.equal(await lease.release(), true);
      assert.equal(pool.totalCount - pool.idleCount, 0);
      // Given back without the keepalive's name.
      assert.deepEqual(await keepalivePids(admin), []);
      const names = await admin.query(
        'SELECT DISTINCT application_name FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = $2',
        [DB, 'client backend'],
      );
      assert.ok(!names.rows.some((r) => r.application_name === KEEPALIVE_APPLICATION_NAME));
    } finally {
      await pooled.end();
      await pool.end();
    }
  });

  test('a pool of 2 serves one lease at a time: the second waits for the pool until the first is released', { timeout: 20_000 }, async () => {
    const pool = new pg.Pool({ connectionString: dsn(), max: 2 });
    const pooled = new Locker(pool);
    try {
      const first = await pooled.acquire(uniqueName('pool2a'), { ttl: 3000 });
      await waitFor('the keepalive connection', 5000, () => pool.totalCount === 2);
      let second: Promise<unknown> | null = pooled.acquire(uniqueName('pool2b'), { ttl: 3000 });
      const state = await Promise.race([second.then(() => 'granted'), sleep(300).then(() => 'waiting')]);
      assert.equal(state, 'waiting');
      assert.equal(await first.release(), true);
      const lease = (await second) as Awaited<ReturnType<Locker['acquire']>>;
      second = null;
      assert.equal(await lease.release(), true);
    } finally {
      await pooled.end();
      await pool.end();
    }
  });

  test('a factory: its connections are opened per use, and keepalive ones are named', { timeout: 20_000 }, async () => {
    const s = spy();
    const factoryLocker = new Locker(s.factory);
    try {
      const lease = await factoryLocker.acquire(uniqueName('factory'), { ttl: 1500 });
      await waitFor('the keepalive connection', 5000, async () => (await keepalivePids(admin)).length === 1);
      assert.equal(s.opened, 2);
      assert.equal(await lease.release(), true);
      assert.deepEqual(await keepalivePids(admin), []);
    } finally {
      await s.closeAll();
    }
  });

  test('transactionPooling: session-bound leases are refused with a usage error saying why, nothing sent; plain ones work', { timeout: 20_000 }, async () => {
    const s = spy();
    const tp = new Locker(s.factory, { transactionPooling: true });
    try {
      const err = await tp.acquire(uniqueName('tp'), { sessionBound: true }).catch((e) => e);
      assert.ok(err instanceof UsageError);
      assert.match(err.message, /transaction pool/);
      await assert.rejects(tp.tryAcquire(uniqueName('tp'), { sessionBound: true }), UsageError);
      await assert.rejects(tp.withLock(uniqueName('tp'), () => 1, { sessionBound: true }), UsageError);
      assert.equal(s.opened, 0);
      const lease = await tp.acquire(uniqueName('tp-plain'), { ttl: 1500 });
      let renewed = 0;
      lease.on('renewed', () => renewed++);
      await waitFor('a renew', 5000, () => renewed > 0);
      // No session state is sent behind a transaction pooler: no SET of the name.
      assert.ok(!s.queries.some((q) => /^\s*SET\b/i.test(q)), s.queries.join('\n'));
      assert.equal(await lease.release(), true);
    } finally {
      await s.closeAll();
    }
  });

  test('schema: the functions are called by their qualified name', { timeout: 20_000 }, async () => {
    const s = spy();
    const qualified = new Locker(s.factory, { schema: 'public' });
    try {
      const lease = await qualified.acquire(uniqueName('schema'), { ttl: 3000, keepalive: false });
      assert.equal(await lease.release(), true);
      assert.ok(s.queries.some((q) => q.includes('"public".fenced_lock_acquire(')));
      assert.ok(s.queries.some((q) => q.includes('"public".fenced_lock_release(')));
    } finally {
      await s.closeAll();
    }
  });
});

describe('0.3.0 modes', () => {
  test('shared leases live together, each with its token; an exclusive one waits them out', { timeout: 20_000 }, async () => {
    const name = uniqueName('shared');
    const a = await locker.acquire(name, { ttl: 5000, shared: true });
    const b = await locker.acquire(name, { ttl: 5000, shared: true });
    try {
      assert.notEqual(a.token, b.token);
      assert.equal(a.shared, true);
      assert.equal(await locker.tryAcquire(name, { ttl: 5000 }), null);
    } finally {
      assert.equal(await a.release(), true);
      assert.equal(await b.release(), true);
    }
    const x = await locker.tryAcquire(name, { ttl: 5000 });
    assert.ok(x);
    assert.equal(await x.release(), true);
  });

  test('permits: up to N leases at once, the N+1th try gets null', { timeout: 20_000 }, async () => {
    const name = uniqueName('permits');
    const leases = [];
    try {
      for (let i = 0; i < 3; i++) leases.push(await locker.acquire(name, { ttl: 5000, permits: 3 }));
      assert.equal(new Set(leases.map((l) => l.token)).size, 3);
      assert.equal(await locker.tryAcquire(name, { ttl: 5000, permits: 3 }), null);
    } finally {
      for (const l of leases) assert.equal(await l.release(), true);
    }
  });

  test('shared and permits through tryAcquire, acquire and withLock: kept alive past the ttl, each release ends its own', { timeout: 20_000 }, async () => {
    const readers = uniqueName('readers');
    const sem = uniqueName('sem');
    const live = async (name: string): Promise<Map<bigint, string>> => {
      const r = await admin.query(
        "SELECT token, mode, coalesce(permits::text, '-') AS permits FROM fenced_lock_leases WHERE name = $1 AND live ORDER BY token",
        [name],
      );
      return new Map(r.rows.map((x) => [BigInt(x.token), `${x.mode}/${x.permits}`]));
    };
    const r1 = await locker.tryAcquire(readers, { ttl: 1000, shared: true });
    const r2 = await locker.acquire(readers, { ttl: 1000, shared: true, wait: 5000 });
    const p1 = await locker.tryAcquire(sem, { ttl: 1000, permits: 2 });
    const p2 = await locker.acquire(sem, { ttl: 1000, permits: 2, wait: 5000 });
    assert.ok(r1 && p1);
    const tokens = [r1.token, r2.token, p1.token, p2.token];
    try {
      await sleep(2500); // two and a half ttls: only renewals keep them
      for (const l of [r1, r2, p1, p2]) assert.equal(l.lost, false, `${l.name} ${l.token} lost`);
      assert.deepEqual(await live(readers), new Map([[r1.token, 'shared/-'], [r2.token, 'shared/-']]));
      assert.deepEqual(await live(sem), new Map([[p1.token, 'permit/2'], [p2.token, 'permit/2']]));
      // A third reader beside the two; no third permit beside two.
      const third = await locker.withLock(readers, async (l) => [l.shared, l.token, (await live(readers)).size] as const, {
        ttl: 1000,
        shared: true,
        wait: 5000,
      });
      assert.deepEqual([third[0], third[2]], [true, 3]);
      tokens.push(third[1]);
      assert.equal(await locker.tryAcquire(sem, { ttl: 1000, permits: 2 }), null);
      assert.equal(await p2.release(), true);
      assert.deepEqual([...(await live(sem)).keys()], [p1.token]);
      const permit = await locker.withLock(sem, async (l) => [l.permits, [...(await live(sem)).keys()]] as const, {
        ttl: 1000,
        permits: 2,
        wait: 5000,
      });
      assert.equal(permit[0], 2);
      assert.equal(permit[1].length, 2);
      tokens.push(permit[1].find((t) => t !== p1.token)!);
    } finally {
      for (const l of [r1, r2, p1]) assert.equal(await l.release(), true);
    }
    assert.equal((await live(readers)).size + (await live(sem)).size, 0);
    const h = await admin.query('SELECT token, ended_by FROM fenced_lock_history WHERE name = ANY($1)', [[readers, sem]]);
    assert.deepEqual(
      new Map(h.rows.map((x) => [BigInt(x.token), x.ended_by])),
      new Map(tokens.map((t) => [t, 'release'])),
    );
  });
});
