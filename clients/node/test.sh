#!/usr/bin/env bash
# clients/node/test.sh: the Node client's suite (node --test on the compiled
# tests) against the server named by FL_DSN, a superuser postgresql:// URL
# of database postgres. Each test file works in a database of its own,
# fl_client_node_FILE (with CREATE EXTENSION fenced_lock and the guarded
# tables), beside the suite's roles; all are created fresh and dropped at
# the end.
set -euo pipefail
cd "$(dirname "$0")"
: "${FL_DSN:?FL_DSN must be a superuser postgresql:// URL of database postgres}"
./build.sh
node build/test/db.js setup
trap 'node build/test/db.js teardown || true' EXIT
# The files at the same time, each in a process and a database of its own
# (several tests count their database's keepalive connections), the tests of
# one file one after the other. Every test has its own timeout,
# --test-timeout bounds a file that hangs, and --test-force-exit ends a file
# whose failed test left a lease (and its keepalive) behind.
node --test --test-reporter=spec --test-concurrency=6 --test-timeout=60000 --test-force-exit build/test/*.test.js
