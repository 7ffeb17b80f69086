#!/usr/bin/env bash
# `make bench`: the SPEC §9 comparison tables, printed as Markdown and written
# to bench/results/latest.{md,png,json}. About 15 minutes; see bench/README.md.
# FL_BENCH_SMOKE=1 (`make bench-smoke`): every script once with tiny counts,
# under a minute; fails only if a script breaks, never on timings.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/lib/postgresql/15/bin:$PATH
PY=${PYTHON:-/usr/bin/python3}
export FL_BENCH_WORK=/tmp/fenced_lock_tests/bench_work

rm -rf "$FL_BENCH_WORK" && mkdir -p "$FL_BENCH_WORK"
trap 'bash bench/servers.sh stop all' EXIT
trap 'exit 130' INT TERM
bash bench/servers.sh start pg
$PY bench/meta.py

for section in pairs guarded peers scale waiting; do
  $PY bench/$section.py
done
$PY bench/report.py
