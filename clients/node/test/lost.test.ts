// The lost signal, in every way it comes (clients/README.md, "Keepalive"):
// a real SIGSTOP of the hold example past its ttl, a renew that says false,
// an event loop blocked past the ttl, a renew that hangs, keepalive
// connections that keep failing, and no keepalive at all.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type pg from 'pg';
import { Locker } from 'fenced-lock';
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
  uniqueName,
  validate,
  waitFor,
  watch,
} from './support';

const nextRow = rowIds(500);
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

describe('the lost signal', () => {
  test('SIGSTOP past the ttl: lost within 1 s of SIGCONT, and the write is refused with FL001', { timeout: 40_000 }, async () => {
    const id = nextRow();
    const name = `row:${id}`;
    await resetRow(admin, 'UPDATE fenced SET fence_token = NULL WHERE id = $1', [id]);
    const hold = new Example('hold', ['--dsn', dsn(), '--name', name, '--ttl', '1', '--hold', '4', '--write', `fenced:${id}`]);
    const acquired = await hold.next((e) => e.event === 'acquired', 15_000, 'acquired');
    await hold.next((e) => e.event === 'renewed', 5000, 'a first renew');
    hold.signal('SIGSTOP');
    const stoppedAt = performance.now();
    // While it sleeps, its lease runs out and someone else takes the name
    // and writes the row with a newer token.
    const taker = await locker.acquire(name, { ttl: 20_000, wait: 10_000 });
    assert.ok(taker.token > BigInt(acquired.token!));
    await taker.query('UPDATE fenced SET fence_token = $1 WHERE id = $2', [taker.token.toString(), id]);
    await sleep(Math.max(0, 2500 - (performance.now() - stoppedAt)));
    const contAt = performance.now();
    hold.signal('SIGCONT');
    const lost = await hold.next((e) => e.event === 'lost', 10_000, 'lost');
    const lostAfter = lost.at - contAt;
    console.log(`SIGSTOP ${(contAt - stoppedAt).toFixed(0)} ms (ttl 1000 ms): lost ${lostAfter.toFixed(0)} ms after SIGCONT`);
    assert.ok(lostAfter < 1000, `lost ${lostAfter.toFixed(0)} ms after SIGCONT`);
    assert.equal(lost.token, acquired.token);
    const write = await hold.next((e) => e.event === 'write', 15_000, 'the write');
    assert.deepEqual({ ok: write.ok, sqlstate: write.sqlstate }, { ok: false, sqlstate: 'FL001' });
    assert.equal(await hold.exitCode(10_000), 3);
    assert.ok(!hold.events.some((e) => e.event === 'released'), 'a lost lease is not released');
    assert.ok(!hold.events.some((e) => e.event === 'renewed' && e.at > contAt), 'no renew after the pause');
    const row = await admin.query('SELECT fence_token FROM fenced WHERE id = $1', [id]);
    assert.equal(BigInt(row.rows[0].fence_token), taker.token, 'the stale write left the row as the new holder wrote it');
    assert.equal(await validate(admin, name, taker.token), true, 'the new holder keeps the name');
    assert.equal(await taker.release(), true);
  });

  test('a force-released lease is lost at the next renew: signal aborted and one lost event', { timeout: 20_000 }, async () => {
    const name = uniqueName('force');
    const lease = await locker.acquire(name, { ttl: 1200 });
    const seen = watch(lease);
    let aborted = 0;
    lease.signal.addEventListener('abort', () => aborted++);
    await admin.query('SELECT fenced_lock_force_release($1)', [name]);
    const at = performance.now();
    await waitFor('lost', 5000, () => seen.lost.length > 0);
    assert.ok(seen.lost[0]!.at - at < lease.keepaliveInterval + 1000);
    assert.equal(seen.lost[0]!.reason.reason, 'renew_false');
    assert.equal(seen.lost[0]!.reason.sqlstate, 'FL001');
    await sleep(lease.keepaliveInterval * 2);
    assert.equal(seen.lost.length, 1);
    assert.equal(aborted, 1);
    assert.equal(lease.lost, true);
    assert.equal(await lease.release(), false);
  });

  test('an event loop blocked past the ttl: lost as soon as it runs again, by the clock, with no renew sent first', { timeout: 20_000 }, async () => {
    const name = uniqueName('blocked-loop');
    const lease = await locker.acquire(name, { ttl: 800 });
    const seen = watch(lease);
    await waitFor('a first renew', 5000, () => seen.renewed.length > 0);
    const renewals = seen.renewed.length;
    // The work hogs the thread (a long synchronous step, a stalled event
    // loop): no timer can run for longer than the ttl.
    const until = performance.now() + 1300;
    while (performance.now() < until) {
      /* busy */
    }
    const unblocked = performance.now();
    await waitFor('lost', 2000, () => seen.lost.length > 0, 1);
    const after = seen.lost[0]!.at - unblocked;
    console.log(`event loop blocked 1300 ms (ttl 800 ms): lost ${after.toFixed(1)} ms after it ran again`);
    // 'deadline', not 'renew_false': had a renew gone out first, the server
    // (whose lease had expired too) would have answered false.
    assert.equal(seen.lost[0]!.reason.reason, 'deadline');
    assert.equal(seen.renewed.length, renewals);
    assert.ok(after < 1000);
    assert.equal(await lease.release(), false);
  });

  test('a renew that hangs does not hold up the lost signal: lost at the deadline', { timeout: 20_000 }, async () => {
    const name = uniqueName('hung-renew');
    const lease = await locker.acquire(name, { ttl: 1500 });
    const seen = watch(lease);
    await waitFor('a first renew', 5000, () => seen.renewed.length > 0);
    const lastRenew = seen.renewed[seen.renewed.length - 1]!;
    // Another transaction renews the lease and stays open: until it ends,
    // the keepalive's next renew waits on the server for the lease's lock,
    // longer than the ttl.
    const blocker = await connect();
    try {
      await blocker.query('BEGIN');
      await blocker.query('SELECT fenced_lock_renew($1, $2::bigint)', [name, lease.token.toString()]);
      await waitFor('lost', 5000, () => seen.lost.length > 0);
      const at = seen.lost[0]!.at - lastRenew;
      console.log(`hung renew: lost ${at.toFixed(0)} ms after the last renew returned (ttl 1500 ms)`);
      assert.equal(seen.lost[0]!.reason.reason, 'deadline');
      // The deadline counts from the last renew's send, before it returned.
      assert.ok(at <= 1500 + 250, `lost ${at.toFixed(0)} ms after the last renew`);
      await blocker.query('COMMIT');
    } finally {
      await blocker.end();
    }
    assert.equal(await lease.release(), false);
    assert.equal(seen.lost.length, 1);
  });

  test('keepalive connections that keep failing: retried every min(interval, 1 s), lost at the deadline', { timeout: 20_000 }, async () => {
    let keepaliveOpens = 0;
    const failing = new Locker(async (purpose) => {
      if (purpose === 'keepalive') {
        keepaliveOpens++;
        throw new Error('connection refused (simulated)');
      }
      return connect();
    });
    const name = uniqueName('ka-failing');
    const lease = await failing.acquire(name, { ttl: 2400, keepaliveInterval: 300 });
    const seen = watch(lease);
    const start = performance.now();
    try {
      await waitFor('lost', 5000, () => seen.lost.length > 0);
      const at = seen.lost[0]!.at - start;
      console.log(`keepalive failing: ${keepaliveOpens} connection attempts, lost after ${at.toFixed(0)} ms (ttl 2400 ms)`);
      assert.equal(seen.lost[0]!.reason.reason, 'deadline');
      assert.ok(at <= 2400 + 250);
      // The eager open, then one per retry (every 300 ms) until the deadline:
      // about 8; fewer than 4 would mean the retries stopped.
      assert.ok(keepaliveOpens >= 4, `${keepaliveOpens} attempts`);
      assert.equal(seen.errors.length, keepaliveOpens);
    } finally {
      assert.equal(await lease.release(), false, 'a lost lease is not released');
      await admin.query('SELECT fenced_lock_force_release($1)', [name]);
    }
  });

  test('without keepalive the lease is lost at its deadline, with nothing sent', { timeout: 20_000 }, async () => {
    const name = uniqueName('no-keepalive');
    const lease = await locker.acquire(name, { ttl: 600, keepalive: false });
    const seen = watch(lease);
    assert.deepEqual(await keepalivePids(admin), []);
    await waitFor('lost', 5000, () => seen.lost.length > 0);
    assert.equal(seen.lost[0]!.reason.reason, 'deadline');
    assert.equal(seen.renewed.length, 0);
    assert.equal(await lease.release(), false);
  });

});
