#!/usr/bin/env bash
# Run a command with one PostgreSQL major's paths in its environment:
#   scripts/with-pg.sh 17 COMMAND [ARGS...]
# Prepares the major first (scripts/pg-majors.sh; 15 is Debian's), then
# exports what scripts/pg-env.sh prints, plus FL_PG_BINDIR for the Python
# suites (the major's whole install: every client tool of that major).
set -euo pipefail
cd "$(dirname "$0")/.."
major=${1:?usage: with-pg.sh MAJOR COMMAND...}
shift
[ "$major" = 15 ] || bash scripts/pg-majors.sh "$major" >/dev/null
eval "$(bash scripts/pg-env.sh "$major")"
export PG_MAJOR=$major PG_CONFIG PG_BINDIR PG_CLIENT_BINDIR PG_REGRESS PG_ISOLATION_REGRESS PG_FULL_CONFIG PG_FULL_BINDIR
export FL_PG_BINDIR=${PG_FULL_BINDIR:-$PG_BINDIR}
# PyPI's builds (14+) need their own lib directory for libpq (tests/harness/cluster.py).
if [ -n "$PG_FULL_BINDIR" ] && [ "$major" != 15 ]; then export FL_PG_LIBDIR=$(dirname "$PG_FULL_BINDIR")/lib; fi
exec "$@"
