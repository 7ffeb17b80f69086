#!/usr/bin/env bash
# clients/node/build.sh: install the dependencies (npm ci, from the committed
# package-lock.json) and compile (tsc: src -> dist, examples and tests ->
# build), each only when out of date. Everything it says goes to stderr, so
# that run-example's stdout carries JSON lines only. Safe to run from several
# processes at once (the conformance test starts examples in parallel).
set -euo pipefail
cd "$(dirname "$0")"
command -v node >/dev/null && command -v npm >/dev/null || { echo "clients/node: node and npm are needed" >&2; exit 1; }
mkdir -p build
exec 9>build/.lock
flock 9

sum=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f node_modules/.fl-lock-sum ] || [ "$(cat node_modules/.fl-lock-sum)" != "$sum" ]; then
  echo "clients/node: npm ci" >&2
  npm ci --no-audit --no-fund --loglevel=error >&2
  echo "$sum" > node_modules/.fl-lock-sum
fi

stamp=build/.stamp
if [ ! -f "$stamp" ] || [ ! -f dist/index.js ] ||
   [ -n "$(find src examples test package.json tsconfig.json tsconfig.test.json node_modules/.fl-lock-sum -newer "$stamp" -print -quit)" ]; then
  echo "clients/node: tsc" >&2
  touch build/.stamp.new   # sources changed while compiling stay newer than the stamp
  rm -rf dist build/examples build/test
  node_modules/.bin/tsc -p tsconfig.json >&2
  node_modules/.bin/tsc -p tsconfig.test.json >&2
  mv build/.stamp.new "$stamp"
fi
