#!/usr/bin/env bash
# The seeds' inventory story, live: stock 10, client A pauses past its lease,
# B sells, A's stale write is rejected by the database (FL001), A re-acquires
# and sells, stock 8. Runs against a scratch PostgreSQL on 127.0.0.1:5499.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${FL_DEMO_DIR:-/tmp/fenced_lock_demo}
PORT=${FL_DEMO_PORT:-5499}
TTL=${FL_DEMO_TTL:-2}

scripts/cluster.sh start "$DIR" "$PORT"
psql_() { psql -X -q -h 127.0.0.1 -p "$PORT" -U postgres "$@"; }
psql_ -d postgres -c "DROP DATABASE IF EXISTS demo WITH (FORCE)" -c "CREATE DATABASE demo"

say()  { printf '\n\033[1m== %s\033[0m\n' "$*"; }
# Each client is its own connection; nothing depends on session state.
client() {
  local who=$1; shift
  printf '\033[36m[%s]\033[0m %s\n' "$who" "$*"
  printf '%s;\n\\if :ERROR\n\\echo SQLSTATE :LAST_ERROR_SQLSTATE\n\\endif\n' "$*" |
    psql_ -d demo -At -v ON_ERROR_STOP=0 -v VERBOSITY=default 2>&1 | sed 's/^/      /' || true
}

say "Setup: the extension, a table of stock, and the guard trigger"
psql_ -d demo -e <<'SQL'
CREATE EXTENSION fenced_lock;
CREATE TABLE inventory (item_id int PRIMARY KEY, stock int NOT NULL, fence_token bigint);
CREATE TRIGGER inventory_fence
  BEFORE INSERT OR UPDATE OR DELETE ON inventory
  FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('inventory:{item_id}', 'fence_token');
SELECT fenced_lock_try_acquire('inventory:1', '5 seconds', 'setup') AS t \gset
INSERT INTO inventory VALUES (1, 10, :t);
SELECT fenced_lock_release('inventory:1', :t);
SQL

say "A takes the lock (ttl ${TTL}s) and reads the stock"
A_TOKEN=$(psql_ -d demo -At -c "SELECT fenced_lock_try_acquire('inventory:1', '${TTL} seconds', 'client-A')")
echo "      A's fencing token: $A_TOKEN"
client A "SELECT stock FROM inventory WHERE item_id = 1"

say "B asks for the lock while A holds it: refused (NULL)"
client B "SELECT coalesce(fenced_lock_try_acquire('inventory:1', '${TTL} seconds', 'client-B')::text, 'NULL (A holds it)')"

say "A stalls (a GC pause, a stopped VM) longer than its lease..."
sleep "$TTL.3"
client observer "SELECT name, holder, live FROM fenced_lock_leases"

say "B takes over: a larger token, reads 10, sells one (writes 9), releases"
B_TOKEN=$(psql_ -d demo -At -c "SELECT fenced_lock_try_acquire('inventory:1', '${TTL} seconds', 'client-B')")
echo "      B's fencing token: $B_TOKEN (> $A_TOKEN)"
client B "SELECT stock FROM inventory WHERE item_id = 1"
client B "UPDATE inventory SET stock = 9, fence_token = $B_TOKEN WHERE item_id = 1"
client B "SELECT fenced_lock_release('inventory:1', $B_TOKEN)"

say "A wakes up and writes what it computed before the pause (10 - 1 = 9) with its old token"
client A "UPDATE inventory SET stock = 9, fence_token = $A_TOKEN WHERE item_id = 1"
echo "      ^ rejected by the database itself; the stock is unchanged:"
client observer "SELECT stock FROM inventory WHERE item_id = 1"

say "A does the right thing: re-acquire, re-read, sell, release"
A2_TOKEN=$(psql_ -d demo -At -c "SELECT fenced_lock_try_acquire('inventory:1', '${TTL} seconds', 'client-A')")
echo "      A's new fencing token: $A2_TOKEN"
client A "SELECT stock FROM inventory WHERE item_id = 1"
client A "UPDATE inventory SET stock = 8, fence_token = $A2_TOKEN WHERE item_id = 1"
client A "SELECT fenced_lock_release('inventory:1', $A2_TOKEN)"

say "Result"
STOCK=$(psql_ -d demo -At -c "SELECT stock FROM inventory WHERE item_id = 1")
echo "      stock = $STOCK  (two sales, none lost; without fencing A's late write would have left 9)"
[ "$STOCK" = 8 ]

say "The server keeps running on 127.0.0.1:$PORT (database demo). Stop it with:"
echo "      scripts/cluster.sh stop $DIR"
