#!/usr/bin/env bash
# clients/go/test.sh: the Go client's suite (go test) against the server
# named by FL_DSN, a superuser postgresql:// URL of database postgres. The
# suite creates and drops its own database, fl_client_go.
# Installs what it builds with (Debian's golang-go and pgx v4; nothing is
# downloaded from the Go module proxy), builds offline, runs every test.
#   FL_GO_TEST_RUN=REGEX   run only the tests matching it (go test -run)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
: "${FL_DSN:?FL_DSN must name the server: a superuser postgresql:// URL of database postgres}"

missing=()
for p in golang-go golang-github-jackc-pgx-v4-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# shellcheck source=build-env.sh
source "$here/build-env.sh"
fl_go_env
go version
go vet ./...
go build ./...
# the binary `clients/run go ...` runs, built once: the suite runs it too,
# and the conformance tests after this suite do not wait for a build
FL_GO_EXAMPLE=$(fl_go_example)
export FL_GO_EXAMPLE
# Four tests at a time (t.Parallel; each has names, rows and connections of
# its own): most of them wait on the server or on the clock, not the CPU.
exec go test -count=1 -p 1 -parallel 4 -timeout 300s ${FL_GO_TEST_RUN:+-run "$FL_GO_TEST_RUN"} -v ./... 2>&1
