#!/usr/bin/env bash
# clients/rust/package.sh OUTDIR: the crate fenced-lock-VERSION.crate
# (`cargo package`, which also builds it from the packaged files) into OUTDIR.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: clients/rust/package.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$here"
export CARGO_TARGET_DIR="$here/target"
# --allow-dirty: the package is what is on disk (a build may run before a commit).
cargo package --locked --quiet --allow-dirty
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
cp "$CARGO_TARGET_DIR/package/fenced-lock-$version.crate" "$out/"
echo "$out/fenced-lock-$version.crate"
