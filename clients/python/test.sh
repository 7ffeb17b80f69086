#!/usr/bin/env bash
# clients/python/test.sh [PYTEST ARGS...]: the Python client's suite, against
# the server named by FL_DSN (a superuser postgresql:// URL of database
# postgres); the suite works in databases of its own, one per pytest-xdist
# worker (fl_client_python_gw0, ...; fl_client_python when run with -n 0).
# Installs what it needs from Debian if missing (nothing is downloaded from
# anywhere else), builds the wheel and the sdist, and runs the suite, and the
# examples it drives, on the wheel as installed (unpacked), not on src/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${FL_DSN:?FL_DSN must be a superuser postgresql:// URL of database postgres}"
PYTHON=/usr/bin/python3

packages=(python3 python3-psycopg python3-psycopg-pool python3-pytest python3-pytest-xdist python3-build
          python3-setuptools python3-wheel)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then echo "test.sh: missing Debian packages: ${missing[*]} (run as root to install)" >&2; exit 1; fi
  echo "test.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bash "$here/package.sh" "$work/dist" >/dev/null
"$PYTHON" -m zipfile -e "$work/dist/fenced_lock-0.3.0-py3-none-any.whl" "$work/site"
export FENCED_LOCK_PYTHONPATH="$work/site"   # run-example: the examples use the wheel too
export PYTHONDONTWRITEBYTECODE=1
cd "$here"
# Four workers (pytest-xdist): most tests sleep through ttls, so they overlap
# well even on two cores. `test.sh -n 0` runs them one after the other.
PYTHONPATH="$work/site" "$PYTHON" -m pytest -q -p no:cacheprovider -n 4 tests "$@"
