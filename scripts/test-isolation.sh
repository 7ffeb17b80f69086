#!/usr/bin/env bash
# Run the pg_isolation_regress specs (tests/isolation) against a scratch cluster.
# PostgreSQL comes from $PG_CONFIG (default: pg_config on PATH); PG_ISOLATION_REGRESS
# overrides the runner (scripts/pg-env.sh prints both for another major).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${FL_ISOLATION_DIR:-/tmp/fenced_lock_tests/isolation}
PORT=${FL_ISOLATION_PORT:-5491}
PG_CONFIG=$(command -v "${PG_CONFIG:-pg_config}")
export PATH="$(dirname "$PG_CONFIG"):$PATH"   # scripts/cluster.sh asks pg_config too
RUNNER=${PG_ISOLATION_REGRESS:-$(dirname "$("$PG_CONFIG" --pgxs)")/../test/isolation/pg_isolation_regress}
PSQL=$("$PG_CONFIG" --bindir)/psql; [ -x "$PSQL" ] || PSQL=psql
OUT=$DIR/out

rm -rf "$DIR"
scripts/cluster.sh start "$DIR" "$PORT"
trap 'scripts/cluster.sh stop "$DIR"' EXIT
db() { "$PSQL" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres "$@"; }
db -c "CREATE DATABASE fl_isolation"
db -d fl_isolation -c "CREATE EXTENSION fenced_lock"
db -d fl_isolation -f tests/isolation/helpers.sql
mkdir -p "$OUT"
specs=$(grep -v '^#' tests/isolation/schedule)
if ! "$RUNNER" --use-existing --host=127.0.0.1 --port="$PORT" --user=postgres \
      --dbname=fl_isolation --inputdir=tests/isolation --outputdir="$OUT" $specs; then
  cat "$OUT/regression.diffs" 2>/dev/null | head -300
  exit 1
fi
