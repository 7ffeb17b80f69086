#!/usr/bin/env bash
# Print `export` lines with the paths for building and testing against one
# PostgreSQL major:   eval "$(bash scripts/pg-env.sh 17)"
#   PG_CONFIG             pass to `cargo pgrx install --pg-config`
#   PG_BINDIR             initdb, pg_ctl, postgres of that major (run them as `postgres`)
#   PG_CLIENT_BINDIR      psql, createdb, dropdb: Debian's PG15 clients work against every major
#   PG_REGRESS, PG_ISOLATION_REGRESS   use with --use-existing against a running server
#   PG_FULL_CONFIG, PG_FULL_BINDIR     a whole install of that major (every client tool: pg_dump,
#                         pg_basebackup, pg_upgrade, pgbench) for the Python suites: Debian's for
#                         15, PyPI's for 14+ (none for 13)
# 15 is Debian's; 13, 14, 16, 17, 18 come from scripts/pg-majors.sh (same FL_PG_ROOT).
set -euo pipefail
m=${1:?usage: pg-env.sh 13|14|15|16|17|18}
PG15=/usr/lib/postgresql/15
if [ "$m" = 15 ]; then
  config=/usr/bin/pg_config bindir=$PG15/bin
  regress=$PG15/lib/pgxs/src/test/regress/pg_regress
  isolation=$PG15/lib/pgxs/src/test/isolation/pg_isolation_regress
  full_config=$config full_bindir=$bindir
else
  d=${FL_PG_ROOT:-/opt/fenced_lock-pg}/$m
  [ -x "$d/pg_config" ] || { echo "pg-env.sh: no PostgreSQL $m under $d; run scripts/pg-majors.sh $m" >&2; exit 1; }
  config=$d/pg_config bindir=$d/npm/native/bin
  # Wrappers written by pg-majors.sh: they add --bindir (psql) and, for 17+,
  # LD_LIBRARY_PATH for isolationtester, so nothing else needs exporting.
  regress=$d/bin/pg_regress isolation=$d/bin/pg_isolation_regress
  full_config= full_bindir=
  [ -x "$d/pypi/bin/pg_config" ] && full_config=$d/pypi/bin/pg_config full_bindir=$d/pypi/bin
fi
printf 'export %s=%q\n' PG_CONFIG "$config" PG_BINDIR "$bindir" PG_CLIENT_BINDIR "$PG15/bin" \
  PG_REGRESS "$regress" PG_ISOLATION_REGRESS "$isolation" PG_FULL_CONFIG "$full_config" PG_FULL_BINDIR "$full_bindir"
