// hold --dsn DSN --name NAME --ttl SECONDS --hold SECONDS [--wait SECONDS]
//      [--write TABLE:ID] [--session-bound] [--shared] [--permits N] [--holder TEXT]
//
// Takes a lease with keepalive, holds it, optionally writes its token into a
// guarded row, releases. Exit 0 done, 3 lost, 1 other failure, 2 bad command line.
import pg from 'pg';
import { Locker, sqlstateOf } from 'fenced-lock';
import { EXIT_DONE, EXIT_LOST, emit, fail, number, parseArgs, run } from './cli';

const USAGE =
  'usage: hold --dsn DSN --name NAME --ttl SECONDS --hold SECONDS [--wait SECONDS] ' +
  '[--write TABLE:ID] [--session-bound] [--shared] [--permits N] [--holder TEXT]';

function quoteTable(table: string): string {
  // schema.table, each part an identifier as written
  return table
    .split('.')
    .map((part) => `"${part.replace(/"/g, '""')}"`)
    .join('.');
}

async function main(): Promise<number> {
  const { values, flags } = parseArgs(
    process.argv.slice(2),
    {
      values: { dsn: true, name: true, ttl: true, hold: true, wait: false, write: false, permits: false, holder: false },
      flags: ['session-bound', 'shared'],
    },
    USAGE,
  );
  const ttl = number(values, 'ttl', USAGE)!;
  const hold = number(values, 'hold', USAGE)!;
  const wait = number(values, 'wait', USAGE);
  const permits = number(values, 'permits', USAGE);
  let write: { table: string; id: string } | null = null;
  const w = values.get('write');
  if (w !== undefined) {
    const colon = w.indexOf(':');
    if (colon <= 0 || colon === w.length - 1) fail(`--write must be TABLE:ID, got ${JSON.stringify(w)}`, USAGE);
    write = { table: w.slice(0, colon), id: w.slice(colon + 1) };
  }
  if (hold < 0) fail('--hold must be >= 0', USAGE);
  const dsn = values.get('dsn')!;

  const locker = new Locker(dsn);
  const lease = await locker.acquire(values.get('name')!, {
    ttl: ttl * 1000,
    wait: wait === undefined ? null : wait * 1000,
    holder: values.get('holder') ?? null,
    sessionBound: flags.has('session-bound'),
    shared: flags.has('shared'),
    ...(permits === undefined ? {} : { permits }),
  });
  const token = lease.token;
  emit({ event: 'acquired', token });
  lease.on('renewed', () => emit({ event: 'renewed', token }));
  lease.on('lost', () => emit({ event: 'lost', token }));

  // Not cut short by a loss: the write below must still be tried, and refused.
  await new Promise((resolve) => setTimeout(resolve, hold * 1000));

  if (write) {
    const sql = `UPDATE ${quoteTable(write.table)} SET fence_token = $1 WHERE id = $2`;
    const params = [token.toString(), write.id];
    let error: unknown = null;
    try {
      await inTransaction(lease.client, sql, params);
    } catch (err) {
      error = err;
      if (sqlstateOf(err) === undefined && lease.lost) {
        // The lease's connection died with its session (a session-bound
        // lease): the write still goes to the database, which must refuse it.
        error = null;
        const other = new pg.Client({ connectionString: dsn });
        await other.connect();
        try {
          await inTransaction(other, sql, params);
        } catch (err2) {
          error = err2;
        } finally {
          await other.end();
        }
      }
    }
    if (error === null) emit({ event: 'write', ok: true });
    else {
      const sqlstate = sqlstateOf(error);
      if (sqlstate !== 'FL001' && sqlstate !== 'FL002') throw error;
      emit({ event: 'write', ok: false, sqlstate });
    }
  }

  if (lease.lost) {
    // A lost lease is never released: the name may be someone else's now.
    await lease.abandon();
    await locker.end();
    return EXIT_LOST;
  }
  const released = await lease.release();
  await locker.end();
  if (lease.lost) return EXIT_LOST; // a renew in flight at the release said the lease had ended
  emit({ event: 'released', token, released });
  return released ? EXIT_DONE : EXIT_LOST;
}

async function inTransaction(client: pg.ClientBase, sql: string, params: unknown[]): Promise<void> {
  await client.query('BEGIN');
  try {
    await client.query(sql, params);
    await client.query('COMMIT');
  } catch (err) {
    await client.query('ROLLBACK').catch(() => undefined);
    throw err;
  }
}

run(main);
