#!/bin/sh
# Install fenced_lock @VERSION@ into PostgreSQL @MAJOR@ (no Rust needed):
#   ./install.sh [/path/to/pg_config]                       the server pg_config describes
#   ./install.sh --pkglibdir DIR --sharedir DIR             a server without pg_config
# Run it as a user that may write those directories, then in each database:
#   CREATE EXTENSION fenced_lock;        (or ALTER EXTENSION fenced_lock UPDATE;)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = --pkglibdir ]; then
  pkglibdir=${2:?--pkglibdir DIR}; [ "${3:-}" = --sharedir ] || { echo "usage: $0 --pkglibdir DIR --sharedir DIR" >&2; exit 2; }
  sharedir=${4:?--sharedir DIR}
else
  pg_config=${1:-pg_config}
  version=$("$pg_config" --version)
  case "$version" in
    "PostgreSQL @MAJOR@."*|"PostgreSQL @MAJOR@beta"*|"PostgreSQL @MAJOR@rc"*) ;;
    *) echo "$0: this package is for PostgreSQL @MAJOR@; $pg_config says: $version" >&2; exit 1 ;;
  esac
  pkglibdir=$("$pg_config" --pkglibdir)
  sharedir=$("$pg_config" --sharedir)
fi
install -m 0755 "$here/lib/fenced_lock.so" "$pkglibdir/fenced_lock.so"
install -m 0644 "$here"/extension/* "$sharedir/extension/"
echo "fenced_lock @VERSION@ installed into $pkglibdir and $sharedir/extension"
echo "next, in each database: CREATE EXTENSION fenced_lock;  (or ALTER EXTENSION fenced_lock UPDATE;)"
