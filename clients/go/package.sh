#!/usr/bin/env bash
# clients/go/package.sh OUTDIR: the Go client as a module in the module
# proxy's layout, under OUTDIR/goproxy:
#   OUTDIR/goproxy/github.com/fenced-lock/fenced_lock/clients/go/@v/{list,vX.Y.Z.info,vX.Y.Z.mod,vX.Y.Z.zip}
# the zip holding every file of the module under MODULE@vX.Y.Z/. Then it
# checks the package as a user would get it: a scratch module requires it
# through GOPROXY=file://OUTDIR/goproxy, into an empty module cache, and
# builds (offline: pgx and the rest come from Debian's /usr/share/gocode).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 1 ] || { echo "usage: clients/go/package.sh OUTDIR" >&2; exit 2; }
mkdir -p "$1"
out=$(cd "$1" && pwd)
module=$(sed -n 's/^module[[:space:]]\{1,\}//p' "$here/go.mod")
version=v$(sed -n 's/^const Version = "\(.*\)"$/\1/p' "$here/locker.go")
[ "$version" != v ] || { echo "package.sh: no Version in locker.go" >&2; exit 1; }

files=()
if git -C "$here" rev-parse --git-dir >/dev/null 2>&1; then
  while IFS= read -r -d '' f; do files+=("$f"); done < <(git -C "$here" ls-files -z)
  when=$(git -C "$here" log -1 --format=%cI -- . 2>/dev/null || true)
else # an unpacked source tree: everything but the build directory
  while IFS= read -r -d '' f; do files+=("${f#./}"); done < <(cd "$here" && find . -path ./.build -prune -o -type f -print0)
fi
when=${when:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}
license=$(cd "$here/../.." && pwd)/LICENSE

# shellcheck source=build-env.sh
source "$here/build-env.sh"
fl_go_env
rm -rf "$out/goproxy/$module"
# the packager is a module of its own, with no dependencies
(cd "$here/tools/modzip" && GOFLAGS= go run . -dir "$here" -version "$version" -time "$when" \
   -out "$out/goproxy" -license "$license" "${files[@]}")

scratch=$(mktemp -d)
trap 'GOMODCACHE=$scratch/modcache GOFLAGS= go clean -modcache >/dev/null 2>&1 || true; rm -rf "$scratch"' EXIT
mkdir -p "$scratch/consumer"
{
  echo "module example.com/consumer"
  echo
  echo "go 1.19"
  echo
  echo "require $module $version"
  echo
  grep '^replace ' "$fl_go_build/go.mod.gen"
} >"$scratch/consumer/go.mod"
cat >"$scratch/consumer/main.go" <<'GO'
package main

import (
	"fmt"

	fencedlock "github.com/fenced-lock/fenced_lock/clients/go"
)

func main() {
	_, err := fencedlock.New("postgresql://app@127.0.0.1:5432/app")
	fmt.Println(fencedlock.Version, err)
}
GO
(cd "$scratch/consumer" && GOFLAGS=-mod=mod GOPROXY="file://$out/goproxy" GOMODCACHE="$scratch/modcache" \
   GONOSUMDB='*' GONOSUMCHECK=1 GOSUMDB=off go build -o "$scratch/consumer/consumer" . && "$scratch/consumer/consumer")
echo "package.sh: $module@$version in $out/goproxy (GOPROXY=file://$out/goproxy)"
