// The keepalive: it keeps a lease alive past its ttl, through a long guarded
// transaction too, comes back from a killed connection, sees a session-bound
// lease end with its session, and renews an acquire that waited in line
// (clients/README.md, "Keepalive" and "Tests"). The lost signal in every way
// it comes is lost.test.ts.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type pg from 'pg';
import { LeaseLostError, Locker } from 'fenced-lock';
import {
  Example,
  connect,
  dsn,
  ensureDatabase,
  keepalivePids,
  killChildren,
  resetRow,
  rowIds,
  sleep,
  spy,
  uniqueName,
  validate,
  waitFor,
  watch,
} from './support';

const nextRow = rowIds(0);
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

describe('keepalive', () => {
  test('keeps a critical section of 3x the ttl alive (hold example, ttl 1 s, hold 3.5 s)', { timeout: 30_000 }, async () => {
    const id = nextRow();
    const name = `row:${id}`;
    await resetRow(admin, 'UPDATE fenced SET fence_token = NULL WHERE id = $1', [id]);
    const hold = new Example('hold', ['--dsn', dsn(), '--name', name, '--ttl', '1', '--hold', '3.5', '--write', `fenced:${id}`]);
    const acquired = await hold.next((e) => e.event === 'acquired', 15_000, 'acquired');
    const token = BigInt(acquired.token!);
    // Through the whole section the lease stays this token's, on the
    // server's clock: nobody else gets the name, long after the first ttl.
    const other = new Locker(dsn());
    const start = performance.now();
    let checks = 0;
    try {
      while (!hold.events.some((e) => e.event === 'write')) {
        assert.equal(await validate(admin, name, token), true, `lease not live ${(performance.now() - start).toFixed(0)} ms in`);
        assert.equal(await other.tryAcquire(name, { ttl: 5000 }), null);
        checks++;
        await sleep(100);
        if (performance.now() - start > 20_000) throw new Error('no write event within 20 s');
      }
    } finally {
      await other.end();
    }
    const code = await hold.exitCode(15_000);
    const events = hold.events.map((e) => e.event);
    const renewed = events.filter((e) => e === 'renewed').length;
    console.log(`3x ttl: ${renewed} renewals, ${checks} server checks, events ${events.join(',')}`);
    assert.equal(code, 0);
    assert.ok(renewed >= 3, `only ${renewed} renewals in 3.5 s at a 333 ms interval`);
    assert.ok(!events.includes('lost'));
    assert.deepEqual(hold.events.find((e) => e.event === 'write')!.ok, true);
    const released = hold.events.find((e) => e.event === 'released')!;
    assert.equal(released.released, true);
    assert.equal(BigInt(released.token!), token);
    const row = await admin.query('SELECT fence_token FROM fenced WHERE id = $1', [id]);
    assert.equal(BigInt(row.rows[0].fence_token), token, 'the guarded write with the kept token was accepted');
  });

  test('a guarded transaction open for 3x the ttl keeps its lease, and its commit is accepted', { timeout: 20_000 }, async () => {
    // A renew takes the lease's lock in a mode the guard's does not conflict
    // with: the keepalive renews all through the holder's open transaction.
    const id = nextRow();
    const name = `row:${id}`;
    await resetRow(admin, 'UPDATE fenced SET fence_token = NULL WHERE id = $1', [id]);
    const lease = await locker.acquire(name, { ttl: 1000 });
    const seen = watch(lease);
    try {
      await lease.query('BEGIN');
      await lease.query('UPDATE fenced SET fence_token = $1 WHERE id = $2', [lease.token.toString(), id]);
      const opened = performance.now();
      await sleep(3000);
      await lease.query('UPDATE fenced SET fence_token = $1 WHERE id = $2', [lease.token.toString(), id]);
      const during = seen.renewed.filter((t) => t > opened).length;
      assert.equal(await validate(admin, name, lease.token), true, 'the lease expired under its open transaction');
      await lease.query('COMMIT');
      console.log(`guarded transaction of 3 s at ttl 1 s: ${during} renewals while it was open`);
      assert.ok(during >= 3, `${during} renewals while the transaction was open`);
      assert.equal(seen.lost.length, 0);
    } finally {
      assert.equal(await lease.release(), true);
    }
    const row = await admin.query('SELECT fence_token FROM fenced WHERE id = $1', [id]);
    assert.equal(BigInt(row.rows[0].fence_token), lease.token);
    const h = await admin.query('SELECT ended_by FROM fenced_lock_history WHERE name = $1', [name]);
    assert.deepEqual(h.rows.map((r) => r.ended_by), ['release']);
  });

  test("a renew held up by the holder's own transaction holds up its release only until the renew is cut", { timeout: 20_000 }, async () => {
    // What a renew does wait for is another change of the same lease in an
    // open transaction, here the holder's own: a leader proclaims, writes,
    // releases, then commits. The release waits for the renew in flight,
    // which waits for this very transaction until it is cut (after
    // max(interval, 2 s)): then the release goes out, long before the deadline.
    const id = nextRow();
    const name = `row:${id}`;
    await resetRow(admin, 'UPDATE fenced SET fence_token = NULL WHERE id = $1', [id]);
    const lease = await locker.acquire(name, { ttl: 20_000, keepaliveInterval: 200 });
    await lease.query('BEGIN');
    const proclaimed = await lease.query<{ ok: boolean }>("SELECT fenced_lock_proclaim($1, $2::bigint, 'leader at 10.0.0.7') AS ok", [
      name,
      lease.token.toString(),
    ]);
    assert.equal(proclaimed.rows[0]!.ok, true);
    await lease.query('UPDATE fenced SET fence_token = $1 WHERE id = $2', [lease.token.toString(), id]);
    await waitFor('the renew to wait on the lease lock', 5000, async () => {
      const r = await admin.query(
        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'fenced_lock_keepalive' AND wait_event_type = 'Lock'",
      );
      return r.rowCount === 1;
    });
    const called = performance.now();
    assert.equal(await lease.release(), true);
    const took = performance.now() - called;
    await lease.query('COMMIT');
    console.log(`release took ${took.toFixed(0)} ms with a renew held up behind its own transaction`);
    assert.ok(took < 4000, `release took ${took.toFixed(0)} ms`);
    assert.equal(lease.lost, false);
    const h = await admin.query('SELECT ended_by FROM fenced_lock_history WHERE name = $1', [name]);
    assert.deepEqual(h.rows.map((r) => r.ended_by), ['release']);
    const row = await admin.query('SELECT fence_token FROM fenced WHERE id = $1', [id]);
    assert.equal(BigInt(row.rows[0].fence_token), lease.token);
    const leader = await admin.query('SELECT count(*)::int AS n FROM fenced_lock_leader($1)', [name]);
    assert.equal(leader.rows[0].n, 0);
  });

  test('pg_terminate_backend of the keepalive connection: it reconnects and renews, the lease stays live', { timeout: 30_000 }, async () => {
    const name = uniqueName('ka-terminate');
    const lease = await locker.acquire(name, { ttl: 1500 });
    const seen = watch(lease);
    try {
      await waitFor('a first renew', 5000, () => seen.renewed.length > 0);
      const [pid, ...more] = await keepalivePids(admin);
      assert.ok(pid !== undefined && more.length === 0, 'one keepalive connection');
      await admin.query('SELECT pg_terminate_backend($1)', [pid]);
      const killedAt = performance.now();
      // Three ttls after its connection was killed, the lease is still held:
      // the keepalive opened another connection and went on renewing.
      await sleep(4500);
      const after = seen.renewed.filter((t) => t > killedAt).length;
      const pids = await keepalivePids(admin);
      console.log(`keepalive terminated: ${after} renewals in the 4.5 s after, new keepalive pid ${pids.join(',')} (was ${pid})`);
      assert.equal(lease.lost, false);
      assert.equal(seen.lost.length, 0);
      assert.ok(after >= 3, `only ${after} renewals after the kill`);
      assert.equal(pids.length, 1);
      assert.notEqual(pids[0], pid);
      assert.equal(await validate(admin, name, lease.token), true);
    } finally {
      assert.equal(await lease.release(), true);
    }
  });

  test("pg_terminate_backend of a session-bound lease's own connection: ended on the server, lost at the next renew", { timeout: 30_000 }, async () => {
    const name = uniqueName('sb-terminate');
    const lease = await locker.acquire(name, { ttl: 3000, sessionBound: true });
    const seen = watch(lease);
    const pid = (lease.client as unknown as { processID: number }).processID;
    assert.ok(pid > 0);
    await admin.query('SELECT pg_terminate_backend($1)', [pid]);
    const killedAt = performance.now();
    await waitFor('the lease to end on the server', 5000, async () => !(await validate(admin, name, lease.token)));
    await waitFor('lost', 5000, () => seen.lost.length > 0);
    const lostAfter = seen.lost[0]!.at - killedAt;
    console.log(`session-bound connection terminated: lost after ${lostAfter.toFixed(0)} ms (interval ${lease.keepaliveInterval} ms)`);
    assert.equal(seen.lost[0]!.reason.reason, 'renew_false', 'the renew said the lease had ended');
    assert.ok(lostAfter < lease.keepaliveInterval + 2000);
    assert.equal(lease.signal.aborted, true);
    assert.ok(lease.signal.reason instanceof LeaseLostError);
    const h = await admin.query("SELECT ended_by FROM fenced_lock_history WHERE name = $1", [name]);
    assert.deepEqual(h.rows.map((r) => r.ended_by), ['session_end']);
    assert.equal(await lease.release(), false);
    assert.equal(seen.lost.length, 1, 'lost is signalled once');
  });

  test('an acquire that waited longer than its ttl renews before it returns: a live lease with its whole ttl', { timeout: 20_000 }, async () => {
    const name = uniqueName('waited');
    const first = await locker.acquire(name, { ttl: 10_000 });
    const s = spy();
    const client = s.watch(await connect());
    const waiting = locker.acquire(name, { ttl: 1500, wait: 10_000, client });
    await sleep(2000);
    assert.equal(await first.release(), true);
    const second = await waiting;
    const seen = watch(second);
    try {
      // Counted from the acquire's send, its deadline would have passed
      // before the grant; the renew sent after the grant counts instead.
      const sent = s.queries.filter((q) => /fenced_lock_(acquire|renew)/.test(q)).map((q) => (/renew/.test(q) ? 'renew' : 'acquire'));
      assert.deepEqual(sent, ['acquire', 'renew']);
      assert.ok(second.remaining() > 1000, `remaining ${second.remaining()} ms`);
      await sleep(2000);
      assert.equal(seen.lost.length, 0);
      assert.equal(await validate(admin, name, second.token), true);
    } finally {
      assert.equal(await second.release(), true);
      await client.end();
    }
  });
});
