// node build/test/db.js setup|teardown: the suite's database and roles
// (test.sh runs setup before the suite and teardown after it, whatever happened).
import { dropDatabase, ensureDatabase } from './support';

const what = process.argv[2];
const run = what === 'setup' ? async () => (await dropDatabase(), await ensureDatabase()) : what === 'teardown' ? dropDatabase : null;
if (!run) {
  process.stderr.write('usage: node build/test/db.js setup|teardown\n');
  process.exit(2);
}
run().then(
  () => process.exit(0),
  (err) => {
    process.stderr.write(`${err instanceof Error ? err.stack : String(err)}\n`);
    process.exit(1);
  },
);
