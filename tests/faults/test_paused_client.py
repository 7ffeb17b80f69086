"""Guarantee (docs/design.md, "Why" and "The guard"): a client process that is
paused past its lease's ttl (here: SIGSTOP, as a GC pause or a frozen VM
would) and then resumes cannot write. Another client took the lock over with a
larger token and wrote; the resumed client's write is rejected by the database
with FL001, the stock reflects only the second writer, and after retrying
properly the stock ends at 8 (the worked example of docs/design.md, "Why": 10,
B sells one, A's retry sells one)."""

import signal
import subprocess
import sys
from pathlib import Path

from faultkit import connect, wait_until

CLIENT = Path(__file__).with_name("stock_client.py")
LOCK = "stock:1"


def _state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _read_line(proc, prefix):
    line = proc.stdout.readline()
    assert line.startswith(prefix), f"expected {prefix!r} from the client, got {line!r}"
    return line.split()[1:]


def test_paused_client_write_is_rejected_after_takeover(main_cluster, fresh_db, tmp_path):
    with connect(main_cluster, fresh_db) as db:
        db.execute("CREATE TABLE stock (item_id int PRIMARY KEY, qty int NOT NULL, fence_token bigint)")
        db.execute("INSERT INTO stock VALUES (1, 10, NULL)")
        db.execute("CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock "
                   "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('stock:{item_id}', 'fence_token')")

        go, retry = tmp_path / "go", tmp_path / "retry"
        a = subprocess.Popen([sys.executable, str(CLIENT), str(main_cluster.port), fresh_db, LOCK, "1",
                              str(go), str(retry)], stdout=subprocess.PIPE, text=True)
        try:
            token_a = int(_read_line(a, "TOKEN")[0])
            assert _read_line(a, "READ") == ["10"]

            # A freezes while it holds the lease, and stays frozen past the ttl.
            a.send_signal(signal.SIGSTOP)
            wait_until(lambda: _state(a.pid) == "T", 5, what="client A stopped")
            wait_until(lambda: not db.execute("SELECT fenced_lock_validate(%s, %s)", (LOCK, token_a)).fetchone()[0],
                       10, what="A's lease to expire on the server's clock")

            # B takes over, sells one, releases.
            token_b = db.execute("SELECT fenced_lock_try_acquire(%s, '30 seconds')", (LOCK,)).fetchone()[0]
            assert token_b is not None and token_b > token_a
            assert db.execute("SELECT qty FROM stock WHERE item_id = 1").fetchone()[0] == 10
            db.execute("UPDATE stock SET qty = 9, fence_token = %s WHERE item_id = 1", (token_b,))
            assert db.execute("SELECT fenced_lock_release(%s, %s)", (LOCK, token_b)).fetchone()[0] is True

            # A wakes up and writes what it computed before the pause.
            go.touch()
            a.send_signal(signal.SIGCONT)
            assert _read_line(a, "SQLSTATE") == ["FL001"]
            assert db.execute("SELECT qty, fence_token FROM stock WHERE item_id = 1").fetchone() == (9, token_b)

            # A retries the right way: acquire, read again, write.
            retry.touch()
            _, token_c, released = _read_line(a, "RETRIED")
            assert a.wait(30) == 3
            assert int(token_c) > token_b and released == "True"
            assert db.execute("SELECT qty, fence_token FROM stock WHERE item_id = 1").fetchone() == (8, int(token_c))
            assert db.execute("SELECT count(*) FROM fenced_lock_leases WHERE name = %s AND live",
                              (LOCK,)).fetchone()[0] == 0
        finally:
            if a.poll() is None:
                a.send_signal(signal.SIGCONT)
                a.kill()
                a.wait(10)
