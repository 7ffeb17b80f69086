#!/usr/bin/env bash
# Run the pg_isolation_regress specs (tests/isolation) against a scratch cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${FL_ISOLATION_DIR:-/tmp/fenced_lock_tests/isolation}
PORT=${FL_ISOLATION_PORT:-5491}
PGXS=/usr/lib/postgresql/15/lib/pgxs/src/test
OUT=$DIR/out

rm -rf "$DIR"
scripts/cluster.sh start "$DIR" "$PORT"
trap 'scripts/cluster.sh stop "$DIR"' EXIT
psql -X -q -h 127.0.0.1 -p "$PORT" -U postgres -c "CREATE DATABASE fl_isolation"
psql -X -q -h 127.0.0.1 -p "$PORT" -U postgres -d fl_isolation -c "CREATE EXTENSION fenced_lock"
mkdir -p "$OUT"
specs=$(grep -v '^#' tests/isolation/schedule)
if ! "$PGXS/isolation/pg_isolation_regress" --use-existing --host=127.0.0.1 --port="$PORT" --user=postgres \
      --dbname=fl_isolation --inputdir=tests/isolation --outputdir="$OUT" $specs; then
  cat "$OUT/regression.diffs" 2>/dev/null | head -300
  exit 1
fi
