#!/usr/bin/env bash
# Scratch servers for the benchmarks, all on loopback, all under /tmp.
#   bench/servers.sh start pg|peers      stop pg|peers|all
# PostgreSQL 15: 127.0.0.1:5560 (fsync=on, synchronous_commit=on), started as `postgres`
#                from $PG_BINDIR (default Debian's).
# Redis 7:       6390 appendonly yes + appendfsync always, 6391 appendonly yes + appendfsync everysec;
#                no automatic AOF rewrite, so the AOF's size counts the bytes written.
# etcd 3.4:      client 2390, peer 2391, default fsync (one WAL fsync per commit); heartbeat
#                50 ms / election 500 ms, so that it grants a 1 s lease as asked (its least TTL
#                is 1.5 election timeouts, rounded up to a second: 2 s with the defaults).
set -euo pipefail
cd "$(dirname "$0")/.."
export PG_BINDIR=${PG_BINDIR:-/usr/lib/postgresql/15/bin}
ROOT=/tmp/fenced_lock_tests
PG_DIR=$ROOT/bench_pg
PG_PORT=5560

start_pg() {
  # A fresh cluster each time: every run starts from the same state.
  bash scripts/cluster.sh stop "$PG_DIR"
  rm -rf "$PG_DIR"
  bash scripts/cluster.sh start "$PG_DIR" "$PG_PORT" "shared_buffers = 256MB" "max_wal_size = 2GB"
}

redis() {  # name port fsync-policy
  local dir=$ROOT/bench_redis_$1
  rm -rf "$dir" && mkdir -p "$dir"
  redis-server --port "$2" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly yes \
    --appendfsync "$3" --auto-aof-rewrite-percentage 0 --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
}

start_etcd() {
  local dir=$ROOT/bench_etcd
  rm -rf "$dir" && mkdir -p "$dir"
  etcd --name bench --data-dir "$dir/data" \
    --listen-client-urls http://127.0.0.1:2390 --advertise-client-urls http://127.0.0.1:2390 \
    --listen-peer-urls http://127.0.0.1:2391 --initial-advertise-peer-urls http://127.0.0.1:2391 \
    --initial-cluster bench=http://127.0.0.1:2391 --log-level error \
    --heartbeat-interval 50 --election-timeout 500 \
    >"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/etcd.pid"
}

wait_up() {  # what command...
  local what=$1; shift
  for _ in $(seq 100); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "bench: $what did not come up" >&2; return 1
}

alive() {  # pid: running and not a zombie
  [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ]
}

stop_peers() {  # TERM every server we started, wait up to 5 s, then KILL
  local pids=() f
  for f in $ROOT/bench_redis_always/redis.pid $ROOT/bench_redis_everysec/redis.pid $ROOT/bench_etcd/etcd.pid; do
    [ -f "$f" ] && pids+=("$(cat "$f")") && rm -f "$f"
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 50); do
    local up=0 p
    for p in "${pids[@]}"; do alive "$p" && up=1; done
    [ $up = 0 ] && return 0
    sleep 0.1
  done
  kill -9 "${pids[@]}" 2>/dev/null || true
}

case "${1:-} ${2:-}" in
"start pg") start_pg ;;
"start peers")
  stop_peers
  redis always 6390 always
  redis everysec 6391 everysec
  start_etcd
  wait_up redis-always redis-cli -p 6390 ping
  wait_up redis-everysec redis-cli -p 6391 ping
  wait_up etcd curl -sf http://127.0.0.1:2390/health
  ;;
"stop pg") bash scripts/cluster.sh stop "$PG_DIR" ;;
"stop peers") stop_peers ;;
"stop all") stop_peers; bash scripts/cluster.sh stop "$PG_DIR"; bash scripts/cluster.sh stop "$ROOT/bench_cg" ;;
*) echo "usage: $0 start pg|peers | stop pg|peers|all" >&2; exit 2 ;;
esac
