#!/usr/bin/env bash
# clients/node/package.sh OUTDIR: build the npm package (fenced-lock, compiled
# JavaScript with its .d.ts types, source maps and the TypeScript sources they
# point to) into OUTDIR/fenced-lock-VERSION.tgz, with `npm pack`.
set -euo pipefail
out=${1:?usage: clients/node/package.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
"$here/build.sh"
cd "$here"
# The package carries the repository's licence; it lives once, at the top.
cp ../../LICENSE LICENSE
trap 'rm -f "$here/LICENSE"' EXIT
name=$(npm pack --silent --pack-destination "$out")
echo "$out/$name"
