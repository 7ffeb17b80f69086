#!/usr/bin/env bash
# Install the toolchains the client libraries (clients/) build and test
# with, skipping what is there. Debian bookworm, as root. Idempotent.
# Node.js and npm come with the machine; npm and crates.io packages are
# fetched by each client's own build.
set -euo pipefail
packages=(default-jdk-headless libpostgresql-jdbc-java junit5 libhikaricp-java
          golang-go golang-github-jackc-pgx-v4-dev
          python3-psycopg python3-psycopg-pool python3-build python3-setuptools python3-wheel python3-pytest python3-pytest-xdist
          nftables util-linux)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v node >/dev/null && command -v npm >/dev/null || { echo "prereqs-clients: node and npm are needed" >&2; exit 1; }
