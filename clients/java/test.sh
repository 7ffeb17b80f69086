#!/usr/bin/env bash
# The Java client's suite (JUnit 5) against the server named by FL_DSN, a superuser
# postgresql:// URL of database postgres. The suite works in a database of its own,
# fl_client_java (and roles fl_client_java_*), which it creates and drops.
#   FL_DSN=postgresql://postgres@127.0.0.1:5620/postgres clients/java/test.sh [JUnit selectors...]
# e.g. clients/java/test.sh --select-class io.github.fencedlock.KeepaliveTest
# Installs what it needs from Debian if missing (as root): the JDK, PgJDBC, JUnit 5, HikariCP
# (the pool the pool tests use). Nothing is downloaded from elsewhere.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"

packages=(default-jdk-headless libpostgresql-jdbc-java junit5 libhikaricp-java)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "clients/java: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
: "${FL_DSN:?FL_DSN must be a superuser postgresql:// URL of database postgres}"

bash ./build.sh --tests

cp="build/classes:build/examples:build/test-classes:/usr/share/java/postgresql.jar"
cp="$cp:/usr/share/java/HikariCP.jar:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-nop.jar"
cp="$cp:/usr/share/java/junit-platform-console-standalone.jar"
selectors=("$@")
[ ${#selectors[@]} -gt 0 ] || selectors=(--scan-class-path)
rm -rf build/test-reports

# The suite and every example process it starts run in a process group of their own, killed
# whole at the end: no child outlives the run, even if the suite's JVM dies.
set -m
java -Xmx512m -Dfl.clientdir="$here" -cp "$cp" org.junit.platform.console.ConsoleLauncher \
  --disable-banner --disable-ansi-colors --fail-if-no-tests --details=tree --reports-dir=build/test-reports "${selectors[@]}" &
suite=$!
trap 'kill -KILL -- -$suite 2>/dev/null || true' EXIT INT TERM
rc=0
wait $suite || rc=$?
kill -KILL -- -$suite 2>/dev/null || true
trap - EXIT INT TERM

report=build/test-reports/TEST-junit-jupiter.xml
if [ -f "$report" ]; then
  attr() { sed -n "s/.*<testsuite [^>]*\b$1=\"\([0-9]*\)\".*/\1/p" "$report" | head -1; }
  tests=$(attr tests); failures=$(attr failures); errors=$(attr errors); skipped=$(attr skipped)
  echo "java: $(( tests - failures - errors - skipped )) passed, $(( failures + errors )) failed, $skipped skipped"
fi
exit $rc
