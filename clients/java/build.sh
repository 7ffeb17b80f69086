#!/usr/bin/env bash
# Compiles the Java client into build/ when a source is newer than the last build:
#   build/classes       the library (package io.github.fencedlock)
#   build/examples      the conformance examples (hold, inventory)
#   build/test-classes  the JUnit 5 suite (only with --tests)
# javac only, against Debian's PgJDBC and JUnit jars: nothing is downloaded. Output goes to
# stderr, so that run-example's stdout stays JSON lines. Several run-example processes may start
# at once; a lock makes them build once.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
VERSION=0.3.0
PGJDBC=${PGJDBC:-/usr/share/java/postgresql.jar}
JUNIT=${JUNIT:-/usr/share/java/junit-platform-console-standalone.jar}
HIKARI=${HIKARI:-/usr/share/java/HikariCP.jar}
SLF4J=${SLF4J:-/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-nop.jar}
tests=false
[ "${1:-}" = --tests ] && tests=true

for tool in javac jar; do
  command -v $tool >/dev/null || { echo "build.sh: $tool not found (apt-get install default-jdk-headless)" >&2; exit 1; }
done
[ -f "$PGJDBC" ] || { echo "build.sh: $PGJDBC not found (apt-get install libpostgresql-jdbc-java)" >&2; exit 1; }

mkdir -p build
exec 9>build/.lock
flock 9

stale() { # stale STAMP DIR...: a source under DIR is newer than STAMP, or STAMP is missing
  local stamp=$1; shift
  [ ! -f "$stamp" ] || [ -n "$(find "$@" -name '*.java' -newer "$stamp" -print -quit)" ] || [ build.sh -nt "$stamp" ]
}

compile() { # compile RELEASE OUT CLASSPATH SRCDIR...
  local release=$1 out=$2 cp=$3; shift 3
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  javac --release "$release" -encoding UTF-8 -Xlint:all -Werror -d "$out.tmp" -cp "$cp" \
    $(find "$@" -name '*.java' | sort) >&2
  rm -rf "$out"; mv "$out.tmp" "$out"
}

if stale build/.classes src/main; then
  echo "build.sh: compiling the library (fenced-lock $VERSION)" >&2
  compile 11 build/classes "$PGJDBC" src/main/java  # the library runs on Java 11 and later
  touch build/.classes
  rm -f build/.examples build/.tests
fi
if stale build/.examples src/examples; then
  compile 17 build/examples "build/classes:$PGJDBC" src/examples/java
  touch build/.examples
fi
if $tests && stale build/.tests src/test; then
  [ -f "$JUNIT" ] || { echo "build.sh: $JUNIT not found (apt-get install junit5)" >&2; exit 1; }
  echo "build.sh: compiling the tests" >&2
  compile 17 build/test-classes "build/classes:build/examples:$PGJDBC:$JUNIT:$HIKARI:$SLF4J" src/test/java
  cp -r src/test/resources/. build/test-classes/ 2>/dev/null || true
  touch build/.tests
fi
