#!/usr/bin/env bash
# The soak (tests/soak/README.md): workers run the inventory job against a
# scratch PostgreSQL on 127.0.0.1:5590 while kill -9 of clients and of the
# server, SIGSTOP of holders, partitions of clients and clock steps on
# clients are mixed at random; then the independent checker judges the run.
#   scripts/soak.sh [DURATION]        DURATION: 90s, 3m, 1h (default $SOAK_DURATION, else 3m)
# Extra arguments go to tests/soak/run.py (--workers, --items, --seed, --nemeses).
# Runs as root (iptables for the partitions; the server runs as `postgres`).
# Binaries: $FL_PG_BINDIR, else Debian's PostgreSQL 15. Exit status: the
# checker's (0: no violation).
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-${SOAK_DURATION:-3m}}
[ $# -gt 0 ] && shift
exec "${PYTHON:-/usr/bin/python3}" tests/soak/run.py --duration "$duration" "$@"
