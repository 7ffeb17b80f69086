#!/usr/bin/env bash
# clients/python/package.sh OUTDIR: build the Python client's wheel and sdist
# (distribution fenced-lock, import fenced_lock) into OUTDIR, with Debian's
# python3-build and setuptools, offline (--no-isolation: nothing is fetched).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: package.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
PYTHON=${FL_PYTHON:-/usr/bin/python3}
# --no-isolation builds with what is installed: say what is missing plainly.
for m in build setuptools wheel; do
  "$PYTHON" -c "import $m" 2>/dev/null || {
    echo "package.sh: Python module '$m' is missing (Debian: apt-get install python3-$m)" >&2; exit 1; }
done
# Build from a copy, so that the tree is left as it was (no build/ or
# *.egg-info next to the sources).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -C "$here" --exclude=__pycache__ --exclude='*.egg-info' --exclude=build --exclude=dist -cf - . | tar -C "$work" -xf -
"$PYTHON" -m build --no-isolation --sdist --wheel --outdir "$out" "$work" >"$work/build.log" 2>&1 || {
  cat "$work/build.log" >&2; exit 1; }
# setuptools names the sdist fenced-lock-0.3.0.tar.gz before 69, fenced_lock-0.3.0.tar.gz after.
ls "$out"/fenced_lock-0.3.0-py3-none-any.whl "$out"/fenced[-_]lock-0.3.0.tar.gz
