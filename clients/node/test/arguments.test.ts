// Every bad argument of every call is refused by the client with the
// invalid-argument error (22023), naming the argument, before anything is
// sent: no connection opened, no query on a given connection, no trace on the
// server.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { InvalidArgumentError, Locker } from 'fenced-lock';
import { connect, dsn, ensureDatabase, spy } from './support';

/* eslint-disable @typescript-eslint/no-explicit-any */
type Any = any;

let admin: pg.Client;
const s = spy();
let locker: Locker;
let given: pg.Client;
const PREFIX = `args:${process.pid}:${Date.now()}`;

before(async () => {
  await ensureDatabase();
  admin = await connect();
  locker = new Locker(s.factory);
  given = s.watch(await connect());
});

after(async () => {
  await given?.end();
  await s.closeAll();
  await admin?.end();
});

function refused(err: unknown, argument: string): boolean {
  assert.ok(err instanceof InvalidArgumentError, `expected InvalidArgumentError, got ${String(err)}`);
  assert.equal(err.sqlstate, '22023');
  assert.equal(err.code, '22023');
  assert.equal(err.argument, argument);
  assert.match(err.message, new RegExp(`"${argument}"`));
  return true;
}

const name = (case_: string) => `${PREFIX}:${case_}`;

/** Bad lease options shared by tryAcquire, acquire and withLock: [case, options, argument named]. */
const LEASE_CASES: Array<[string, Record<string, unknown>, string]> = [
  ['ttl 0', { ttl: 0 }, 'ttl'],
  ['ttl negative', { ttl: -1 }, 'ttl'],
  ['ttl NaN', { ttl: NaN }, 'ttl'],
  ['ttl Infinity', { ttl: Infinity }, 'ttl'],
  ['ttl a string', { ttl: '30000' }, 'ttl'],
  ['ttl null', { ttl: null }, 'ttl'],
  ['holder a number', { holder: 7 }, 'holder'],
  ['sessionBound a string', { sessionBound: 'true' }, 'sessionBound'],
  ['shared a number', { shared: 1 }, 'shared'],
  ['permits 0', { permits: 0 }, 'permits'],
  ['permits negative', { permits: -2 }, 'permits'],
  ['permits fractional', { permits: 1.5 }, 'permits'],
  ['permits above int4', { permits: 2 ** 31 }, 'permits'],
  ['permits a string', { permits: '2' }, 'permits'],
  ['shared with permits > 1', { shared: true, permits: 2 }, 'permits'],
  ['keepalive a string', { keepalive: 'no' }, 'keepalive'],
  ['keepaliveInterval 0', { keepaliveInterval: 0 }, 'keepaliveInterval'],
  ['keepaliveInterval not below the ttl', { ttl: 1000, keepaliveInterval: 1000 }, 'keepaliveInterval'],
  ['client not a client', { client: {} }, 'client'],
  ['client null', { client: null }, 'client'],
  ['an unknown option', { sessionbound: true }, 'sessionbound'],
];
const WAIT_CASES: Array<[string, Record<string, unknown>, string]> = [
  ['wait negative', { wait: -1 }, 'wait'],
  ['wait NaN', { wait: NaN }, 'wait'],
  ['wait a string', { wait: '5' }, 'wait'],
];
const NAME_CASES: Array<[string, unknown]> = [
  ['empty', ''],
  ['a number', 5],
  ['null', null],
  ['undefined', undefined],
];

describe('bad arguments are refused before anything is sent', () => {
  test('new Locker: bad sources and options', { timeout: 20_000 }, () => {
    const sources: Array<[string, unknown]> = [
      ['a number', 42],
      ['null', null],
      ['undefined', undefined],
      ['empty string', ''],
      ['blank string', '   '],
      ['an array', []],
      ['a boolean', true],
      ['key=value without a value', 'host'],
      ['unterminated quote', "host='127.0.0.1"],
      ['unknown keyword', 'host=127.0.0.1 nosuchkeyword=1'],
      ['bad port', 'host=127.0.0.1 port=notaport'],
      ['bad sslmode', 'host=127.0.0.1 sslmode=sometimes'],
      ['bad URL', 'postgresql://[::1'],
      ['a single client', new pg.Client()],
    ];
    for (const [what, source] of sources) {
      assert.throws(() => new Locker(source as Any), (e) => refused(e, 'source'), what);
    }
    const options: Array<[string, unknown, string]> = [
      ['keepaliveInterval 0', { keepaliveInterval: 0 }, 'keepaliveInterval'],
      ['keepaliveInterval negative', { keepaliveInterval: -5 }, 'keepaliveInterval'],
      ['keepaliveInterval NaN', { keepaliveInterval: NaN }, 'keepaliveInterval'],
      ['keepaliveInterval a string', { keepaliveInterval: '100' }, 'keepaliveInterval'],
      ['attempts 0', { attempts: 0 }, 'attempts'],
      ['attempts fractional', { attempts: 1.5 }, 'attempts'],
      ['attempts a string', { attempts: '5' }, 'attempts'],
      ['transactionPooling a string', { transactionPooling: 'yes' }, 'transactionPooling'],
      ['schema empty', { schema: '' }, 'schema'],
      ['poolSize 0', { poolSize: 0 }, 'poolSize'],
      ['an unknown option', { attempt: 5 }, 'attempt'],
      ['options a string', 'x', 'options'],
      ['options null', null, 'options'],
    ];
    for (const [what, opts, argument] of options) {
      assert.throws(() => new Locker(s.factory, opts as Any), (e) => refused(e, argument), what);
    }
    assert.equal(s.opened, 0);
  });

  for (const call of ['tryAcquire', 'acquire', 'withLock'] as const) {
    test(`${call}: every bad argument`, { timeout: 20_000 }, async () => {
      const run = (n: unknown, options?: unknown) =>
        call === 'withLock'
          ? locker.withLock(n as Any, () => 1, options as Any)
          : (locker[call] as (n: unknown, o?: unknown) => Promise<unknown>)(n, options);
      for (const [what, n] of NAME_CASES) {
        await assert.rejects(run(n), (e) => refused(e, 'name'), `name ${what}`);
      }
      const cases = [...LEASE_CASES, ...(call === 'tryAcquire' ? [] : WAIT_CASES)];
      for (const [what, options, argument] of cases) {
        await assert.rejects(run(name(`${call}:${what}`), options), (e) => refused(e, argument), what);
        // The same with the caller's own connection: nothing is sent on it either.
        if (!('client' in options)) {
          await assert.rejects(run(name(`${call}:${what}`), { ...options, client: given }), (e) => refused(e, argument), what);
        }
      }
      await assert.rejects(run(name(`${call}:options`), 'fast'), (e) => refused(e, 'options'));
      await assert.rejects(run(name(`${call}:options`), null), (e) => refused(e, 'options'));
      if (call === 'tryAcquire') {
        // A try never waits: `wait` is not one of its options.
        await assert.rejects(run(name('try:wait'), { wait: 1000 }), (e) => refused(e, 'wait'));
        await assert.rejects(run(name('try:attempts'), { attempts: 2 }), (e) => refused(e, 'attempts'));
      }
      if (call === 'acquire') {
        await assert.rejects(run(name('acquire:attempts'), { attempts: 2 }), (e) => refused(e, 'attempts'));
      }
      if (call === 'withLock') {
        await assert.rejects(locker.withLock(name('fn'), 'not a function' as Any), (e) => refused(e, 'fn'));
        await assert.rejects(locker.withLock(name('fn'), undefined as Any), (e) => refused(e, 'fn'));
        for (const attempts of [0, -1, 1.5, '3', 1001]) {
          await assert.rejects(locker.withLock(name('attempts'), () => 1, { attempts } as Any), (e) => refused(e, 'attempts'));
        }
      }
      assert.equal(s.opened, 0, 'no connection was opened');
      assert.deepEqual(s.queries, [], 'nothing was sent on the given connection');
    });
  }

  test('lease.renew: a bad ttl', { timeout: 20_000 }, async () => {
    const other = new Locker(dsn());
    try {
      const lease = await other.acquire(name('renew'), { ttl: 5000, client: given, keepalive: false });
      const sent = s.queries.length;
      for (const ttl of [0, -1, NaN, Infinity, '1000', null]) {
        await assert.rejects(lease.renew(ttl as Any), (e) => refused(e, 'ttl'), String(ttl));
      }
      assert.equal(s.queries.length, sent, 'no renew was sent');
      assert.equal(await lease.release(), true);
    } finally {
      await other.end();
    }
    s.queries.length = 0;
  });

  test('the server saw none of the refused calls', { timeout: 20_000 }, async () => {
    const r = await admin.query("SELECT count(*)::int AS n FROM fenced_lock_history WHERE name LIKE $1 AND name <> $2", [
      `${PREFIX}:%`,
      name('renew'),
    ]);
    assert.equal(r.rows[0].n, 0);
    assert.equal(s.opened, 0);
  });
});
