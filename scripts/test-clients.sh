#!/usr/bin/env bash
# Run every client library's suite (clients/LANG/test.sh) and the conformance
# examples (tests/clients) against one scratch server with the extension.
#   LANGS="python go" scripts/test-clients.sh     (default: all five)
# The server: 127.0.0.1:${FL_CLIENTS_PORT:-5620}, files under
# ${FL_CLIENTS_DIR:-/tmp/fenced_lock_tests/clients}, binaries from $PG_BINDIR
# (scripts/cluster.sh). Each suite gets FL_DSN, a superuser URL of database
# postgres, and works in a database of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
LANGS=${LANGS:-python rust java go node}
PORT=${FL_CLIENTS_PORT:-5620}
DIR=${FL_CLIENTS_DIR:-/tmp/fenced_lock_tests/clients}
PYTHON=${PYTHON:-/usr/bin/python3}

rm -rf "$DIR"
scripts/cluster.sh start "$DIR" "$PORT"
trap 'scripts/cluster.sh stop "$DIR"' EXIT
export FL_DSN="postgresql://postgres@127.0.0.1:$PORT/postgres"
export FL_CLIENT_LANGS=$LANGS
failed=()
for lang in $LANGS; do
  echo "== clients/$lang"
  start=$(date +%s)
  if ! bash "clients/$lang/test.sh"; then failed+=("$lang"); fi
  echo "== clients/$lang took $(( $(date +%s) - start )) s"
done
if ls tests/clients/test_*.py >/dev/null 2>&1; then
  echo "== conformance examples: $LANGS"
  $PYTHON -m pytest -q -p no:cacheprovider tests/clients || failed+=(conformance)
fi
if [ ${#failed[@]} -gt 0 ]; then echo "client suites failed: ${failed[*]}" >&2; exit 1; fi
echo "client suites passed: $LANGS"
