"""Table 5: waiting (SPEC §6). fenced_lock_acquire (FIFO queue, asleep)
beside the simplest alternative, a client loop of fenced_lock_try_acquire
with exponential backoff (10 ms doubling to 500 ms), in the same run.

5a. Handoff latency: N+1 clients (threads, one connection each) contend for
    one name: take the lock, hold it 5 ms, release it, do 2 ms of other
    work, queue again (so the lock is always in demand). A history trigger on fenced_lock_internal.leases,
    installed by the bench as superuser, records on the server's clock when
    each lease was released (its DELETE, before that commit) and granted (its
    acquired_at). Handoff of a release = the grant of the first client that
    was already waiting when it happened, minus the release. Releases with
    nobody waiting are not counted.
5b. CPU while waiting: 100 clients wait 10 s for a lock held all along;
    CPU time (utime+stime, read at ns precision from /proc/<pid>/schedstat)
    of their 100 backends and of the client process holding their 100
    threads, as % of one core.
"""

import multiprocessing as mp
import os
import threading
import time

import psycopg

from benchlib import DURABLE, RUNS, SECONDS, SMOKE, connect, dsn, fresh_database, log, percentile, save, summary

DB = "bench_wait"
WAITERS = [3] if SMOKE else [1, 10, 100]
HANDOFF_RUNS = 1 if SMOKE else min(RUNS, 3)
HANDOFF_SECONDS = 0.5 if SMOKE else 3
CPU_WAITERS = 5 if SMOKE else 100
CPU_SECONDS = 0.5 if SMOKE else 10
CPU_RUNS = 1 if SMOKE else min(RUNS, 3)
HOLD = 0.005
THINK = 0.002
BACKOFF_START, BACKOFF_MAX = 0.010, 0.500
METHODS = {
    "queue": "fenced_lock_acquire (FIFO queue, asleep)",
    "backoff": "try_acquire loop, backoff 10 ms doubling to 500 ms",
}


class BlockingConnection(psycopg.Connection):
    """psycopg 3.1 wakes every 100 ms while it waits for a result (to notice
    Ctrl-C); a client that waits should cost nothing, so wait in one select()."""

    def wait(self, gen, timeout=None):
        return super().wait(gen, timeout=None)


def open_conn():
    return BlockingConnection.connect(dsn(DB), autocommit=True)


HISTORY = """
CREATE TABLE bench_history (at timestamptz NOT NULL, op text NOT NULL, token bigint NOT NULL,
                            acquired_at timestamptz NOT NULL);
CREATE FUNCTION bench_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    INSERT INTO public.bench_history VALUES (clock_timestamp(), 'release', OLD.token, OLD.acquired_at);
  ELSIF TG_OP = 'INSERT' OR NEW.token <> OLD.token THEN
    INSERT INTO public.bench_history VALUES (clock_timestamp(), 'grant', NEW.token, NEW.acquired_at);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER bench_history AFTER INSERT OR UPDATE OR DELETE ON fenced_lock_internal.leases
  FOR EACH ROW EXECUTE FUNCTION public.bench_record();
"""


def take(conn, method, name):
    """Wait for `name` by `method` until granted; the token."""
    if method == "queue":
        return conn.execute("SELECT fenced_lock_acquire(%s, '30 s', '5 min')", (name,),
                            prepare=True).fetchone()[0]
    delay = BACKOFF_START
    while True:
        tok = conn.execute("SELECT fenced_lock_try_acquire(%s, '30 s')", (name,), prepare=True).fetchone()[0]
        if tok is not None:
            return tok
        time.sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX)


def contender(method, name, stop, waits, errors):
    try:
        with open_conn() as conn:
            while not stop.is_set():
                started = time.time()
                tok = take(conn, method, name)
                waits.append((threading.get_ident(), started, tok))
                time.sleep(HOLD)
                if not conn.execute("SELECT fenced_lock_release(%s, %s)", (name, tok)).fetchone()[0]:
                    raise RuntimeError(f"release of {tok} failed")
                time.sleep(THINK)
    except BaseException as e:
        errors.append(repr(e))


def handoff_run(method, waiters, tag):
    name = f"handoff:{tag}"
    stop, waits, errors = threading.Event(), [], []
    threads = [threading.Thread(target=contender, args=(method, name, stop, waits, errors))
               for _ in range(waiters + 1)]
    for t in threads:
        t.start()
    time.sleep(0.2 if SMOKE else 1.0)   # connections made, backoff in its steady state
    t_start = time.time()
    time.sleep(HANDOFF_SECONDS)
    t_stop = time.time()
    stop.set()
    for t in threads:
        t.join(timeout=120)
    if errors or any(t.is_alive() for t in threads):
        raise RuntimeError(f"waiting: {method} with {waiters} waiters failed: {errors}")

    with connect(DB) as c:
        toks = [w[2] for w in waits]
        hist = c.execute("SELECT op, token, extract(epoch FROM at)::float8, extract(epoch FROM acquired_at)::float8"
                         " FROM bench_history WHERE token = ANY(%s)", (toks,)).fetchall()
    granted = {tok: acq for op, tok, _, acq in hist if op == "grant"}
    released = {tok: at for op, tok, at, _ in hist if op == "release"}
    who = {tok: (thread, started) for thread, started, tok in waits}
    # each client's waits: (thread, started waiting, granted at)
    intervals = [(th, st, granted[tok]) for tok, (th, st) in who.items()]
    handoffs, waiting_counts = [], []
    for tok, r in released.items():
        if not t_start <= r <= t_stop:
            continue
        releaser = who[tok][0]
        waiting = [g for th, st, g in intervals if th != releaser and st < r < g]
        if waiting:
            handoffs.append((min(waiting) - r) * 1000.0)
            waiting_counts.append(len(waiting))
    if not handoffs:
        raise RuntimeError(f"waiting: no handoff measured ({method}, {waiters} waiters)")
    return {"p50": percentile(handoffs, 50), "p99": percentile(handoffs, 99), "n": len(handoffs),
            "mean_waiting": sum(waiting_counts) / len(waiting_counts)}


def handoffs():
    rows = []
    for waiters in WAITERS:
        log(f"waiting: handoff, {waiters} waiter(s)")
        runs = {m: [] for m in METHODS}
        for i in range(HANDOFF_RUNS):
            for m in METHODS:
                runs[m].append(handoff_run(m, waiters, f"{m}:{waiters}:{i}"))
        for m in METHODS:
            rows.append({"method": METHODS[m], "waiters": waiters,
                         **{f: summary([r[f] for r in runs[m]]) for f in ("p50", "p99", "mean_waiting")},
                         "handoffs": sum(r["n"] for r in runs[m])})
    return rows


# -- CPU while waiting --------------------------------------------------------

def cpu_ns(pid):
    """CPU time used by all threads of `pid`, in ns: the kernel's runtime
    counter, the one behind utime+stime in /proc/<pid>/stat, read from
    schedstat because stat rounds each process down to 10 ms ticks, which
    turns 100 nearly idle processes into a plain zero."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            pass
    return total


def waiter_process(method, name, n, pids, started):
    """Child process: n threads, each on its own connection, wait for `name`;
    once granted, release at once and finish."""
    errors = []

    def one():
        try:
            with open_conn() as conn:
                pids.put(conn.info.backend_pid)
                started.release()
                tok = take(conn, method, name)
                conn.execute("SELECT fenced_lock_release(%s, %s)", (name, tok))
        except BaseException as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os._exit(1 if errors else 0)


def cpu_run(method, tag):
    name = f"held:{tag}"
    ctx = mp.get_context("fork")
    pids, started = ctx.Queue(), ctx.Semaphore(0)
    with connect(DB) as c:
        tok = c.execute("SELECT fenced_lock_try_acquire(%s, '10 min')", (name,)).fetchone()[0]
        child = ctx.Process(target=waiter_process, args=(method, name, CPU_WAITERS, pids, started))
        child.start()
        for _ in range(CPU_WAITERS):
            if not started.acquire(timeout=60):
                raise RuntimeError("waiting: waiters did not start")
        backends = [pids.get(timeout=10) for _ in range(CPU_WAITERS)]
        # all of them inside their first wait
        deadline = time.time() + 30
        while c.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s) AND state = 'active'",
                        (backends,)).fetchone()[0] < CPU_WAITERS and method == "queue":
            if time.time() > deadline:
                raise RuntimeError("waiting: waiters did not queue")
            time.sleep(0.05)
        time.sleep(0.1 if SMOKE else 0.5)
        procs = backends + [child.pid]
        before = {p: cpu_ns(p) for p in procs}
        t0 = time.monotonic()
        time.sleep(CPU_SECONDS)
        after = {p: cpu_ns(p) for p in procs}
        elapsed = time.monotonic() - t0
        c.execute("SELECT fenced_lock_release(%s, %s)", (name, tok))
    child.join(timeout=120)
    if child.exitcode != 0:
        child.kill()
        raise RuntimeError(f"waiting: {method} waiters failed")
    pct = lambda ps: 100.0 * sum(after[p] - before[p] for p in ps) / 1e9 / elapsed
    return {"backends": pct(backends), "client": pct([child.pid]), "total": pct(procs)}


def cpu():
    log(f"waiting: CPU of {CPU_WAITERS} waiters over {CPU_SECONDS} s")
    runs = {m: [] for m in METHODS}
    for i in range(CPU_RUNS):
        for m in METHODS:
            runs[m].append(cpu_run(m, f"{m}:{i}"))
    return [{"method": METHODS[m], "waiters": CPU_WAITERS, "seconds": CPU_SECONDS,
             **{f: summary([r[f] for r in runs[m]]) for f in ("backends", "client", "total")}}
            for m in METHODS]


def main():
    fresh_database(DB)
    with connect(DB) as c:
        c.execute(HISTORY)
    save("waiting", {"durability": DURABLE, "hold_ms": HOLD * 1000, "think_ms": THINK * 1000,
                     "handoff": handoffs(), "cpu": cpu()})


if __name__ == "__main__":
    main()
