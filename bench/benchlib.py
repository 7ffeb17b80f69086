"""What every benchmark script shares: mode, the server, pgbench, flbench,
statistics.

Modes (environment):
  FL_BENCH_SMOKE=1   run every code path once with tiny counts; numbers are meaningless
  FL_BENCH_RUNS      repetitions of each measurement in full mode (default 5)
  FL_BENCH_SECONDS   seconds per pgbench/flbench run in full mode (default 4)
Every measurement is repeated RUNS times, the rows of one table interleaved
(run 1 of every row, then run 2, ...), so slow drift on a shared machine hits
all rows alike; tables show the median and the min-max over the runs.
"""

import glob
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

SMOKE = os.environ.get("FL_BENCH_SMOKE", "") not in ("", "0")
RUNS = 1 if SMOKE else int(os.environ.get("FL_BENCH_RUNS", "5"))
SECONDS = int(os.environ.get("FL_BENCH_SECONDS", "4"))
SMOKE_TX = 30  # pgbench transactions (flbench pairs) per client in smoke mode

HERE = Path(__file__).resolve().parent
WORK = Path(os.environ.get("FL_BENCH_WORK", "/tmp/fenced_lock_tests/bench_work"))
PG_PORT = 5560
PG_BINDIR = os.environ.get("PG_BINDIR", "/usr/lib/postgresql/15/bin")  # set by run.sh
PGBENCH = os.path.join(PG_BINDIR, "pgbench")
PSQL = os.path.join(PG_BINDIR, "psql")
FLBENCH = HERE / "client" / "target" / "release" / "flbench"  # built by run.sh
DURABLE = "fsync=on, synchronous_commit=on"


def dsn(db):
    return f"host=127.0.0.1 port={PG_PORT} dbname={db} user=postgres"


def connect(db, **kw):
    return psycopg.connect(dsn(db), autocommit=True, **kw)


def fresh_database(db, extension=True):
    """Drop and create `db` (with fenced_lock), so each section starts clean."""
    with connect("postgres") as c:
        c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{db}"')
    if extension:
        with connect(db) as c:
            c.execute("CREATE EXTENSION fenced_lock")


def database_setting(db, name, value):
    """ALTER DATABASE db SET name = value for a fenced_lock setting, checked
    in a new session. False if this build of fenced_lock has no such setting
    (its settings exist once the library is loaded)."""
    with connect(db) as c:
        c.execute("LOAD 'fenced_lock'")
        if not c.execute("SELECT 1 FROM pg_settings WHERE name = %s", (name,)).fetchone():
            return False
        c.execute(f'ALTER DATABASE "{db}" SET {name} = {value}')
    with connect(db) as c:
        c.execute("LOAD 'fenced_lock'")
        got = c.execute("SELECT setting FROM pg_settings WHERE name = %s", (name,)).fetchone()[0]
    if got != str(value):
        raise RuntimeError(f"{name} is {got!r} in {db}, not {value}")
    return True


def run_sql_file(db, path):
    subprocess.run([PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", "SET client_min_messages = warning",
                    "-d", dsn(db), "-f", str(path)], check=True, stdout=subprocess.DEVNULL)


def build_noop_trigger(so):
    """noop_trigger.c built against this server's headers into `so`: None,
    or why not (no C compiler, no headers)."""
    import shutil
    inc = subprocess.run([os.path.join(PG_BINDIR, "pg_config"), "--includedir-server"],
                         capture_output=True, text=True).stdout.strip()
    if not os.path.exists(os.path.join(inc, "postgres.h")):
        inc = "/usr/include/postgresql/15/server"  # a relocated server without its headers: Debian's, same major
    cc = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if cc is None:
        return "no C compiler"
    out = subprocess.run([cc, "-O2", "-fPIC", "-shared", "-I", inc, "-o", str(so), str(HERE / "noop_trigger.c")],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return f"noop_trigger.c did not build ({out.stderr.strip()[:200]})"
    os.chmod(so, 0o755)
    return None


# -- statistics ---------------------------------------------------------------

def percentile(values, p):
    """Nearest-rank percentile of a non-empty list."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))
    return s[k]


def summary(values):
    """Median and spread of per-run figures."""
    v = [x for x in values if x is not None]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}


# -- pgbench ------------------------------------------------------------------

def pgbench(db, script, clients, defines=None, seconds=None, tag="run", statements=False, options=None):
    """One pgbench run of `script` (path); returns tps, the transactions
    done (n) and latency percentiles (ms) of the whole script from pgbench's
    per-transaction log; with `statements`, also each statement's mean
    latency (ms), by its first word after SELECT (e.g.
    "fenced_lock_try_acquire"). `options` go to every session (PGOPTIONS,
    e.g. "-c synchronous_commit=off")."""
    WORK.mkdir(parents=True, exist_ok=True)
    prefix = WORK / f"pgb_{tag}"
    for f in glob.glob(f"{prefix}.*"):
        os.unlink(f)
    args = [PGBENCH, "-n", "-M", "prepared", "-h", "127.0.0.1", "-p", str(PG_PORT), "-U", "postgres",
            "-c", str(clients), "-j", str(clients), "-f", str(script), "-l", f"--log-prefix={prefix}"]
    if SMOKE:
        args += ["-t", str(SMOKE_TX)]
    else:
        args += ["-T", str(seconds or SECONDS)]
    for k, v in (defines or {}).items():
        args += ["-D", f"{k}={v}"]
    if statements:
        args.append("-r")
    args.append(db)
    env = dict(os.environ, PGOPTIONS=options) if options else None
    out = subprocess.run(args, capture_output=True, text=True, env=env)
    if out.returncode != 0 or "aborted" in out.stdout + out.stderr:
        raise RuntimeError(f"pgbench {script} failed:\n{out.stdout}\n{out.stderr}")
    tps = None
    stmt = {}
    in_statements = False
    for line in out.stdout.splitlines():
        if line.startswith("tps = "):
            tps = float(line.split()[2])
        elif line.startswith("statement latencies"):
            in_statements = True
        elif in_statements:
            # "     0.250           0  SELECT fenced_lock_try_acquire('new:' || ..."
            parts = line.split(None, 2)
            if len(parts) == 3 and parts[2].startswith("SELECT "):
                stmt[parts[2].split()[1].split("(")[0]] = float(parts[0])
    lat = []
    for f in glob.glob(f"{prefix}.*"):
        with open(f) as fh:
            lat.extend(int(line.split()[2]) / 1000.0 for line in fh)
        os.unlink(f)
    if tps is None or not lat:
        raise RuntimeError(f"pgbench {script}: no result\n{out.stdout}")
    res = {"tps": tps, "p50": percentile(lat, 50), "p99": percentile(lat, 99), "n": len(lat)}
    if statements:
        res["statements"] = stmt
    return res


# -- flbench ------------------------------------------------------------------

def check_flbench(res, argv):
    """A flbench result whose run had a failed call fails the bench: a broken
    run must not produce a figure."""
    if res.get("errors"):
        raise RuntimeError(f"{' '.join(map(str, argv[1:]))}: {res['errors']} errors, the last: {res.get('error')}")
    return res


def flbench(cmd, *args, meter=None, servers=(), **opts):
    """One run of the compiled client (bench/client); its JSON line as a dict.
    Options are given as keywords (waiters=10 -> --waiters 10). With a meter
    (costs.Meter), the run is measured over its window on `servers` and the
    result has its "costs"."""
    argv = [str(FLBENCH), cmd, *map(str, args)]
    for k, v in opts.items():
        argv += [f"--{k}", str(v)]
    if meter is not None:
        return meter.flbench(argv, servers)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[1:])} failed:\n{out.stderr}")
    return check_flbench(json.loads(out.stdout.strip().splitlines()[-1]), argv)


def flbench_pairs(cmd, *args, clients, meter=None, servers=()):
    """A pairs run (pairs-pg/-redis/-etcd) at `clients` clients, in the shape
    pgbench() returns: pairs/s, pairs done (n) and p50/p99 of a pair in ms,
    with its costs if measured."""
    length = {"count": SMOKE_TX} if SMOKE else {"seconds": SECONDS}
    r = flbench(cmd, *args, clients=clients, meter=meter, servers=servers, **length)
    out = {"tps": r["per_s"], "p50": r["p50_ms"], "p99": r["p99_ms"], "n": r["count"]}
    return dict(out, costs=r["costs"]) if "costs" in r else out


def interleaved(configs, run_one, runs=None):
    """Run every config `runs` times, round-robin. `configs` is a list of keys;
    returns {key: [result of each run]}."""
    results = {k: [] for k in configs}
    for _ in range(runs or RUNS):
        for k in configs:
            results[k].append(run_one(k))
    return results


def summarize_runs(runs, fields=("tps", "p50", "p99")):
    """Each field's summary; its "runs" keep the run order, so that report.py
    can pair rows run by run (neighbours in the interleaved order)."""
    return {f: summary([r[f] for r in runs]) for f in fields}


# -- results ------------------------------------------------------------------

def save(section, data):
    WORK.mkdir(parents=True, exist_ok=True)
    data = dict(data, section=section, smoke=SMOKE, runs=RUNS,
                seconds=None if SMOKE else SECONDS, finished=time.strftime("%Y-%m-%d %H:%M:%S"))
    (WORK / f"{section}.json").write_text(json.dumps(data, indent=1))


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
