#!/usr/bin/env bash
# package.sh OUTDIR: the Java client's package, built with javac, javadoc and jar only (no
# Maven: its plugins cannot be downloaded here):
#   fenced-lock-VERSION.jar          the library, package io.github.fencedlock (Java 11 or later)
#   fenced-lock-VERSION-sources.jar  its sources
#   fenced-lock-VERSION-javadoc.jar  its API documentation
#   fenced-lock-VERSION.pom          coordinates and the one dependency (PgJDBC), for
#                                    `mvn install:install-file` or a repository upload
# With SOURCE_DATE_EPOCH set, the jars are reproducible.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: package.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
VERSION=$(sed -n 's/^VERSION=\(.*\)$/\1/p' "$here/build.sh")
PGJDBC=${PGJDBC:-/usr/share/java/postgresql.jar}
[ -f "$PGJDBC" ] || { echo "package.sh: $PGJDBC not found (apt-get install libpostgresql-jdbc-java)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/classes/META-INF/maven/io.github.fencedlock/fenced-lock" "$work/sources" "$work/javadoc"

javac --release 11 -encoding UTF-8 -Xlint:all -Werror -d "$work/classes" -cp "$PGJDBC" \
  $(find "$here/src/main/java" -name '*.java' | sort)

cat > "$work/pom.xml" <<POM
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 https://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.github.fencedlock</groupId>
  <artifactId>fenced-lock</artifactId>
  <version>$VERSION</version>
  <packaging>jar</packaging>
  <name>fenced-lock</name>
  <description>Java client of fenced_lock: leased named locks in PostgreSQL with fencing tokens, kept alive in the background, released by try-with-resources, retried on a stale token</description>
  <licenses>
    <license>
      <name>PostgreSQL License</name>
      <url>https://opensource.org/licenses/PostgreSQL</url>
    </license>
  </licenses>
  <properties>
    <maven.compiler.release>11</maven.compiler.release>
  </properties>
  <dependencies>
    <dependency>
      <groupId>org.postgresql</groupId>
      <artifactId>postgresql</artifactId>
      <version>[42.5.0,)</version>
    </dependency>
  </dependencies>
</project>
POM
cp "$work/pom.xml" "$work/classes/META-INF/maven/io.github.fencedlock/fenced-lock/pom.xml"
printf 'groupId=io.github.fencedlock\nartifactId=fenced-lock\nversion=%s\n' "$VERSION" \
  > "$work/classes/META-INF/maven/io.github.fencedlock/fenced-lock/pom.properties"
[ -f "$here/../../LICENSE" ] && cp "$here/../../LICENSE" "$work/classes/META-INF/LICENSE"

cat > "$work/MANIFEST.MF" <<MF
Automatic-Module-Name: io.github.fencedlock
Implementation-Title: fenced-lock
Implementation-Version: $VERSION
Specification-Version: $VERSION
MF

date_opt=()
if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
  date_opt=(--date="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)")
fi
jar=$out/fenced-lock-$VERSION.jar
rm -f "$jar" "$out/fenced-lock-$VERSION-sources.jar" "$out/fenced-lock-$VERSION-javadoc.jar"
jar --create "${date_opt[@]}" --file "$jar" --manifest "$work/MANIFEST.MF" -C "$work/classes" .

cp -r "$here/src/main/java/." "$work/sources/"
jar --create "${date_opt[@]}" --file "$out/fenced-lock-$VERSION-sources.jar" -C "$work/sources" .

javadoc -quiet --release 11 -encoding UTF-8 -Xdoclint:all,-missing -d "$work/javadoc" -cp "$PGJDBC" \
  -sourcepath "$here/src/main/java" -subpackages io.github.fencedlock -exclude io.github.fencedlock.internal \
  -windowtitle "fenced-lock $VERSION" -doctitle "fenced-lock $VERSION" >&2
jar --create "${date_opt[@]}" --file "$out/fenced-lock-$VERSION-javadoc.jar" -C "$work/javadoc" .

cp "$work/pom.xml" "$out/fenced-lock-$VERSION.pom"
echo "package.sh: built $(cd "$out" && ls fenced-lock-"$VERSION"*)" >&2
