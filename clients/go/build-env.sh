# Sourced by test.sh, run-example and package.sh: an offline Go build of this
# module against the Debian packages under /usr/share/gocode.
#
# The Go module proxy is not reachable here, so the build reads an alternate
# go.mod (.build/go.mod, made from go.mod plus `replace` lines) that points
# every module the build needs at its Debian source tree, and every module
# that only appears in their go.mod files (test and logging dependencies of
# pgx) at an empty stub. go.mod itself stays as users of the module see it.
# The replacements live only in the generated file, so nothing committed
# names a path outside the repository.
fl_go_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fl_go_build=$fl_go_here/.build
GOCODE=${GOCODE:-/usr/share/gocode/src}
# Modules whose packages the library, its tests and examples import.
fl_go_needed=(
  github.com/jackc/pgx/v4 github.com/jackc/pgconn github.com/jackc/pgproto3/v2
  github.com/jackc/pgtype github.com/jackc/pgio github.com/jackc/chunkreader/v2
  github.com/jackc/pgpassfile github.com/jackc/pgservicefile github.com/jackc/puddle
  golang.org/x/crypto golang.org/x/text
)

fl_go_modfile() {
  mkdir -p "$fl_go_build/stub"
  local tmp=$fl_go_build/go.mod.tmp m dep
  declare -A needed=()
  for m in "${fl_go_needed[@]}"; do
    needed[$m]=1
    if [ ! -f "$GOCODE/$m/go.mod" ]; then
      echo "build-env: $GOCODE/$m/go.mod is missing (apt-get install golang-github-jackc-pgx-v4-dev)" >&2
      return 1
    fi
  done
  {
    cat "$fl_go_here/go.mod"
    echo
    for m in "${fl_go_needed[@]}"; do echo "replace $m => $GOCODE/$m"; done
    for m in "${fl_go_needed[@]}"; do
      # the requirements of each needed module, from its go.mod
      awk '/^require[ \t]*\(/ {inb=1; next}
           inb && /^\)/ {inb=0; next}
           inb && NF >= 2 && $1 !~ /^\/\// {print $1; next}
           /^require[ \t]+[^( \t]/ {print $2}' "$GOCODE/$m/go.mod"
    done | tr -d '"' | sort -u | while read -r dep; do
      [ -n "${needed[$dep]:-}" ] && continue
      mkdir -p "$fl_go_build/stub/$dep"
      echo "module $dep" >"$fl_go_build/stub/$dep/go.mod"
      echo "replace $dep => $fl_go_build/stub/$dep"
    done
  } >"$tmp"
  # The go command rewrites .build/go.mod (it raises versions to what the
  # Debian go.mod files ask for), so compare with what was generated last.
  if [ -f "$fl_go_build/go.mod" ] && cmp -s "$tmp" "$fl_go_build/go.mod.gen"; then
    rm -f "$tmp"
  else
    cp "$tmp" "$fl_go_build/go.mod.gen" && mv "$tmp" "$fl_go_build/go.mod"
  fi
}

fl_go_env() {
  fl_go_modfile || return 1
  export GO111MODULE=on GOPROXY=off GOSUMDB=off GONOSUMDB='*' GOFLAGS="-mod=mod -modfile=$fl_go_build/go.mod"
  export GOCACHE=${FL_GOCACHE:-$fl_go_build/cache} GOMODCACHE=$fl_go_build/modcache GOPATH=$fl_go_build/gopath
  export GOTOOLCHAIN=local
  # no user config (GOENV), no C compiler needed (CGO_ENABLED)
  export GOENV=off CGO_ENABLED=0
}

# fl_go_example: the path of the conformance examples' binary, built first
# if a source changed since. `clients/run go ...` may run many at once:
# one builds, the others wait for it.
fl_go_example() {
  local bin=$fl_go_build/bin/fenced-lock-example
  if fl_go_example_stale "$bin"; then
    mkdir -p "$fl_go_build/bin"
    (
      flock 9
      if fl_go_example_stale "$bin"; then
        fl_go_env
        # Without -trimpath: it would compile pgx and the library anew, apart
        # from what go build and go test have in the cache.
        cd "$fl_go_here" && go build -o "$bin.tmp" ./cmd/fenced-lock-example >&2
        mv -f "$bin.tmp" "$bin"
      fi
    ) 9>"$fl_go_build/build.lock" || return 1
  fi
  echo "$bin"
}

fl_go_example_stale() {
  [ ! -x "$1" ] && return 0
  [ -n "$(find "$fl_go_here" \( -path "$fl_go_build" -o -path "$fl_go_here/tools" \) -prune -o \
           \( -name '*.go' -o -name go.mod -o -name build-env.sh \) -newer "$1" -print -quit)" ]
}
