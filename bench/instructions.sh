#!/usr/bin/env bash
# Instructions per operation, counted with callgrind: a count, repeatable
# whatever else the machine does (bench/README.md, "Where targets are not met").
#   bash bench/instructions.sh [ROW...]     (default: every row)
# Each row runs in a single-user PostgreSQL backend (`postgres --single`, one
# statement per transaction) twice, with 30 and with 30+N iterations of its
# statements; the difference of the two totals divided by N is the cost of
# one iteration, with start-up and shutdown taken out. The server binaries
# come from $PG_BINDIR (default Debian's 15), with the fenced_lock installed
# there. N: $FL_INSTR_N (default 500).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PG_BINDIR:-/usr/lib/postgresql/15/bin}
N=${FL_INSTR_N:-500}
WORK=${FL_INSTR_DIR:-/tmp/fenced_lock_tests/instructions}
ROWS=${*:-floor1 pair pair_history_off update_plain update_c_trigger update_guarded}

as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else sudo -u postgres "$@"; fi; }

rm -rf "$WORK" && mkdir -p "$WORK" && chown postgres:postgres "$WORK"
as_postgres "$BIN/initdb" -D "$WORK/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
single() { as_postgres "$BIN/postgres" --single -D "$WORK/data" -c fsync=on -c synchronous_commit=on "$@" postgres; }

# The schema every row needs, made once (single-user mode: a statement a line).
single >/dev/null <<'SQL'
CREATE EXTENSION fenced_lock;
CREATE TABLE floor (name text COLLATE "C" PRIMARY KEY, token bigint NOT NULL);
CREATE SEQUENCE floor_seq;
CREATE TABLE plain (id int PRIMARY KEY, v int NOT NULL, fence_token bigint);
CREATE TABLE ctrig (id int PRIMARY KEY, v int NOT NULL, fence_token bigint);
CREATE TRIGGER noop BEFORE UPDATE ON ctrig FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger();
CREATE TABLE guarded (id int PRIMARY KEY, v int NOT NULL, fence_token bigint);
CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON guarded FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('item:{id}', 'fence_token');
INSERT INTO plain VALUES (1, 0, 1);
INSERT INTO ctrig VALUES (1, 0, 1);
SQL

# Statements of one iteration of each row (each line: one transaction).
iteration() {
  case "$1" in
    floor1) echo "EXECUTE ins;"; echo "EXECUTE del;" ;;
    pair|pair_history_off) echo "EXECUTE acq;"; echo "EXECUTE rel;" ;;
    update_plain|update_c_trigger|update_guarded) echo "EXECUTE upd;" ;;
  esac
}
prologue() {
  case "$1" in
    floor1)
      echo "SET synchronous_commit = off;"
      echo "PREPARE ins AS INSERT INTO floor SELECT 'n', nextval('floor_seq') FROM (SELECT set_config('synchronous_commit', 'on', true)) s;"
      echo "PREPARE del AS DELETE FROM floor WHERE name = 'n';" ;;
    pair) echo "PREPARE acq AS SELECT fenced_lock_try_acquire('pair', '30 s');"
          echo "PREPARE rel AS SELECT fenced_lock_release('pair', currval('fenced_lock_internal.token_seq'));" ;;
    pair_history_off) echo "SET fenced_lock.history_retention = 0;"; prologue pair ;;
    update_plain) echo "PREPARE upd AS UPDATE plain SET v = v + 1, fence_token = 1 WHERE id = 1;" ;;
    update_c_trigger) echo "PREPARE upd AS UPDATE ctrig SET v = v + 1, fence_token = 1 WHERE id = 1;" ;;
    update_guarded)
      # Each run starts over: the lease and row of the run before are gone.
      echo "SELECT fenced_lock_force_release('item:1');"
      echo "ALTER TABLE guarded DISABLE TRIGGER fence;"
      echo "DELETE FROM guarded;"
      echo "ALTER TABLE guarded ENABLE TRIGGER fence;"
      echo "SELECT fenced_lock_try_acquire('item:1', '1 hour');"
      echo "INSERT INTO guarded VALUES (1, 0, currval('fenced_lock_internal.token_seq'));"
      echo "PREPARE upd AS UPDATE guarded SET v = v + 1, fence_token = currval('fenced_lock_internal.token_seq') WHERE id = 1;" ;;
  esac
}

count() {  # row iterations -> total instructions of the backend
  local row=$1 n=$2 out=$WORK/$1.$2.callgrind
  { prologue "$row"; for _ in $(seq "$n"); do iteration "$row"; done; } >"$WORK/$row.$n.sql"
  as_postgres valgrind --tool=callgrind --callgrind-out-file="$out" -q \
    "$BIN/postgres" --single -D "$WORK/data" -c fsync=on postgres <"$WORK/$row.$n.sql" >/dev/null 2>"$WORK/$row.$n.err"
  sed -n 's/^summary: //p' "$out"
}

printf '| row | instructions per iteration |\n|---|---|\n'
for row in $ROWS; do
  base=$(count "$row" 30); more=$(count "$row" $((30 + N)))
  printf '| %s | %d |\n' "$row" $(( (more - base) / N ))
done
