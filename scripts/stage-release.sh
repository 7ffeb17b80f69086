#!/usr/bin/env bash
# Build a released version of fenced_lock from git and lay out its files (the
# .so, control file and SQL scripts) under OUTDIR, as `cargo pgrx package`
# does, for the upgrade test:
#   scripts/stage-release.sh 0.1.0|0.2.0 OUTDIR [PG_CONFIG]
# The version's commit is its tag vX.Y.Z; a clone without tags falls back to
# the commits recorded below. Skipped when OUTDIR already holds that commit.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: stage-release.sh VERSION OUTDIR [PG_CONFIG]}
out=${2:?usage: stage-release.sh VERSION OUTDIR [PG_CONFIG]}
pg_config=${3:-/usr/bin/pg_config}

declare -A released=([0.1.0]=e50d1baed43f39595b458e3c865efd08849d0792
                      [0.2.0]=ff2b681d93a00d3aaf7a8e6dcb4d7ef324869798)
commit=$(git rev-parse --verify -q "v$version^{commit}" || echo "${released[$version]:?unknown version $version}")
if [ "$(cat "$out/.commit" 2>/dev/null)" = "$commit" ]; then
  exit 0
fi

src=$(mktemp -d /tmp/fenced_lock-src-XXXXXX)
trap 'rm -rf "$src"' EXIT
git archive "$commit" | tar -x -C "$src"
rm -rf "$out"
# The old sources build with today's dependencies' compiled artifacts where
# they match: one target directory for every old version.
(cd "$src" && CARGO_TARGET_DIR="$PWD/../fenced_lock-old-target" cargo pgrx package --debug \
   --pg-config "$pg_config" --out-dir "$out" >"$src/build.log" 2>&1) || { tail -30 "$src/build.log"; exit 1; }
echo "$commit" >"$out/.commit"
