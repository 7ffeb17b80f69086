#!/usr/bin/env bash
# Start or stop a scratch PostgreSQL cluster on loopback, run as `postgres`.
#   scripts/cluster.sh start [DIR] [PORT] [extra postgresql.conf lines...]
#   scripts/cluster.sh stop  [DIR]
#   scripts/cluster.sh kill  [DIR]    (kill -9 the postmaster)
# DIR defaults to /tmp/fenced_lock_demo, PORT to 5499. The server binaries come
# from $PG_BINDIR, else from the pg_config on PATH, else Debian's PostgreSQL 15.
set -euo pipefail
BIN=${PG_BINDIR:-$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)}
[ -x "$BIN/initdb" ] || BIN=/usr/lib/postgresql/15/bin
cmd=${1:?start|stop|kill}
DIR=${2:-/tmp/fenced_lock_demo}
PORT=${3:-5499}
shift $(( $# < 3 ? $# : 3 ))

as_postgres() {
  if [ "$(id -un)" = postgres ]; then "$@"; else sudo -u postgres "$@"; fi
}

case "$cmd" in
start)
  mkdir -p "$DIR"
  chown postgres:postgres "$DIR" 2>/dev/null || true
  if [ ! -f "$DIR/data/PG_VERSION" ]; then
    as_postgres "$BIN/initdb" -D "$DIR/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$DIR/initdb.log"
    {
      echo "listen_addresses = '127.0.0.1'"
      echo "port = $PORT"
      echo "unix_socket_directories = '$DIR'"
      echo "max_connections = 200"
      echo "shared_buffers = 128MB"
      echo "log_min_messages = warning"
      echo "fsync = on"
      echo "synchronous_commit = on"
      for line in "$@"; do echo "$line"; done
    } | as_postgres tee -a "$DIR/data/postgresql.conf" >/dev/null
  fi
  if ! as_postgres "$BIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; then
    as_postgres "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 start >/dev/null
  fi
  ;;
stop)
  if [ -f "$DIR/data/PG_VERSION" ]; then
    as_postgres "$BIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null 2>&1 || true
  fi
  ;;
kill)
  pid=$(head -1 "$DIR/data/postmaster.pid")
  kill -9 "$pid"
  ;;
*) echo "usage: $0 start|stop|kill [DIR] [PORT]" >&2; exit 2 ;;
esac
