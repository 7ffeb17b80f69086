#!/usr/bin/env bash
# Install what building and testing fenced_lock needs, skipping what is there.
# Debian bookworm, as root. Idempotent.
set -euo pipefail

packages=(postgresql-15 postgresql-server-dev-15 libclang-dev clang sudo
          python3-psycopg python3-pytest pgbouncer redis-server etcd-server etcd-client patroni
          faketime procps python3-redis python3-matplotlib valgrind linux-perf iptables iproute2
          python3-pytest-xdist
          protobuf-compiler)  # protoc: etcd-client (bench/client) compiles etcd's .proto files
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
  # Debian starts these services on install; the tests start their own.
  for svc in postgresql redis-server etcd pgbouncer patroni; do
    service "$svc" stop >/dev/null 2>&1 || true
  done
  # tests/ha runs its own etcd and Patroni: keep Debian's from starting at boot.
  for svc in etcd patroni; do
    systemctl disable "$svc" >/dev/null 2>&1 || true
  done
fi

if ! cargo pgrx --version 2>/dev/null | grep -q "0.18.1"; then
  echo "installing cargo-pgrx 0.18.1 (about 5 minutes)"
  cargo install cargo-pgrx --version 0.18.1 --locked
fi

if ! grep -qs 'pg15 = "/usr/bin/pg_config"' "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
  cargo pgrx init --pg15 /usr/bin/pg_config
fi
