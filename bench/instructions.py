"""Table 8: instructions per operation, counted with callgrind: a cost that
does not depend on the machine, its load or its disks, so that a target
missed in the throughput tables can be traced to the code that spends it.

A single-user PostgreSQL 15 backend (`postgres --single`, no client, no
network) runs each row's statements under `valgrind --tool=callgrind`,
driven line by line from here (each line its own transaction unless the row
opens one), with prepared statements (PREPARE / EXECUTE). Each row runs
twice, WARM operations and WARM + N operations, in fresh sessions that
start from a vacuumed database; the difference of the two totals over N is
the row's cost per operation, free of start-up and of the warm-up (caches,
plans). The same difference per
function (callgrind_annotate --inclusive) gives the profile: where an
operation's instructions go. Tokens come back as results and go into the
next statement as literals, so a release costs nothing extra.

The cluster is the bench's own scratch one (/tmp/fenced_lock_tests/bench_cg),
set up through a server that listens on a Unix socket only, then stopped:
single-user mode needs the data directory to itself.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

from benchlib import HERE, PG_BINDIR, SMOKE, build_noop_trigger, log, save
from costs import ROOT

CG = ROOT / "bench_cg"
DATA = CG / "data"
N = 20 if SMOKE else int(os.environ.get("FL_BENCH_CG_OPS", "400"))
WARM = 5 if SMOKE else 30
DB = "postgres"
AS_POSTGRES = [] if os.geteuid() != 0 else ["sudo", "-u", "postgres"]
SMOKE_ROWS = ("floor: INSERT + DELETE", "fenced_lock pair", "sale: fenced_lock, one transaction",
              "try_acquire_all + release_all, 2 names")  # the last one with 0.3.0
TOP = 16  # profile lines per row
# PostgreSQL's building blocks shown in a profile, beside the extension's own
# functions: what a lease change or a guarded write is made of.
BLOCKS = {
    "StartTransactionCommand", "CommitTransactionCommand", "XLogInsert", "XLogFlush", "heap_insert", "heap_update",
    "heap_delete", "heap_fetch", "simple_heap_insert", "CatalogTupleInsert", "index_insert", "index_getnext_slot",
    "index_beginscan", "ExecInsertIndexTuples", "SPI_connect", "SPI_finish", "SPI_execute_plan",
    "SPI_execute_plan_extended", "SPI_prepare", "SPI_cursor_open", "standard_ExecutorStart", "standard_ExecutorEnd",
    "standard_ExecutorFinish", "ExecInitNode", "ExecEndNode", "LockAcquireExtended", "LockRelease",
    "LockRelationOid", "nextval_internal", "heap_form_tuple", "ExecBRUpdateTriggers", "ExecBRInsertTriggers",
    "AfterTriggerEndQuery", "GetSnapshotData", "RelationIdGetRelation", "pg_plan_query", "pg_parse_query",
    "plpgsql_call_handler", "ExecUpdate", "ExecInsert", "ExecDelete", "ExecLockRows",
    "heap_lock_tuple", "XactLockTableWait", "set_config_option",
}


class Single:
    """One single-user backend, driven line by line through its prompt."""

    PROMPT = b"backend> "

    def __init__(self, tag, callgrind=True):
        self.out = CG / f"{tag}.callgrind" if callgrind else None
        argv = [os.path.join(PG_BINDIR, "postgres"), "--single", "-D", str(DATA), "-c", "max_wal_size=2GB", DB]
        if callgrind:
            self.out.unlink(missing_ok=True)
            argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.out}"] + argv
        self.err = open(CG / f"{tag}.stderr", "w")
        self.p = subprocess.Popen(AS_POSTGRES + argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err, cwd=CG)
        self.buf = b""
        self._prompt()

    def _prompt(self):
        while self.PROMPT not in self.buf:
            chunk = os.read(self.p.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError(f"instructions: the backend exited: {self.stderr()}")
            self.buf += chunk
        out, _, self.buf = self.buf.partition(self.PROMPT)
        return out.decode(errors="replace")

    def stderr(self):
        self.err.flush()
        return Path(self.err.name).read_text()[-2000:]

    def run(self, line):
        """Send one statement; its first result value (None if none or NULL)."""
        self.p.stdin.write(line.encode() + b"\n")
        self.p.stdin.flush()
        m = re.search(r'= "(.*?)"\t', self._prompt())
        return m.group(1) if m else None

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=300)
        self.err.close()
        log_ = Path(self.err.name).read_text()
        if self.p.returncode != 0 or "ERROR:" in log_:
            raise RuntimeError(f"instructions: the session failed:\n{log_[-2000:]}")


def pair(acquire, release, released="t"):
    """A lease pair: acquire(i) gives a token (or an array of them), and
    release(i, token) must answer `released`."""
    def op(s, i):
        tok = s.run(acquire(i))
        if tok is None:
            raise RuntimeError(f"instructions: not granted: {acquire(i)}")
        if s.run(release(i, tok)) != released:
            raise RuntimeError(f"instructions: release refused: {release(i, tok)}")
    return op


def plain(*lines):
    def op(s, i):
        for line in lines:
            s.run(line.format(i=i))
    return op


def critical_section(kind):
    """The end-to-end sale of table 6: lock, read the stock, write stock - 1, unlock."""
    def op(s, i):
        if kind == "forupdate":
            s.run("BEGIN")
            stock = int(s.run("EXECUTE fu_read(1)"))
            s.run(f"EXECUTE fu_write({stock - 1}, 1)")
            s.run("COMMIT")
            return
        if kind == "fenced1":
            s.run("BEGIN")
        tok = s.run("EXECUTE cs_acquire('sale:1')")
        stock = int(s.run("EXECUTE cs_read(1)"))
        s.run(f"EXECUTE cs_write({stock - 1}, {tok}, 1)")
        if s.run(f"EXECUTE cs_release('sale:1', {tok})") != "t":
            raise RuntimeError("instructions: critical section release refused")
        if kind == "fenced1":
            s.run("COMMIT")
    return op


PAIR = ["PREPARE a(text) AS SELECT fenced_lock_try_acquire($1, '30 s')",
        "PREPARE r(text, bigint) AS SELECT fenced_lock_release($1, $2)"]
CS = ["PREPARE cs_acquire(text) AS SELECT fenced_lock_acquire($1, '30 s', '10 s')",
      "PREPARE cs_read(int) AS SELECT stock FROM sale WHERE item = $1",
      "PREPARE cs_write(bigint, bigint, int) AS UPDATE sale SET stock = $1, fence = $2 WHERE item = $3",
      "PREPARE cs_release(text, bigint) AS SELECT fenced_lock_release($1, $2)"]


def rows(token, v03):
    """row: (what one operation is, session set-up lines, operation)"""
    names = lambda k, i: "ARRAY[" + ",".join(f"'all:{i}:{j}'" for j in range(k)) + "]"  # noqa: E731
    r = {
        "floor: INSERT + DELETE": (
            "INSERT (flushed) + DELETE (not waited for), two transactions",
            ["SET synchronous_commit = off",
             "PREPARE i(text) AS INSERT INTO bench_floor (name, token) SELECT $1, 1"
             " FROM (SELECT set_config('synchronous_commit', 'on', true)) durable",
             "PREPARE d(text) AS DELETE FROM bench_floor WHERE name = $1"],
            plain("EXECUTE i('p{i}')", "EXECUTE d('p{i}')")),
        "fenced_lock pair": ("try_acquire + release, two transactions", PAIR,
                             pair(lambda i: f"EXECUTE a('p{i}')", lambda i, t: f"EXECUTE r('p{i}', {t})")),
        "fenced_lock pair, history off": (
            "the same with fenced_lock.history_retention = 0", ["SET fenced_lock.history_retention = 0"] + PAIR,
            pair(lambda i: f"EXECUTE a('h{i}')", lambda i, t: f"EXECUTE r('h{i}', {t})")),
        "PL/pgSQL lease table pair": (
            "plpgsql_lease.try_acquire + release, two transactions",
            ["PREPARE a(text) AS SELECT plpgsql_lease.try_acquire($1, '30 s')",
             "PREPARE r(text, bigint) AS SELECT plpgsql_lease.release($1, $2)"],
            pair(lambda i: f"EXECUTE a('p{i}')", lambda i, t: f"EXECUTE r('p{i}', {t})")),
        "UPDATE, plain": ("one UPDATE transaction", ["PREPARE u(bigint) AS UPDATE bench_plain SET v = v + 1,"
                                                     " fence_token = $1 WHERE id = 0"],
                          plain(f"EXECUTE u({token})")),
        "UPDATE, no-op C trigger": ("the same, a table with a no-op C row trigger",
                                    ["PREPARE u(bigint) AS UPDATE bench_noop SET v = v + 1, fence_token = $1"
                                     " WHERE id = 0"], plain(f"EXECUTE u({token})")),
        "UPDATE, guarded": ("the same, a table with fenced_lock_guard, under a live lease",
                            ["PREPARE u(bigint) AS UPDATE bench_guarded SET v = v + 1, fence_token = $1"
                             " WHERE id = 0"], plain(f"EXECUTE u({token})")),
        "sale: fenced_lock, three transactions": ("acquire; SELECT; guarded UPDATE; release", CS,
                                                  critical_section("fenced3")),
        "sale: fenced_lock, one transaction": ("BEGIN; acquire; SELECT; guarded UPDATE; release; COMMIT", CS,
                                               critical_section("fenced1")),
        "sale: SELECT ... FOR UPDATE": (
            "BEGIN; SELECT ... FOR UPDATE; UPDATE; COMMIT",
            ["PREPARE fu_read(int) AS SELECT stock FROM sale_plain WHERE item = $1 FOR UPDATE",
             "PREPARE fu_write(bigint, int) AS UPDATE sale_plain SET stock = $1 WHERE item = $2"],
            critical_section("forupdate")),
    }
    if v03:
        r.update({
            "shared pair": ("try_acquire(shared => true) + release", PAIR[1:] + [
                "PREPARE a(text) AS SELECT fenced_lock_try_acquire($1, '30 s', shared => true)"],
                pair(lambda i: f"EXECUTE a('s{i}')", lambda i, t: f"EXECUTE r('s{i}', {t})")),
            "permit pair": ("acquire(permits => 8) + release of one name", PAIR[1:] + [
                "PREPARE a(text) AS SELECT fenced_lock_acquire($1, '30 s', '10 s', permits => 8)"],
                pair(lambda i: "EXECUTE a('permits')", lambda i, t: f"EXECUTE r('permits', {t})")),
            **{f"try_acquire_all + release_all, {k} names": (
                f"all or nothing of {k} names, then all released",
                [f"PREPARE a{k}(text[]) AS SELECT fenced_lock_try_acquire_all($1, '30 s')",
                 f"PREPARE r{k}(text[], bigint[]) AS SELECT fenced_lock_release_all($1, $2)"],
                pair(lambda i, k=k: f"EXECUTE a{k}({names(k, i)})",
                     lambda i, t, k=k: f"EXECUTE r{k}({names(k, i)}, '{t}')", str(k))) for k in (2, 8)},
        })
    return r


def cluster(cmd, *args):
    subprocess.run(["bash", str(HERE.parent / "scripts" / "cluster.sh"), cmd, str(CG), "5560", *args], check=True)


def setup():
    """The scratch cluster with every row's objects, through a server on a
    Unix socket only; returns (the guarded row's token, extension >= 0.3.0,
    its version, why the no-op trigger could not be built or None)."""
    import psycopg
    cluster("stop")
    shutil.rmtree(CG, ignore_errors=True)
    cluster("start", "listen_addresses = ''", "max_wal_size = 2GB")
    so = CG / "noop_trigger.so"
    noop = build_noop_trigger(so)  # None, or why the no-op trigger row is left out
    try:
        with psycopg.connect(f"host={CG} port=5560 dbname={DB} user=postgres", autocommit=True) as c:
            c.execute("CREATE EXTENSION fenced_lock")
            c.execute(open(HERE / "baseline_plpgsql.sql").read())
            c.execute('CREATE TABLE bench_floor (name text COLLATE "C" PRIMARY KEY, token bigint NOT NULL)')
            for t in ("bench_plain", "bench_noop", "bench_guarded"):
                c.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0, fence_token bigint)")
            if noop is None:
                c.execute(f"CREATE FUNCTION bench_noop_trigger() RETURNS trigger LANGUAGE c"
                          f" AS '{so}', 'bench_noop_trigger'")
                c.execute("CREATE TRIGGER noop BEFORE INSERT OR UPDATE OR DELETE ON bench_noop FOR EACH ROW"
                          " EXECUTE FUNCTION bench_noop_trigger()")
            c.execute("CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON bench_guarded FOR EACH ROW"
                      " EXECUTE FUNCTION fenced_lock_guard('item:{id}', 'fence_token')")
            for t in ("sale", "sale_plain"):
                c.execute(f"CREATE TABLE {t} (item int PRIMARY KEY, stock bigint NOT NULL, fence bigint NOT NULL"
                          f" DEFAULT 0)")
                c.execute(f"INSERT INTO {t} (item, stock) VALUES (1, 1000000000)")
            c.execute("CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON sale FOR EACH ROW"
                      " EXECUTE FUNCTION fenced_lock_guard('sale:{item}', 'fence')")
            token = c.execute("SELECT fenced_lock_try_acquire('item:0', '1 day')").fetchone()[0]
            for t in ("bench_plain", "bench_noop", "bench_guarded"):
                c.execute(f"INSERT INTO {t} (id, fence_token) VALUES (0, %s)", (token,))
            v = c.execute("SELECT extversion FROM pg_extension WHERE extname = 'fenced_lock'").fetchone()[0]
            c.execute("VACUUM ANALYZE")
            c.execute("CHECKPOINT")
    finally:
        cluster("stop")
    return token, tuple(int(x) for x in v.split(".")[:3]) >= (0, 3, 0), v, noop


def session(tag, setup_lines, op, first, count):
    # Both sessions of a row start from the same state: no dead rows left by
    # the rows before (single-user mode runs no autovacuum).
    v = Single(f"{tag}_vacuum", callgrind=False)
    v.run("VACUUM")
    v.close()
    s = Single(tag)
    for line in setup_lines:
        s.run(line)
    for i in range(first, first + count):
        op(s, i)
    s.close()
    return s.out


def profile(path):
    """{function [object]: inclusive instructions} from callgrind_annotate."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(path)],
                         capture_output=True, text=True, check=True).stdout
    funcs, total = {}, None
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if not m:
            continue
        n, what = int(m.group(1).replace(",", "")), m.group(2)
        if what == "PROGRAM TOTALS":
            total = n
            continue
        fm = re.match(r"(.*?):(.*) \[(.*)\]$", what)
        if fm:
            fn, obj = fm.group(2), os.path.basename(fm.group(3))
            funcs[f"{fn} [{obj}]"] = funcs.get(f"{fn} [{obj}]", 0) + n
    return total, funcs


def shown(f):
    """In a profile: the extension's own functions (not pgrx's wrappers) and
    PostgreSQL's building blocks (BLOCKS)."""
    fn, _, obj = f.rpartition(" [")
    if "'" in fn:  # a recursive call's second level: already in the first
        return False
    if obj.startswith("fenced_lock"):
        return fn.startswith(("fl_", "fenced_lock::"))
    return fn in BLOCKS


def main():
    if not shutil.which("valgrind") or not shutil.which("callgrind_annotate"):
        save("instructions", {"skipped": "valgrind is not installed", "rows": []})
        return
    CG.mkdir(parents=True, exist_ok=True)
    token, v03, version, noop = setup()
    out = []
    todo = rows(token, v03)
    if noop:
        del todo["UPDATE, no-op C trigger"]
    if SMOKE:  # one row of each kind: plain statements, a pair, a critical section, arrays of names
        todo = {k: v for k, v in todo.items() if k in SMOKE_ROWS}
    for k, (name, (what, lines, op)) in enumerate(todo.items()):
        log(f"instructions: {name} ({WARM} + {N} operations under callgrind)")
        first = 1 + k * 10_000_000  # names never seen before by any row
        base = profile(session(f"r{k}_warm", lines, op, first, WARM))
        full = profile(session(f"r{k}_full", lines, op, first + 1_000_000, WARM + N))
        per_op = (full[0] - base[0]) / N
        diff = {f: (full[1].get(f, 0) - base[1].get(f, 0)) / N for f in full[1]}
        prof = sorted(((f, x) for f, x in diff.items() if shown(f)), key=lambda fx: -fx[1])[:TOP]
        out.append({"row": name, "what": what, "per_op": per_op, "profile": [[f, x] for f, x in prof]})
    save("instructions", {"skipped": None, "version": version, "ops": N, "warm": WARM,
                          "rows": out, "v03": v03, "noop": noop})


if __name__ == "__main__":
    main()
