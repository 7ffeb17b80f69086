"""Table 3: fenced_lock beside peer lock services on the same machine, all
driven from Python over one persistent connection per client:

  - fenced_lock via psycopg 3, prepared statements, autocommit;
  - Redis 7 via redis-py: SET key val NX PX ttl, then a compare-and-delete
    Lua script via EVALSHA; once with appendfsync always, once everysec;
  - etcd 3.4's v3 Lock service through its JSON gRPC gateway over a
    keep-alive http.client connection: lease grant, lock, unlock, lease revoke.

One pair = take the lock with a 30 s TTL, then let it go. Clients are
separate processes; each uses its own names, so they never contend.
"""

import base64
import http.client
import json
import multiprocessing as mp
import random
import subprocess
import threading
import time
import traceback
from datetime import timedelta

import psycopg
import redis

from benchlib import DURABLE, HERE, RUNS, SECONDS, SMOKE, dsn, fresh_database, log, percentile, save, summary

DB = "bench_peers"
CLIENTS = [1, 8]
SMOKE_PAIRS = 30


class FencedLock:
    def __init__(self, client):
        self.conn = psycopg.connect(dsn(DB), autocommit=True)
        self.client = client
        self.ttl = timedelta(seconds=30)

    def pair(self, i):
        name = f"peer:{self.client}:{random.randint(1, 1000)}"
        tok = self.conn.execute("SELECT fenced_lock_try_acquire(%s, %s)", (name, self.ttl),
                                prepare=True).fetchone()[0]
        ok = self.conn.execute("SELECT fenced_lock_release(%s, %s)", (name, tok), prepare=True).fetchone()[0]
        assert tok and ok, (name, tok, ok)


CAS_DELETE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"


class Redis:
    def __init__(self, client, port):
        self.r = redis.Redis(host="127.0.0.1", port=port)
        self.sha = self.r.script_load(CAS_DELETE)
        self.client = client

    def pair(self, i):
        key = f"peer:{self.client}:{random.randint(1, 1000)}"
        val = f"{self.client}:{i}"
        ok = self.r.set(key, val, nx=True, px=30000)
        gone = self.r.evalsha(self.sha, 1, key, val)
        assert ok and gone == 1, (key, ok, gone)


class Etcd:
    def __init__(self, client):
        self.h = http.client.HTTPConnection("127.0.0.1", 2390)
        self.client = client

    def post(self, path, body):
        self.h.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = self.h.getresponse()
        data = json.loads(resp.read())
        if resp.status != 200 or "error" in data:
            raise RuntimeError(f"etcd {path}: {resp.status} {data}")
        return data

    def pair(self, i):
        name = base64.b64encode(f"peer:{self.client}:{random.randint(1, 1000)}".encode()).decode()
        lease = self.post("/v3/lease/grant", {"TTL": 30})["ID"]
        key = self.post("/v3/lock/lock", {"name": name, "lease": lease})["key"]
        self.post("/v3/lock/unlock", {"key": key})
        self.post("/v3/lease/revoke", {"ID": lease})


ROWS = {
    "fenced_lock (psycopg)": (lambda c: FencedLock(c), DURABLE),
    "Redis SET NX PX + CAS delete, appendfsync always": (lambda c: Redis(c, 6390), "AOF, fsync every write"),
    "Redis SET NX PX + CAS delete, appendfsync everysec": (lambda c: Redis(c, 6391),
                                                           "AOF, fsync once a second (may lose 1 s)"),
    "etcd v3 Lock (grant, lock, unlock, revoke)": (lambda c: Etcd(c), "etcd default: WAL fsync per commit"),
}


def worker(row, client, start, seconds, results):
    try:
        drv = ROWS[row][0](client)
        for i in range(5):  # warm up: connections, prepared statements, script cache
            drv.pair(-1 - i)
        lat = []
        n = 0
        start.wait(timeout=60)
        t_end = time.monotonic() + seconds
        while (n < SMOKE_PAIRS) if SMOKE else (time.monotonic() < t_end):
            t0 = time.perf_counter()
            drv.pair(n)
            lat.append((time.perf_counter() - t0) * 1000.0)
            n += 1
        results.put((n, lat, time.monotonic()))
    except BaseException:
        start.abort()
        results.put(("error", traceback.format_exc(), 0))


def run(row, clients):
    ctx = mp.get_context("fork")
    start = ctx.Barrier(clients + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(row, c, start, SECONDS, results)) for c in range(clients)]
    for p in procs:
        p.start()
    try:
        start.wait(timeout=60)
    except threading.BrokenBarrierError:
        pass
    t0 = time.monotonic()
    got = [results.get(timeout=SECONDS + 60) for _ in procs]
    for p in procs:
        p.join()
    for g in got:
        if g[0] == "error":
            raise RuntimeError(f"peers: a {row} client failed:\n{g[1]}")
    elapsed = max(g[2] for g in got) - t0
    lat = [x for g in got for x in g[1]]
    return {"tps": sum(g[0] for g in got) / elapsed, "p50": percentile(lat, 50), "p99": percentile(lat, 99)}


def main():
    fresh_database(DB)
    subprocess.run(["bash", str(HERE / "servers.sh"), "start", "peers"], check=True)
    try:
        out = {"rows": []}
        for clients in CLIENTS:
            log(f"peers: {clients} client(s)")
            runs = {row: [] for row in ROWS}
            for _ in range(RUNS):
                for row in ROWS:
                    runs[row].append(run(row, clients))
            for row, (_, durability) in ROWS.items():
                out["rows"].append({"row": row, "clients": clients, "durability": durability,
                                    **{f: summary([r[f] for r in runs[row]]) for f in ("tps", "p50", "p99")}})
    finally:
        subprocess.run(["bash", str(HERE / "servers.sh"), "stop", "peers"], check=False)
    save("peers", out)


if __name__ == "__main__":
    main()
