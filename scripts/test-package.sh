#!/usr/bin/env bash
# Install each package `make package` built into a clean server of its major,
# without Rust or the build tree, and run the pg_regress suite against it:
#   scripts/test-package.sh [13 14 15 16 17 18]
# - 15: the .deb into Debian's PostgreSQL 15 (dpkg -i, as a DBA would); the
#   files it replaced are put back afterwards.
# - every major: the tarball, with its install.sh, into a fresh copy of that
#   major's server from which any fenced_lock files were removed.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
pkgs=${FL_PACKAGE_DIR:-$PWD/target/packages}
work=/tmp/fenced_lock_tests/packages
majors=("$@"); [ ${#majors[@]} -gt 0 ] || majors=(13 14 15 16 17 18)
regress() {  # bindir label
  PG_BINDIR=$1 FL_REGRESS_DIR=$work/regress-$2 FL_REGRESS_PORT=5494 bash scripts/test-regress.sh >"$work/regress-$2.log" 2>&1 \
    || { tail -40 "$work/regress-$2.log"; echo "test-package: regress failed on $2" >&2; exit 1; }
  echo "test-package: $2: $(grep -E 'tests passed' "$work/regress-$2.log" | tr -s ' ')"
}
mkdir -p "$work"

for major in "${majors[@]}"; do
  eval "$(bash scripts/pg-env.sh "$major")"
  export PG_CONFIG PG_REGRESS

  # The tarball into a clean copy of the server. PostgreSQL finds its lib
  # and share directories relative to its binary, so a copy under another
  # prefix (Debian's 15 copied with its /usr layout) is a server of its own.
  server=$work/server-$major
  rm -rf "$server"
  if [ "$major" = 15 ]; then
    mkdir -p "$server/usr/lib/postgresql" "$server/usr/share/postgresql"
    cp -a /usr/lib/postgresql/15 "$server/usr/lib/postgresql/"
    cp -a /usr/share/postgresql/15 "$server/usr/share/postgresql/"
    bindir=$server/usr/lib/postgresql/15/bin pkglib=$server/usr/lib/postgresql/15/lib
    share=$server/usr/share/postgresql/15
  else
    cp -a "$(dirname "$PG_BINDIR")" "$server"
    bindir=$server/bin pkglib=$server/lib/postgresql share=$server/share/postgresql
  fi
  rm -f "$pkglib"/fenced_lock*.so "$share"/extension/fenced_lock*
  rm -rf "$work/fenced_lock-$version-pg$major-linux-x86_64"
  tar -xzf "$pkgs/fenced_lock-$version-pg$major-linux-x86_64.tar.gz" -C "$work"
  "$work/fenced_lock-$version-pg$major-linux-x86_64/install.sh" --pkglibdir "$pkglib" --sharedir "$share" >/dev/null
  chmod -R a+rX "$work"
  regress "$bindir" "pg$major-tarball"

  # The .deb into Debian's PostgreSQL 15.
  if [ "$major" = 15 ]; then
    backup=$work/pg15-backup; rm -rf "$backup"; mkdir -p "$backup"
    cp -a /usr/lib/postgresql/15/lib/fenced_lock.so /usr/share/postgresql/15/extension/fenced_lock* "$backup/" 2>/dev/null || true
    restore() {
      dpkg -r postgresql-15-fenced-lock >/dev/null 2>&1 || true
      cp -a "$backup"/*.so /usr/lib/postgresql/15/lib/ 2>/dev/null || true
      cp -a "$backup"/fenced_lock*.{control,sql} /usr/share/postgresql/15/extension/ 2>/dev/null || true
    }
    trap restore EXIT
    rm -f /usr/lib/postgresql/15/lib/fenced_lock.so /usr/share/postgresql/15/extension/fenced_lock*
    dpkg -i "$pkgs/postgresql-15-fenced-lock_${version}-1_amd64.deb" >/dev/null
    dpkg -L postgresql-15-fenced-lock | grep -q /usr/lib/postgresql/15/lib/fenced_lock.so
    regress /usr/lib/postgresql/15/bin "pg15-deb"
    restore
    trap - EXIT
  fi
done
