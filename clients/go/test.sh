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
# the binary `clients/run go ...` runs, so that the conformance tests after
# this suite do not wait for a build
fl_go_example >/dev/null
# -p 1 / no t.Parallel: the tests look at the server's pg_stat_activity and
# signal child processes, and the machine is shared.
exec go test -count=1 -p 1 -timeout 300s ${FL_GO_TEST_RUN:+-run "$FL_GO_TEST_RUN"} -v ./... 2>&1
