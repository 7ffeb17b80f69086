// inventory --dsn DSN --item ID --sales N --ttl SECONDS
//
// Sells up to N units of inventory(item_id, stock, fence_token), guarded by
// fenced_lock_guard('inventory:{item_id}', 'fence_token'), one sale per run
// of the retry helper: acquire, read the stock, write stock - 1 with the
// token, release. A sale whose lease was lost is refused by the database
// (FL001) and runs again from the acquire, so each unit is sold once.
import { Locker } from 'fenced-lock';
import { EXIT_DONE, emit, fail, number, parseArgs, run } from './cli';

const USAGE = 'usage: inventory --dsn DSN --item ID --sales N --ttl SECONDS';

async function main(): Promise<number> {
  const { values } = parseArgs(
    process.argv.slice(2),
    { values: { dsn: true, item: true, sales: true, ttl: true }, flags: [] },
    USAGE,
  );
  const item = number(values, 'item', USAGE)!;
  const sales = number(values, 'sales', USAGE)!;
  const ttl = number(values, 'ttl', USAGE)!;
  if (!Number.isInteger(item)) fail('--item must be an integer', USAGE);
  if (!Number.isInteger(sales) || sales < 0) fail('--sales must be an integer >= 0', USAGE);

  const locker = new Locker(values.get('dsn')!);
  let sold = 0;
  try {
    for (let i = 0; i < sales; i++) {
      const wrote = await locker.withLock(
        `inventory:${item}`,
        async (lease) => {
          const c = lease.client;
          await c.query('BEGIN');
          try {
            const r = await c.query<{ stock: number }>('SELECT stock FROM inventory WHERE item_id = $1', [item]);
            if (r.rows.length === 0) throw new Error(`inventory has no row for item_id ${item}`);
            const stock = r.rows[0]!.stock;
            if (stock <= 0) {
              await c.query('COMMIT');
              return null;
            }
            await c.query('UPDATE inventory SET stock = $1, fence_token = $2 WHERE item_id = $3', [
              stock - 1,
              lease.token.toString(),
              item,
            ]);
            await c.query('COMMIT');
            return stock - 1;
          } catch (err) {
            await c.query('ROLLBACK').catch(() => undefined);
            throw err;
          }
        },
        { ttl: ttl * 1000 },
      );
      if (wrote === null) {
        emit({ event: 'sold_out' });
        break;
      }
      sold++;
      emit({ event: 'sold', stock: wrote });
    }
    emit({ event: 'done', sold });
    return EXIT_DONE;
  } finally {
    await locker.end();
  }
}

run(main);
