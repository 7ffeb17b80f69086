#!/usr/bin/env bash
# clients/node/test.sh: the Node client's suite (node --test on the compiled
# tests) against the server named by FL_DSN, a superuser postgresql:// URL
# of database postgres. It works in a database of its own, fl_client_node,
# created fresh (with CREATE EXTENSION fenced_lock, the guarded tables and
# its roles) and dropped at the end.
set -euo pipefail
cd "$(dirname "$0")"
: "${FL_DSN:?FL_DSN must be a superuser postgresql:// URL of database postgres}"
./build.sh
node build/test/db.js setup
trap 'node build/test/db.js teardown || true' EXIT
# One file at a time: several tests read pg_stat_activity of the suite's
# database and must see only their own connections. Every test has its own
# timeout, --test-timeout bounds a file that hangs, and --test-force-exit ends
# a file whose failed test left a lease (and its keepalive) behind.
node --test --test-reporter=spec --test-concurrency=1 --test-timeout=120000 --test-force-exit build/test/*.test.js
