// node build/test/db.js setup|teardown: the suite's roles, and its databases
// (test.sh runs setup before the suite and teardown after it, whatever
// happened). Each test file creates its own database (support.ts, DB).
import { dropDatabases, ensureRoles } from './support';

const what = process.argv[2];
const run = what === 'setup' ? async () => (await dropDatabases(), await ensureRoles()) : what === 'teardown' ? dropDatabases : null;
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
