#!/usr/bin/env bash
# `make bench`: fenced_lock beside its baselines and peers, printed as Markdown
# with the speed targets, and written to bench/results/latest.{md,json} with
# the charts latest.png and latest_e2e.png. About 35 minutes; see bench/README.md.
# FL_BENCH_SMOKE=1 (`make bench-smoke`): every code path once with tiny counts,
# about a minute; fails only if a script breaks, never on timings.
# FL_BENCH_SECTIONS="pairs waiting": only these sections (the report then
# notes the others as missing and exits non-zero).
set -euo pipefail
cd "$(dirname "$0")/.."
# PG_BINDIR: the PostgreSQL 15 whose server, pgbench and psql the bench runs
# (default Debian's); bench/servers.sh and benchlib.py read it too.
export PG_BINDIR=${PG_BINDIR:-/usr/lib/postgresql/15/bin}
export PATH=$PG_BINDIR:$PATH
PY=${PYTHON:-/usr/bin/python3}
export FL_BENCH_WORK=/tmp/fenced_lock_tests/bench_work

# The compiled client every pair and waiting figure comes from; cargo does
# nothing when it is up to date (a fresh clone builds it once, ~2 min).
cargo build --release --locked --quiet --manifest-path bench/client/Cargo.toml --target-dir bench/client/target

rm -rf "$FL_BENCH_WORK" && mkdir -p "$FL_BENCH_WORK"
trap 'bash bench/servers.sh stop all' EXIT
trap 'exit 130' INT TERM
bash bench/servers.sh start pg
$PY bench/meta.py

for section in ${FL_BENCH_SECTIONS:-pairs recipes guarded e2e scale waiting instructions}; do
  $PY bench/$section.py
done
$PY bench/report.py
