"""Table 5: waiting, every figure from flbench (bench/client).

5a. Handoff: waiters + 1 clients (tasks of one process, own connections)
    contend for one name: take it, hold it 5 ms, release it, work 2 ms, queue
    again. Each call reads the server's clock_timestamp() right after it (in
    the same statement, before its commit). Handoff of a release = the grant
    of the first client that was already waiting when it happened, minus the
    release; releases with nobody waiting are not counted. fenced_lock_acquire
    beside the simplest alternative, a try_acquire loop with backoff from 10 ms
    doubling to 500 ms.
5b. CPU of idle waiters: 100 clients wait 10 s for a lock held all along; CPU
    time of their backends and of the client process (from
    /proc/<pid>/task/*/schedstat), as % of one core.
5c. A holder process with a session-bound lease is killed (SIGKILL); time
    until a waiter queued on another connection is granted.
"""

from benchlib import DURABLE, RUNS, SMOKE, dsn, flbench, fresh_database, interleaved, log, save, summary
from costs import Meter, summarize_costs

DB = "bench_wait"
WAITERS = [3] if SMOKE else [1, 10, 100]
WAIT_RUNS = 1 if SMOKE else min(RUNS, 3)
TRIALS = 20 if SMOKE else 500  # handoffs measured per run
CPU_WAITERS = 5 if SMOKE else 100
CPU_SECONDS = 0.5 if SMOKE else 10
KILL_TRIALS = 2 if SMOKE else 20
METHODS = {
    "queue": "fenced_lock_acquire (FIFO queue, asleep)",
    "backoff": "try_acquire loop, backoff 10 ms doubling to 500 ms",
}


def handoffs():
    rows = []
    meter = Meter()
    for waiters in WAITERS:
        log(f"waiting: handoff, {waiters} waiter(s)")
        runs = interleaved(list(METHODS), lambda m: flbench("handoff", dsn=dsn(DB), waiters=waiters,
                                                            trials=TRIALS, method=m, meter=meter, servers=["pg"]),
                           WAIT_RUNS)
        for m in METHODS:
            rows.append({"method": METHODS[m], "queue": m == "queue", "waiters": waiters,
                         **{f: summary([r[k] for r in runs[m]])
                            for f, k in (("p50", "p50_ms"), ("p99", "p99_ms"), ("mean_waiting", "mean_waiting"))},
                         "handoffs": sum(r["handoffs"] for r in runs[m]), "costs": summarize_costs(runs[m])})
    meter.close()
    return rows


def cpu():
    log(f"waiting: CPU of {CPU_WAITERS} idle waiters over {CPU_SECONDS} s")
    runs = interleaved(list(METHODS), lambda m: flbench("idle-cpu", dsn=dsn(DB), waiters=CPU_WAITERS,
                                                        seconds=CPU_SECONDS, method=m), WAIT_RUNS)
    return [{"method": METHODS[m], "queue": m == "queue", "waiters": CPU_WAITERS, "seconds": CPU_SECONDS,
             **{f: summary([r[f + "_pct"] for r in runs[m]]) for f in ("backends", "client", "total")}}
            for m in METHODS]


def session_kill():
    log(f"waiting: session-bound holder killed, {KILL_TRIALS} trials")
    r = flbench("session-kill", dsn=dsn(DB), trials=KILL_TRIALS)
    return r if r["available"] else {"available": False, "reason": r["reason"]}


def main():
    fresh_database(DB)
    save("waiting", {"durability": DURABLE, "hold_ms": 5, "think_ms": 2, "trials": TRIALS,
                     "handoff": handoffs(), "cpu": cpu(), "session_kill": session_kill()})


if __name__ == "__main__":
    main()
