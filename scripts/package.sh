#!/usr/bin/env bash
# `make package`: for each PostgreSQL major given (default: all), build the
# extension and write, under target/packages/:
#   postgresql-NN-fenced-lock_<version>-1_amd64.deb   Debian layout (/usr/lib/postgresql/NN/...)
#   fenced_lock-<version>-pgNN-linux-x86_64.tar.gz     any PostgreSQL NN: ./install.sh [pg_config]
# Neither needs Rust to install. scripts/test-package.sh installs each into a
# clean server of its major and runs the regress suite against it.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
out=${FL_PACKAGE_DIR:-$PWD/target/packages}
majors=("$@"); [ ${#majors[@]} -gt 0 ] || majors=(13 14 15 16 17 18)
mkdir -p "$out"

for major in "${majors[@]}"; do
  [ "$major" = 15 ] || bash scripts/pg-majors.sh "$major" >/dev/null
  eval "$(bash scripts/pg-env.sh "$major")"
  stage=target/package-stage/pg$major
  rm -rf "$stage"; mkdir -p "$stage"
  cargo pgrx package --pg-config "$PG_CONFIG" --no-default-features --features "pg$major" \
    --out-dir "$stage/built" >"$stage/build.log" 2>&1 || { tail -30 "$stage/build.log"; exit 1; }
  so=$(find "$stage/built" -name fenced_lock.so)
  strip --strip-unneeded "$so"   # debug symbols stay in the build tree
  ext=$(dirname "$(find "$stage/built" -name fenced_lock.control)")

  # Debian package, named like Debian's own extension packages.
  deb=$stage/deb
  install -D -m 0644 "$so" "$deb/usr/lib/postgresql/$major/lib/fenced_lock.so"
  install -d "$deb/usr/share/postgresql/$major/extension" "$deb/usr/share/doc/postgresql-$major-fenced-lock" "$deb/DEBIAN"
  install -m 0644 "$ext"/fenced_lock* "$deb/usr/share/postgresql/$major/extension/"
  install -m 0644 LICENSE "$deb/usr/share/doc/postgresql-$major-fenced-lock/copyright"
  cat >"$deb/DEBIAN/control" <<EOF
Package: postgresql-$major-fenced-lock
Version: $version-1
Architecture: amd64
Maintainer: fenced_lock developers <fenced-lock@localhost>
Depends: postgresql-$major, libc6 (>= 2.28)
Section: database
Priority: optional
Homepage: https://github.com/fenced-lock/fenced_lock
Description: leased named locks with fencing tokens for PostgreSQL $major
 fenced_lock hands out leased named locks with a fencing token that only
 grows, and a guard trigger that makes PostgreSQL itself reject writes
 from a holder that lost its lease. After installing, run
 CREATE EXTENSION fenced_lock (or ALTER EXTENSION fenced_lock UPDATE).
EOF
  dpkg-deb --build --root-owner-group -Zxz "$deb" "$out/postgresql-$major-fenced-lock_${version}-1_amd64.deb" >/dev/null

  # Tarball with its own install step.
  name=fenced_lock-$version-pg$major-linux-x86_64
  tar_root=$stage/tar/$name
  install -D -m 0644 "$so" "$tar_root/lib/fenced_lock.so"
  install -d "$tar_root/extension"
  install -m 0644 "$ext"/fenced_lock* "$tar_root/extension/"
  install -m 0644 LICENSE "$tar_root/LICENSE"
  sed "s/@MAJOR@/$major/g; s/@VERSION@/$version/g" scripts/package-install.sh >"$tar_root/install.sh"
  chmod 0755 "$tar_root/install.sh"
  tar -C "$stage/tar" -czf "$out/$name.tar.gz" "$name"
  echo "pg$major: $out/postgresql-$major-fenced-lock_${version}-1_amd64.deb, $out/$name.tar.gz"
done
