"""Helpers shared by the fault tests: bounded clients, SQLSTATE capture, the
PgBouncer runner, and the port plan (5520-5559, loopback only)."""

import os
import subprocess
import time

import psycopg

# Port plan (all 127.0.0.1).
# shared cluster: one database per test. FL_FAULTS_MAIN_PORT (5532-5559)
# moves it, and its directory, so that two runs at once do not share it.
MAIN_PORT = int(os.environ.get("FL_FAULTS_MAIN_PORT", "5520"))
CRASH_PORT = 5521
ASYNC_PRIMARY_PORT, ASYNC_STANDBY_PORT = 5522, 5523
SYNC_PRIMARY_PORT, SYNC_STANDBY_PORT = 5524, 5525
RESTORE_PORT = 5526
CLOCK_PORT = 5527
UPGRADE_OLD_PORT, UPGRADE_NEW_PORT = 5528, 5529
PGBOUNCER_PORT = 5530
RELEASE_PORT = 5531  # test_release_durability: a quiet server crashed after releases

# Tokens on timeline N are >= (N - 1) << EPOCH_SHIFT (src/token.rs).
EPOCH_SHIFT = 47


# -- clients --------------------------------------------------------------------

def connect(cluster_or_port, dbname="postgres", user="postgres", autocommit=True,
            statement_timeout_ms=30000, **kw):
    """A client connection that can never hang a test: bounded connect and statements."""
    port = cluster_or_port if isinstance(cluster_or_port, int) else cluster_or_port.port
    return psycopg.connect(
        host="127.0.0.1", port=port, dbname=dbname, user=user, autocommit=autocommit,
        connect_timeout=10, options=f"-c statement_timeout={statement_timeout_ms}", **kw)


def sqlstate_of(fn, *args, **kw):
    """Run fn; return the SQLSTATE of the database error it raised, or None."""
    try:
        fn(*args, **kw)
    except psycopg.Error as e:
        return e.sqlstate
    return None


def wait_until(predicate, timeout, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def timeline_of(conn):
    """The timeline the server is writing WAL on now (not pg_control's, which lags)."""
    name = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()[0]
    return int(name[:8], 16)


def leases(conn):
    """Every lease record: {name: (token, holder, owner, expires_at)} (run as superuser)."""
    rows = conn.execute(
        "SELECT name, token, holder, owner::text, expires_at FROM fenced_lock_internal.granted_leases").fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


# -- PgBouncer ------------------------------------------------------------------

class PgBouncer:
    """/usr/sbin/pgbouncer run as the postgres OS user (it refuses root)."""

    def __init__(self, directory, port, backend_port, dbnames, users, pool_size=4, single=None):
        """`dbnames` are pooled with `pool_size` server connections; `single`
        (alias -> dbname) are pooled through exactly one server connection."""
        self.dir = directory
        self.port = port
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o777)
        self.ini = self.dir / "pgbouncer.ini"
        self.log = self.dir / "pgbouncer.log"
        userlist = self.dir / "userlist.txt"
        userlist.write_text("".join(f'"{u}" ""\n' for u in users))
        dbs = "".join(f"{d} = host=127.0.0.1 port={backend_port} dbname={d}\n" for d in dbnames)
        dbs += "".join(f"{a} = host=127.0.0.1 port={backend_port} dbname={d} pool_size=1\n"
                       for a, d in (single or {}).items())
        self.ini.write_text(
            "[databases]\n" + dbs +
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            "admin_users = postgres\n"
            f"auth_file = {userlist}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "min_pool_size = 0\n"
            "reserve_pool_size = 0\n"
            "max_client_conn = 200\n"
            "server_reset_query =\n"
            "ignore_startup_parameters = extra_float_digits\n"
            "query_timeout = 30\n"
            "server_connect_timeout = 5\n"
            f"logfile = {self.log}\n"
            f"pidfile = {self.dir / 'pgbouncer.pid'}\n")
        for f in (self.ini, userlist):
            os.chmod(f, 0o644)
        self.proc = None

    def _stop_leftover(self):
        """A pgbouncer left behind by an interrupted earlier run of this test
        (found by its own pidfile) would hold the port: end it."""
        pidfile = self.dir / "pgbouncer.pid"
        if not pidfile.exists():
            return
        pid = pidfile.read_text().strip()
        try:
            comm = open(f"/proc/{pid}/comm").read().strip()
        except (FileNotFoundError, ValueError):
            comm = ""
        if comm == "pgbouncer":
            subprocess.run(["kill", "-TERM", pid], check=False)
            deadline = time.monotonic() + 10
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                time.sleep(0.1)
        subprocess.run(["rm", "-f", str(pidfile)], check=False)

    def start(self):
        self._stop_leftover()
        self.proc = subprocess.Popen(["sudo", "-u", "postgres", "--", "/usr/sbin/pgbouncer", str(self.ini)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while True:
            try:
                psycopg.connect(host="127.0.0.1", port=self.port, dbname="pgbouncer", user="postgres",
                                connect_timeout=2, autocommit=True).close()
                return self
            except psycopg.Error:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.proc.stderr.read().decode() if self.proc.poll() is not None else ""
                self.stop()
                raise RuntimeError(f"pgbouncer did not start: {err}\n{self.log_text()}")
            time.sleep(0.1)

    def connect(self, dbname, user, **kw):
        """A client connection through the pooler. Transaction pooling cannot keep
        server-side prepared statements, so psycopg must not prepare."""
        return psycopg.connect(host="127.0.0.1", port=self.port, dbname=dbname, user=user, autocommit=True,
                               connect_timeout=10, prepare_threshold=None, **kw)

    def log_text(self):
        return self.log.read_text() if self.log.exists() else ""

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # sudo relays SIGTERM to pgbouncer
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pidfile = self.dir / "pgbouncer.pid"
                if pidfile.exists():
                    subprocess.run(["kill", "-9", pidfile.read_text().strip()], check=False)
                self.proc.kill()
                self.proc.wait(5)
