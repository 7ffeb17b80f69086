#!/usr/bin/env bash
# Run the pg_regress suite (tests/pg_regress) against a scratch cluster.
# PostgreSQL comes from $PG_CONFIG (default: pg_config on PATH); PG_REGRESS
# overrides the runner (scripts/pg-env.sh prints both for another major).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${FL_REGRESS_DIR:-/tmp/fenced_lock_tests/regress}
PORT=${FL_REGRESS_PORT:-5490}
PG_CONFIG=$(command -v "${PG_CONFIG:-pg_config}")
export PATH="$(dirname "$PG_CONFIG"):$PATH"   # scripts/cluster.sh asks pg_config too
RUNNER=${PG_REGRESS:-$(dirname "$("$PG_CONFIG" --pgxs)")/../test/regress/pg_regress}
PSQL_DIR=$("$PG_CONFIG" --bindir); [ -x "$PSQL_DIR/psql" ] || PSQL_DIR=$(dirname "$(command -v psql)")
OUT=$DIR/out

rm -rf "$DIR"
scripts/cluster.sh start "$DIR" "$PORT"
trap 'scripts/cluster.sh stop "$DIR"' EXIT
"$PSQL_DIR/psql" -X -q -h 127.0.0.1 -p "$PORT" -U postgres -c "CREATE DATABASE fl_regress"
mkdir -p "$OUT"
tests=$(grep -v '^#' tests/pg_regress/schedule)
if ! "$RUNNER" --use-existing --host=127.0.0.1 --port="$PORT" --user=postgres \
      --dbname=fl_regress --bindir="$PSQL_DIR" \
      --inputdir=tests/pg_regress --outputdir="$OUT" $tests; then
  cat "$OUT/regression.diffs" 2>/dev/null | head -200
  exit 1
fi
