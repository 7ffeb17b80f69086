"""Promise (clients/README.md, "Pools"): behind a pooler in transaction mode
(`transaction_pooling=True`) plain leases are right: the keepalive renews
through PgBouncer, each renew on whichever server connection it gets, far
past the point where psycopg would prepare the statement (a prepared
statement lives in one server session, which the next transaction may not
get), and it leaves nothing in the shared server sessions.

PgBouncer listens on a Unix socket only, in a directory of this test's own
(no TCP port is taken); skipped where /usr/sbin/pgbouncer is missing.
"""

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from conftest import DB, history, wait_until
from fenced_lock import Locker

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
SOCKET_PORT = 5621  # only the name of the socket file, in the test's own directory


@pytest.fixture
def bouncer(dsn):
    if not os.path.exists(PGBOUNCER):
        pytest.skip("pgbouncer is not installed")
    server = conninfo_to_dict(dsn)
    d = Path(tempfile.mkdtemp(prefix="fl_client_python_pgbouncer_"))
    d.chmod(0o777)
    ini = d / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        # auth_type any: the pooler logs in as this user, whoever the client says it is
        f"{DB} = host={server.get('host', '127.0.0.1')} port={server.get('port', 5432)} dbname={DB} "
        f"user={server.get('user', 'postgres')}\n"
        "[pgbouncer]\n"
        "listen_addr =\n"
        f"listen_port = {SOCKET_PORT}\n"
        f"unix_socket_dir = {d}\n"
        "auth_type = any\n"
        "pool_mode = transaction\n"
        "default_pool_size = 2\n"
        "max_client_conn = 50\n"
        "server_reset_query =\n"
        "ignore_startup_parameters = extra_float_digits\n"
        f"logfile = {d / 'pgbouncer.log'}\n"
        f"pidfile = {d / 'pgbouncer.pid'}\n")
    ini.chmod(0o644)
    as_postgres = ["sudo", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    proc = subprocess.Popen(as_postgres + [PGBOUNCER, str(ini)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = make_conninfo(host=str(d), port=SOCKET_PORT, dbname=DB, user=server.get("user", "postgres"))
    try:
        wait_until(lambda: (d / f".s.PGSQL.{SOCKET_PORT}").exists() or proc.poll() is not None, 10,
                   "pgbouncer to listen")
        assert proc.poll() is None, proc.stderr.read().decode()
        yield url
    finally:
        pidfile = d / "pgbouncer.pid"
        if pidfile.exists():
            subprocess.run(as_postgres + ["kill", "-TERM", pidfile.read_text().strip()], check=False)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        shutil.rmtree(d, ignore_errors=True)


def test_keepalive_renews_through_pgbouncer_in_transaction_mode(bouncer, admin, doc, caplog):
    row, lock = doc
    renewed = []
    caplog.set_level(logging.WARNING, logger="fenced_lock")
    locker = Locker(bouncer, transaction_pooling=True, keepalive_interval=0.1)
    with locker.acquire(lock, ttl=1.5, on_renewed=lambda lease: renewed.append(1)) as lease:
        time.sleep(3.0)  # two ttls
        assert not lease.lost.is_set(), lease.lost_reason
        with lease.conn.transaction():
            lease.conn.execute("UPDATE docs SET fence_token = %s WHERE id = %s", (lease.token, row))
    print(f"{len(renewed)} renewals through PgBouncer in 3 s")
    assert len(renewed) >= 10
    assert [r.getMessage() for r in caplog.records] == []
    assert admin.execute("SELECT fence_token FROM docs WHERE id = %s", (row,)).fetchone()[0] == lease.token
    assert [h["ended_by"] for h in history(admin, lock)][-1] == "release"
    # The renews' lock_timeout was their own transaction's: the server
    # sessions that other clients of the pooler get have none.
    for _ in range(4):
        with psycopg.connect(bouncer, autocommit=True, prepare_threshold=None) as c:
            assert c.execute("SHOW lock_timeout").fetchone()[0] == "0"
