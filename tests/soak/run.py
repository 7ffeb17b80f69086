#!/usr/bin/env python3
"""The soak: worker processes run the inventory job against a scratch
PostgreSQL while nemeses mix every fault at random, then the independent
checker (checker.py) judges what happened from the history, the workers'
logs and the final data.

    python3 tests/soak/run.py --duration 1h            (scripts/soak.sh wraps this)

Server: 127.0.0.1:5590 (FL_SOAK_PORT), files under /tmp/fenced_lock_tests/soak
(the cluster) and /tmp/fenced_lock_tests/soak_run (logs, nemesis log, the
checker's report). Binaries from FL_PG_BINDIR, as for every suite.
Exit status: the checker's (0: no violation), 2 if the run itself failed.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/, for harness

import psycopg  # noqa: E402

from harness import netfault  # noqa: E402
from harness.cluster import Cluster  # noqa: E402

sys.path.insert(0, str(HERE))
import schema  # noqa: E402
from nemesis import NemesisLog, Nemeses, start_mixer  # noqa: E402

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
DBNAME = "soak"
# Server-side keepalive settings that half of the workers' sessions get: a
# partitioned session is then ended within ~4 s (docs/operations.md).
KEEPALIVES = ("-c tcp_keepalives_idle=1 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=2 "
              "-c tcp_user_timeout=3000")
ALL_NEMESES = {"kill_client": 3, "kill_server": 1, "stop_holder": 3, "partition_client": 3, "clock_step": 3}


def parse_duration(s):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smh]?)", s.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {s!r} (e.g. 90s, 3m, 1h)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


class Worker:
    def __init__(self, soak, idx):
        self.soak, self.idx = soak, idx
        self.base = f"w{idx}"
        self.incarnation = 0
        self.keepalives = idx % 2 == 0
        self.clock_file = soak.out / "clock" / f"{self.base}.rc"
        self.clock_file.write_text("+0\n")
        self.proc = None
        self.stopped = False
        self.clock_off = False
        self.deaths = []

    @property
    def wid(self):
        return f"{self.base}.{self.incarnation}"

    def spawn(self):
        self.incarnation += 1
        self.stopped = False
        s = self.soak
        args = dict(wid=self.wid, seed=s.rnd.randrange(1 << 30), log=str(s.out / "logs" / f"{self.wid}.jsonl"),
                    stop_file=str(s.stop_file), parent=os.getpid(), dsn=s.worker_dsn, items=s.items,
                    server_opts=KEEPALIVES if self.keepalives else "",
                    shared=s.v030, permits=s.v030, pool_permits=3)
        env = dict(os.environ)
        if s.faketime:
            # Only the wall clock moves: CLOCK_MONOTONIC stays the kernel's,
            # so the checker can order events of all workers by it.
            env.update(LD_PRELOAD=str(LIBFAKETIME), FAKETIME_TIMESTAMP_FILE=str(self.clock_file),
                       FAKETIME_DONT_FAKE_MONOTONIC="1", FAKETIME_CACHE_DURATION="1")
        self.stderr = open(s.out / "stderr" / f"{self.wid}.txt", "w")
        self.proc = subprocess.Popen([sys.executable, str(HERE / "worker.py"), json.dumps(args)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr,
                                     env=env)

    def set_clock(self, offset_s):
        self.clock_file.write_text(f"{int(offset_s):+d}\n")


class Soak:
    def __init__(self, out, port=5590, workers=8, items=4, seed=None, nemeses=None, faketime=True,
                 worker_port=None, initial_stock=10_000_000, cluster_name="soak", conf=None):
        self.out = Path(out)
        self.port = port
        self.items = items
        self.initial_stock = initial_stock
        self.seed = seed if seed is not None else int(time.time())
        self.rnd = random.Random(self.seed)
        self.nemesis_weights = dict(ALL_NEMESES if nemeses is None else nemeses)
        self.faketime = faketime and LIBFAKETIME.exists()
        self.n_workers = workers
        self.worker_port = worker_port or port  # a proxy's port, for a slow link
        self.behind_proxy = self.worker_port != port
        self.cluster = Cluster(cluster_name, port, dict({"track_commit_timestamp": "on", "max_connections": "100",
                                                         "fenced_lock.history_retention": "'7d'"}, **(conf or {})))
        self.rules = None
        self.workers = []
        self.lock = threading.Lock()
        self.server_down = threading.Event()
        self.worker_dsn = (f"host=127.0.0.1 port={self.worker_port} dbname={DBNAME} user={schema.APP}")
        self.stop_file = self.out / "stop"
        self.v030 = False

    # -- setup ----------------------------------------------------------------
    def prepare(self):
        if self.out.exists():
            shutil.rmtree(self.out)
        for d in ("logs", "clock", "stderr"):
            (self.out / d).mkdir(parents=True)
        if "partition_client" in self.nemesis_weights or self.nemesis_weights.get("lossy"):
            ok, why = netfault.available()
            if not ok:
                raise SystemExit(f"partitions need iptables: {why}")
            netfault.remove_leftovers("soak")
            self.rules = netfault.Rules("soak")
        self.start_server()
        with self.su() as c:
            self.extversion = c.execute("SELECT extversion FROM pg_extension WHERE extname = 'fenced_lock'"
                                        ).fetchone()[0]
            self.v030 = schema.version_tuple(self.extversion) >= (0, 3, 0)
            schema.setup(c, self.items, self.initial_stock, self.extversion)

    def start_server(self):
        self.cluster.init()
        self.cluster.start()
        self.cluster.create_database(DBNAME)

    def su_dsn(self):
        return self.cluster.dsn(DBNAME)

    def su(self):
        return psycopg.connect(self.su_dsn(), autocommit=True, connect_timeout=5,
                               options="-c statement_timeout=10000")

    # -- what nemeses ask ------------------------------------------------------
    def random_worker(self, rnd):
        with self.lock:
            live = [w for w in self.workers if w.proc and w.proc.poll() is None and not w.stopped]
        return rnd.choice(live) if live else None

    def respawn(self, w):
        with self.lock:
            if not self.stop_file.exists():
                w.spawn()

    def holders(self):
        if self.server_down.is_set():
            return []
        try:
            with self.su() as c:
                held = {r[0].split(":")[0] for r in c.execute(
                    "SELECT holder FROM fenced_lock_leases WHERE live AND holder IS NOT NULL").fetchall()}
        except psycopg.Error:
            return []
        with self.lock:
            return [w for w in self.workers if w.wid in held and not w.stopped and w.proc.poll() is None]

    def client_port(self, w):
        """(client port, server port) of worker w's connection, as the server sees it."""
        if self.server_down.is_set():
            return None
        if self.behind_proxy:
            return None  # behind a proxy the server sees the proxy's ports: no per-client cut
        try:
            with self.su() as c:
                row = c.execute("SELECT client_port, inet_server_port() FROM pg_stat_activity "
                                "WHERE application_name = %s AND datname = %s", (w.base, DBNAME)).fetchone()
        except psycopg.Error:
            return None
        if row is None or row[0] is None:
            return None
        return row[0], row[1]

    def crash_server(self, down_for):
        self.server_down.set()
        try:
            self.cluster.kill9(children_grace=0)
            time.sleep(down_for)
            self.cluster.start(timeout=120)
        finally:
            self.server_down.clear()

    # -- the run ---------------------------------------------------------------
    def run(self, duration):
        self.prepare()
        started = time.monotonic()
        deadline = started + duration
        for i in range(self.n_workers):
            w = Worker(self, i)
            self.workers.append(w)
            w.spawn()
        nlog = NemesisLog(str(self.out / "nemesis.jsonl"))
        nem = Nemeses(self, self.rnd, nlog)
        kinds = [k for k, wt in self.nemesis_weights.items() if wt and hasattr(nem, k)]
        mixers = start_mixer(nem, kinds, [self.nemesis_weights[k] for k in kinds], self.rnd, deadline) if kinds else []
        unexpected = []
        next_report = started + 60
        try:
            while time.monotonic() < deadline:
                time.sleep(0.5)
                with self.lock:
                    for w in self.workers:
                        rc = w.proc.poll()
                        if rc is not None and rc != -signal.SIGKILL:
                            # A worker that exits by itself hit something it did not expect.
                            tail = (self.out / "stderr" / f"{w.wid}.txt").read_text()[-2000:]
                            unexpected.append(f"{w.wid} exited with {rc}: {tail}")
                            w.spawn()
                if time.monotonic() > next_report:
                    next_report += 60
                    print(f"soak: {int(time.monotonic() - started)} s, faults so far {nlog.counts}", flush=True)
        finally:
            nem.stopping.set()
            for t in mixers:
                t.join(60)
            self.heal_everything()
            self.stop_workers()
        return nlog, unexpected

    def heal_everything(self):
        if self.rules:
            self.rules.clear()
        for w in self.workers:
            w.set_clock(0)
            if w.proc and w.proc.poll() is None:
                try:
                    w.proc.send_signal(signal.SIGCONT)
                except ProcessLookupError:
                    pass
        self.ensure_server()

    def ensure_server(self):
        try:
            self.su().close()
        except psycopg.Error:
            self.cluster.start(timeout=120)

    def stop_workers(self, grace=30):
        self.stop_file.touch()
        deadline = time.monotonic() + grace
        for w in self.workers:
            if w.proc is None:
                continue
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait(10)

    def check(self, nemesis_log):
        cmd = [sys.executable, str(HERE / "checker.py"), "--dsn", self.su_dsn(), "--logs",
               str(self.out / "logs"), "--nemesis", nemesis_log, "--json", str(self.out / "checker.json")]
        return subprocess.run(cmd, timeout=900).returncode

    def vacuous(self, weights):
        """What a run this long should have done and did not: every fault kind
        asked for injected, sales committed, stale writes refused."""
        try:
            counts = json.loads((self.out / "checker.json").read_text())["counts"]
        except (OSError, ValueError, KeyError):
            return ["the checker wrote no report"]
        missing = [f"no {k} was injected" for k, wt in weights.items() if wt and not counts.get("fault: " + k)]
        if not counts.get("acknowledged sales"):
            missing.append("no sale was acknowledged")
        if not counts.get("writes refused with FL001"):
            missing.append("no stale write was refused with FL001")
        if self.v030 and not counts.get("counts under shared leases"):
            missing.append("no count was taken under a shared lease (0.3.0)")
        if self.v030 and not counts.get("uses of permits"):
            missing.append("no permit was used (0.3.0)")
        return missing

    def close(self):
        try:
            self.stop_workers(grace=5)
        except Exception:
            pass
        if self.rules:
            self.rules.clear()
        self.stop_server()

    def stop_server(self):
        self.cluster.stop(mode="immediate", check=False)


class HASoak(Soak):
    """The soak on tests/ha's Patroni cluster (etcd + three nodes on
    127.0.0.1:5611-5613, synchronous_mode strict so that a failover may lose
    no acknowledged grant): workers use the multi-host connection string,
    and the server nemesis is a failover (kill -9 of the primary's
    postmaster; Patroni promotes the synchronous standby, the old primary
    rejoins through pg_rewind)."""

    def __init__(self, out, **kw):
        super().__init__(out, **kw)
        sys.path.insert(0, str(HERE.parent / "ha"))
        import ha_cluster
        self.hamod = ha_cluster
        ports = ",".join(map(str, ha_cluster.PG_PORTS))
        self.worker_dsn = (f"host=127.0.0.1,127.0.0.1,127.0.0.1 port={ports} dbname={DBNAME} user={schema.APP} "
                           "target_session_attrs=read-write")
        self.behind_proxy = False
        self.ha = None

    def start_server(self):
        self.hamod.cleanup_leftovers()
        self.ha = self.hamod.HACluster()
        self.ha.start()
        self.ha.set_sync(True)
        leader = self.ha.leader()
        with psycopg.connect(f"host=127.0.0.1 port={leader.port} dbname=postgres user=postgres",
                             autocommit=True) as c:
            c.execute(f"CREATE DATABASE {DBNAME}")
        with psycopg.connect(f"host=127.0.0.1 port={leader.port} dbname={DBNAME} user=postgres",
                             autocommit=True) as c:
            c.execute("CREATE EXTENSION fenced_lock")

    def su_dsn(self):
        leader = self.ha.leader() if self.ha else None
        port = leader.port if leader else self.hamod.PG_PORTS[0]
        return f"host=127.0.0.1 port={port} dbname={DBNAME} user=postgres"

    def crash_server(self, down_for):
        self.failover()

    def failover(self):
        try:
            # One failover at a time, each on a whole cluster: with strict
            # synchronous mode a second kill before the first primary rejoined
            # would leave no synchronous standby to promote.
            self.ha.wait_healthy(180, sync=True)
        except AssertionError:
            return dict(skipped="the cluster did not become healthy")
        self.server_down.set()
        try:
            old = self.ha.leader()
            if old is None or old.postmaster_pid() is None:
                return dict(skipped="no running leader")
            os.kill(old.postmaster_pid(), signal.SIGKILL)
            self.hamod.wait_until(lambda: (self.ha.leader() or old).name != old.name, 90, interval=0.1,
                                  what="a replica to be promoted")
            return dict(old=old.name, new=self.ha.leader().name)
        finally:
            self.server_down.clear()

    def ensure_server(self):
        self.ha.wait_healthy(180, sync=True)

    def stop_server(self):
        if self.ha:
            self.ha.stop()


def main():
    ap = argparse.ArgumentParser(description="fenced_lock soak: every fault at once, then the checker")
    ap.add_argument("--duration", type=parse_duration, default=parse_duration(os.environ.get("SOAK_DURATION", "3m")))
    ap.add_argument("--port", type=int, default=int(os.environ.get("FL_SOAK_PORT", "5590")))
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--items", type=int, default=4)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--out", default="/tmp/fenced_lock_tests/soak_run")
    ap.add_argument("--nemeses", default="all", help="comma-separated subset of " + ",".join(ALL_NEMESES))
    ap.add_argument("--ha", action="store_true", default=os.environ.get("SOAK_HA") == "1",
                    help="run on tests/ha's Patroni cluster, with failovers (also SOAK_HA=1)")
    a = ap.parse_args()
    kinds = dict(ALL_NEMESES, failover=1) if a.ha else ALL_NEMESES
    weights = dict(kinds) if a.nemeses == "all" else {k: kinds[k] for k in a.nemeses.split(",") if k}
    if a.ha:
        weights.pop("kill_server", None)  # a failover is the HA cluster's server crash
    cls = HASoak if a.ha else Soak
    # Another port gets a cluster directory of its own, so that two runs never share one.
    soak = cls(a.out, port=a.port, workers=a.workers, items=a.items, seed=a.seed, nemeses=weights,
               cluster_name="soak" if a.port == 5590 else f"soak_{a.port}")

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)
    t0 = time.time()
    try:
        print(f"soak: {a.duration:.0f} s, {a.workers} workers, {a.items} items, seed {soak.seed}, "
              f"{'Patroni cluster, ' if a.ha else ''}"
              f"nemeses {','.join(weights)}, faketime {'on' if soak.faketime else 'off (libfaketime missing)'}",
              flush=True)
        nlog, unexpected = soak.run(a.duration)
        print(f"soak: fenced_lock {soak.extversion}, ran {time.time() - t0:.0f} s; checking", flush=True)
        rc = soak.check(nlog.path)
        vacuous = soak.vacuous(weights)
        if vacuous:
            print("soak: the run did not exercise what it claims:", *vacuous, sep="\n  ")
            rc = rc or 2
        if unexpected:
            print(f"soak: {len(unexpected)} worker(s) exited unexpectedly:", *unexpected[:5], sep="\n  ")
            rc = rc or 2
        print(f"soak: {'PASSED' if rc == 0 else 'FAILED'} in {time.time() - t0:.0f} s (logs: {a.out})", flush=True)
        sys.exit(rc)
    finally:
        soak.close()


if __name__ == "__main__":
    main()
