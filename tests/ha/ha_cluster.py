"""A Patroni + etcd cluster on loopback for the HA tests: one etcd member and
three Patroni nodes, each managing a PostgreSQL 15 server.

Ports (127.0.0.1 only): etcd client 2479 / peer 2480; Patroni REST 8108-8110;
PostgreSQL 5611-5613. Files: /tmp/fenced_lock_tests/ha_*.

Process ownership, so that everything can always be stopped:
- etcd and each Patroni run in a session (process group) of their own, started
  here; their pids are written next to their data (`*.pid`).
- Patroni starts each postmaster in yet another session (it double-forks, so
  the postmaster outlives a Patroni restart). So stopping a node means killing
  Patroni's group *and* the postmaster named in its data dir's postmaster.pid.
- `cleanup_leftovers()` does the same from the pid files alone, for what an
  aborted earlier run left behind; every pid is checked against its command
  line first, so a reused pid is never signalled.
"""

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
import sys
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for harness
from harness.netfault import Cgroup  # noqa: E402

ROOT = Path("/tmp/fenced_lock_tests")
# The PostgreSQL Patroni runs (postgresql.bin_dir): FL_PG_BINDIR, as for the
# other suites, else Debian's 15.
BIN = os.environ.get("FL_PG_BINDIR") or "/usr/lib/postgresql/15/bin"
ETCD_CLIENT, ETCD_PEER = 2479, 2480
REST_PORTS = (8108, 8109, 8110)
PG_PORTS = (5611, 5612, 5613)
NODES = ("node1", "node2", "node3")
SCOPE = "fl_ha"
DBNAME = "fl_ha"
APP_USER = "app"

# Patroni's dynamic settings (stored in etcd at bootstrap). Why each:
DCS = {
    # A leader key that is not refreshed for `ttl` s is lost; Patroni refreshes
    # it every `loop_wait` s and gives up on a DCS call after `retry_timeout`
    # s (ttl must exceed loop_wait + 2 * retry_timeout). Small values make a
    # failover take seconds; ttl 10 still rides out a few seconds of stall on
    # a noisy 2-core machine without a spurious failover.
    "ttl": 10, "loop_wait": 1, "retry_timeout": 3,
    # By default Patroni restarts a crashed primary in place for up to 300 s
    # (crash recovery, same node stays leader). 0 = fail over at once if a
    # replica is eligible: what "kill -9 of the primary promotes a replica" needs.
    "primary_start_timeout": 0,
    # A replica further behind than this (bytes, vs the leader's last reported
    # WAL position) is not promoted: the bound on what an async failover may
    # discard. Patroni's default is 1 MB; the tests' 1 s replication stall
    # writes up to ~0.9 MB, so 16 MB keeps the failover from being refused
    # (Patroni would then restart the crashed primary in place instead).
    "maximum_lag_on_failover": 16 * 1024 * 1024,
    "synchronous_mode": False,
    "synchronous_mode_strict": False,
    "postgresql": {
        # The crashed primary may have WAL the new one never got: pg_rewind
        # throws it away so the node can follow the new timeline, instead of a
        # full re-clone. Needs wal_log_hints or checksums (we have both).
        "use_pg_rewind": True,
        "use_slots": True,
        "parameters": {
            "wal_log_hints": "on",
            "track_commit_timestamp": "on",  # orders the lease history (ha_workload)
            "max_connections": 100,
            "max_wal_senders": 10,
            "max_replication_slots": 10,
            "wal_keep_size": "256MB",
            "hot_standby": "on",
            "fsync": "on",
            "synchronous_commit": "on",
            # A replica whose walreceiver lost the old primary retries every
            # 5 s by default; 1 s lets it attach to the new one (and, in strict
            # synchronous mode, unblock commits there) sooner.
            "wal_retrieve_retry_interval": "1s",
        },
    },
}


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _cmdline(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _kill_checked(pid, must_contain, group=False, sig=signal.SIGKILL):
    """Signal pid (or its process group) only if its command line is what we
    started: a pid file can outlive its process and the pid be reused."""
    if pid and must_contain in _cmdline(pid):
        try:
            os.killpg(pid, sig) if group else os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(pids, timeout):
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _read_pid(path):
    try:
        return int(Path(path).read_text().split("\n")[0])
    except (FileNotFoundError, ValueError):
        return None


def http(method, url, body=None, timeout=5):
    """(status, parsed JSON or text) of a REST call; never raises on HTTP errors."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def wait_until(predicate, timeout, interval=0.2, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except Exception:  # noqa: BLE001 - a node mid-restart refuses connections
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Node:
    def __init__(self, idx):
        self.name = NODES[idx]
        self.rest = REST_PORTS[idx]
        self.port = PG_PORTS[idx]
        self.dir = ROOT / f"ha_{self.name}"
        self.data = self.dir / "data"
        self.log = self.dir / "patroni.log"
        self.pidfile = self.dir / "patroni.pid"
        self.proc = None

    def config(self):
        return {
            "scope": SCOPE, "name": self.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{self.rest}", "connect_address": f"127.0.0.1:{self.rest}"},
            "etcd3": {"hosts": [f"127.0.0.1:{ETCD_CLIENT}"]},
            "bootstrap": {"dcs": DCS, "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}, "data-checksums"]},
            "postgresql": {
                "listen": f"127.0.0.1:{self.port}", "connect_address": f"127.0.0.1:{self.port}",
                "data_dir": str(self.data), "bin_dir": BIN, "pgpass": str(self.dir / "pgpass"),
                "authentication": {"superuser": {"username": "postgres"},
                                   "replication": {"username": "replicator", "password": "replicator"},
                                   "rewind": {"username": "postgres"}},
                "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust",
                           "host replication all 127.0.0.1/32 trust"],
                "parameters": {"unix_socket_directories": str(self.dir)},
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
        }

    def start(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(self.dir, "postgres", "postgres")
        cfg = self.dir / "patroni.yml"
        cfg.write_text(json.dumps(self.config(), indent=1))  # JSON is YAML
        os.chmod(cfg, 0o644)
        log = open(self.log, "ab")
        env = {"PATH": "/usr/bin:/bin", "HOME": "/var/lib/postgresql", "LANG": "C.UTF-8"}
        # Own session: the whole Patroni group (with its pg_rewind / pg_basebackup
        # children) can be killed at once. Run as postgres: PostgreSQL refuses root.
        self.proc = subprocess.Popen(["/usr/bin/patroni", str(cfg)], stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, cwd=str(self.dir), user="postgres",
                                     group="postgres", extra_groups=[], start_new_session=True)
        log.close()
        self.pidfile.write_text(str(self.proc.pid))
        # A cgroup per node, joined before Patroni starts anything: every
        # process of the node (postmaster, walreceiver, Patroni's own clients)
        # inherits it, so a partition test can cut one node from another
        # although all of them share 127.0.0.1 (test_partition.py).
        self.cgroup = None
        if Cgroup.available():
            self.cgroup = Cgroup(f"fl_ha_{self.name}")
            self.cgroup.add(self.proc.pid)
        return self

    def postmaster_pid(self):
        pid = _read_pid(self.data / "postmaster.pid")
        return pid if pid and str(self.data) in _cmdline(pid) else None

    def stop(self):
        """Kill Patroni's group, then the postmaster and its children: the data
        is thrown away, so no clean shutdown is needed (and none can hang)."""
        pid = self.proc.pid if self.proc else _read_pid(self.pidfile)
        _kill_checked(pid, "patroni", group=True)
        pm = self.postmaster_pid()
        kids = [int(p) for p in subprocess.run(["pgrep", "-P", str(pm)], capture_output=True,
                                               text=True).stdout.split()] if pm else []
        _kill_checked(pm, str(self.data))
        for k in kids:
            _kill_checked(k, "postgres")
        _wait_gone([p for p in [pid, pm, *kids] if p], 10)
        if self.proc:
            self.proc.wait(5)
        if getattr(self, "cgroup", None) is not None:
            self.cgroup.remove()


class Etcd:
    def __init__(self):
        self.dir = ROOT / "ha_etcd"
        self.pidfile = self.dir / "etcd.pid"
        self.proc = None

    def start(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        log = open(self.dir / "etcd.log", "ab")
        url_c, url_p = f"http://127.0.0.1:{ETCD_CLIENT}", f"http://127.0.0.1:{ETCD_PEER}"
        self.proc = subprocess.Popen(
            ["/usr/bin/etcd", "--name", "ha_etcd", "--data-dir", str(self.dir / "data"),
             "--listen-client-urls", url_c, "--advertise-client-urls", url_c,
             "--listen-peer-urls", url_p, "--initial-advertise-peer-urls", url_p,
             "--initial-cluster", f"ha_etcd={url_p}", "--initial-cluster-state", "new",
             "--initial-cluster-token", "fl_ha", "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.pidfile.write_text(str(self.proc.pid))
        wait_until(lambda: http("GET", f"{url_c}/health", timeout=1)[0] == 200, 30, what="etcd to be healthy")
        return self

    def stop(self):
        pid = self.proc.pid if self.proc else _read_pid(self.pidfile)
        _kill_checked(pid, "etcd", group=True)
        _wait_gone([pid] if pid else [], 10)
        if self.proc:
            self.proc.wait(5)


def cleanup_leftovers():
    """Stop whatever an aborted earlier run left running, then remove its files."""
    for node in (Node(i) for i in range(3)):
        node.stop()
    Etcd().stop()
    for d in ROOT.glob("ha_*"):
        shutil.rmtree(d, ignore_errors=True)


class HACluster:
    """etcd + three Patroni nodes. `start()` bootstraps and creates the test
    database; `stop()` stops everything and is safe to call at any point."""

    def __init__(self):
        self.etcd = Etcd()
        self.nodes = [Node(i) for i in range(3)]

    def start(self):
        ROOT.mkdir(parents=True, exist_ok=True)
        ROOT.chmod(0o777)
        self.etcd.start()
        for n in self.nodes:
            n.start()
        self.wait_healthy(120)
        self.bootstrap_db()
        return self

    def stop(self):
        for n in self.nodes:
            try:
                n.stop()
            except Exception:  # noqa: BLE001 - stop the rest whatever happens
                pass
        self.etcd.stop()

    # -- topology -----------------------------------------------------------
    def node(self, name):
        return next(n for n in self.nodes if n.name == name)

    def members(self):
        """{name: member dict} from Patroni's /cluster, asked of any node that answers."""
        for n in self.nodes:
            try:
                status, body = http("GET", f"http://127.0.0.1:{n.rest}/cluster", timeout=2)
            except OSError:
                continue
            if status == 200 and isinstance(body, dict):
                return {m["name"]: m for m in body.get("members", [])}
        return {}

    def leader(self):
        ms = self.members()
        name = next((k for k, m in ms.items() if m["role"] in ("leader", "master")
                     and m["state"] == "running"), None)
        return self.node(name) if name else None

    def replicas(self):
        leader = self.leader()
        return [n for n in self.nodes if leader is None or n.name != leader.name]

    def healthy(self, sync=False):
        """A running leader; two running replicas on its timeline, streaming,
        caught up within 1 MB; in sync mode one of them the sync standby."""
        ms = self.members()
        leaders = [m for m in ms.values() if m["role"] in ("leader", "master") and m["state"] == "running"]
        if len(ms) != 3 or len(leaders) != 1:
            return False
        reps = [m for m in ms.values() if m is not leaders[0]]
        if any(m["state"] not in ("running", "streaming") or m.get("timeline") != leaders[0].get("timeline")
               or not isinstance(m.get("lag"), int) or m["lag"] > 1 << 20 for m in reps):
            return False
        if sync != any(m["role"] == "sync_standby" for m in reps):
            return False
        with self.connect(self.node(leaders[0]["name"]).port, dbname="postgres", user="postgres") as c:
            return c.execute("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
                             ).fetchone()[0] == 2

    def wait_healthy(self, timeout=60, sync=False):
        wait_until(lambda: self.healthy(sync), timeout, interval=0.3,
                   what=f"a healthy cluster (sync={sync}): {self.members()}")

    def set_sync(self, on):
        """Switch Patroni's synchronous mode (dynamic config, stored in etcd)."""
        n = self.leader() or self.nodes[0]
        status, body = http("PATCH", f"http://127.0.0.1:{n.rest}/config",
                            {"synchronous_mode": on, "synchronous_mode_strict": on})
        assert status == 200, body
        self.wait_healthy(60, sync=on)

    # -- clients ------------------------------------------------------------
    @staticmethod
    def dsn(dbname=DBNAME, user=APP_USER, read_write=True):
        """The multi-host connection string clients use: libpq tries the hosts
        in order and keeps the first that accepts writes."""
        ports = ",".join(map(str, PG_PORTS))
        tsa = " target_session_attrs=read-write" if read_write else ""
        return (f"host=127.0.0.1,127.0.0.1,127.0.0.1 port={ports} dbname={dbname} user={user} "
                f"connect_timeout=2{tsa}")

    @staticmethod
    def connect(port=None, dbname=DBNAME, user=APP_USER, statement_timeout_ms=10000):
        """A bounded connection: to one server (`port`), or to whichever is primary."""
        dsn = HACluster.dsn(dbname, user) if port is None else \
            f"host=127.0.0.1 port={port} dbname={dbname} user={user} connect_timeout=2"
        return psycopg.connect(dsn, autocommit=True, options=f"-c statement_timeout={statement_timeout_ms}")

    def bootstrap_db(self):
        """The test database: the extension, an application role with the
        grants README's Operations asks for, and two guarded tables."""
        port = self.leader().port
        with self.connect(port, dbname="postgres", user="postgres") as c:
            c.execute(f"CREATE DATABASE {DBNAME}")
            c.execute(f"CREATE ROLE {APP_USER} LOGIN")
        with self.connect(port, user="postgres") as c:
            for stmt in BOOTSTRAP_SQL:
                c.execute(stmt)
        # Every node has it before a test starts.
        lsn = self.sql_primary("SELECT pg_current_wal_flush_lsn()")[0][0]
        for n in self.replicas():
            wait_until(lambda n=n: self.connect(n.port, user="postgres").execute(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone()[0], 30,
                what=f"{n.name} to replay the bootstrap")

    def sql_primary(self, query, params=None, user="postgres"):
        # The leader's own port: a multi-host connect stops at the first host
        # that answers with an error (e.g. a replica still without the database).
        with self.connect(self.leader().port, user=user) as c:
            cur = c.execute(query, params)
            return cur.fetchall() if cur.description else None

    def diagnose(self):
        """What the cluster looks like now, for a failure message."""
        out = [f"members: {self.members()}"]
        try:
            with self.connect(self.leader().port, dbname="postgres", user="postgres") as c:
                for q in ("SHOW synchronous_standby_names",
                          "SELECT application_name, state, sync_state, sent_lsn, replay_lsn FROM pg_stat_replication",
                          "SELECT wait_event, count(*) FROM pg_stat_activity WHERE datname = 'fl_ha' GROUP BY 1"):
                    out.append(f"{q}: {c.execute(q).fetchall()}")
        except Exception as e:  # noqa: BLE001
            out.append(f"leader unreachable: {e!r}")
        return "\n".join(out)

    # -- faults -------------------------------------------------------------
    def walsender_pids(self, leader):
        with self.connect(leader.port, dbname="postgres", user="postgres") as c:
            return [r[0] for r in c.execute("SELECT pid FROM pg_stat_replication").fetchall()]


BOOTSTRAP_SQL = [
    "CREATE EXTENSION fenced_lock",
    # What README's "Granting access" lists, by name so that a new optional
    # argument in a later version does not break the grant.
    f"""DO $$ DECLARE f regprocedure; BEGIN
          FOR f IN SELECT p.oid FROM pg_proc p WHERE p.proname IN ('fenced_lock_try_acquire',
                   'fenced_lock_acquire', 'fenced_lock_renew', 'fenced_lock_release', 'fenced_lock_validate',
                   'fenced_lock_assert') AND p.pronamespace = 'public'::regnamespace LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO {APP_USER}', f);
          END LOOP; END $$""",
    f"GRANT SELECT ON fenced_lock_leases TO {APP_USER}",
    # Guarded tables: one row per lock name (UPDATEd), and an append-only
    # ledger (INSERTed); the lock of a row is its `res` column.
    "CREATE TABLE ha_state (res text PRIMARY KEY, counter bigint NOT NULL DEFAULT 0, fence_token bigint)",
    "CREATE TABLE ha_ledger (id bigserial PRIMARY KEY, res text NOT NULL, writer text NOT NULL, "
    "seq bigint NOT NULL, fence_token bigint, UNIQUE (writer, seq))",
    "CREATE TRIGGER ha_state_fence BEFORE INSERT OR UPDATE OR DELETE ON ha_state "
    "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('{res}')",
    "CREATE TRIGGER ha_ledger_fence BEFORE INSERT OR UPDATE OR DELETE ON ha_ledger "
    "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('{res}')",
    f"GRANT SELECT, INSERT, UPDATE ON ha_state, ha_ledger TO {APP_USER}",
    f"GRANT USAGE ON SEQUENCE ha_ledger_id_seq TO {APP_USER}",
]


def lease_table(conn):
    """The extension's private table of lease records (renamed in 0.2.0)."""
    return conn.execute("SELECT coalesce(to_regclass('fenced_lock_internal.granted_leases'), "
                        "to_regclass('fenced_lock_internal.leases'))::text").fetchone()[0]
