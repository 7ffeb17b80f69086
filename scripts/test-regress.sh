#!/usr/bin/env bash
# Run the pg_regress suite (tests/pg_regress) against a scratch cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${FL_REGRESS_DIR:-/tmp/fenced_lock_tests/regress}
PORT=${FL_REGRESS_PORT:-5490}
PGXS=/usr/lib/postgresql/15/lib/pgxs/src/test
OUT=$DIR/out

rm -rf "$DIR"
scripts/cluster.sh start "$DIR" "$PORT"
trap 'scripts/cluster.sh stop "$DIR"' EXIT
psql -X -q -h 127.0.0.1 -p "$PORT" -U postgres -c "CREATE DATABASE fl_regress"
mkdir -p "$OUT"
tests=$(grep -v '^#' tests/pg_regress/schedule)
if ! "$PGXS/regress/pg_regress" --use-existing --host=127.0.0.1 --port="$PORT" --user=postgres \
      --dbname=fl_regress --bindir=/usr/lib/postgresql/15/bin \
      --inputdir=tests/pg_regress --outputdir="$OUT" $tests; then
  cat "$OUT/regression.diffs" 2>/dev/null | head -200
  exit 1
fi
