#!/usr/bin/env bash
# clients/rust/test.sh [FILTER...]: fetch the crates (from crates.io, once),
# build, and run the Rust client's unit tests and its suite against FL_DSN (a
# superuser postgresql:// URL of database postgres). The suite works in a
# database of its own, fl_client_rust, which it creates and drops.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${FL_DSN:?FL_DSN must be a superuser postgresql:// URL of database postgres}"
command -v cargo >/dev/null || { echo "clients/rust: cargo is needed (scripts/prereqs.sh installs Rust)" >&2; exit 1; }
cd "$here"
export CARGO_TARGET_DIR="$here/target"
cargo fetch --locked --quiet
# The suite runs the examples as child processes: built first, in the same
# (debug) profile as the suite, so the library is compiled once.
cargo build --locked --quiet --examples
cargo test --locked --quiet --lib
cargo test --locked --quiet --doc
export FL_EXAMPLES_DIR="$CARGO_TARGET_DIR/debug/examples"
# A bound on the whole run; every test has its own, much shorter one.
timeout --kill-after=10 600 cargo test --locked --quiet --test suite -- "$@"
