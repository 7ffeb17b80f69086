"""docs/design.md, "Invariants" 1 and 2: at most one live lease per name at any
moment, and every grant gets a token greater than every token granted before,
never twice.

Many connections hammer a handful of names with try_acquire / renew / release
(some leases are left to expire). Every committed lease change is logged
server-side by a test-only trigger; every token is also recorded client-side.
"""

import random
import time

import it_support

NAMES = [f"core:{i}" for i in range(4)]
WORKERS = 8
CYCLES = 1000
TTLS_MS = [20, 40, 80, 150, 400]


def worker(cluster, db, seed, deadline, log):
    rnd = random.Random(seed)
    held = {}  # name -> token
    finished = []  # leases that release ended or renew found not live: dead for good
    with cluster.connect(db) as conn:
        for _ in range(CYCLES):
            if time.monotonic() > deadline:
                break
            # mostly act on a lease we hold, so that leases change hands often
            name = rnd.choice(list(held)) if held and rnd.random() < 0.7 else rnd.choice(NAMES)
            ttl = f"{rnd.choice(TTLS_MS)} milliseconds"
            if name not in held:
                token = conn.execute("SELECT fenced_lock_try_acquire(%s, %s::interval)", (name, ttl)).fetchone()[0]
                log["acquire_calls"] += 1
                if token is not None:
                    log["tokens"].append(token)
                    held[name] = token
            else:
                token = held[name]
                what = rnd.random()
                if what < 0.3:
                    ok = conn.execute("SELECT fenced_lock_renew(%s, %s, %s::interval)", (name, token, ttl)).fetchone()[0]
                    log["renews"].append(ok)
                    if not ok:  # it expired (maybe taken over): never revived
                        del held[name]
                        finished.append((name, token))
                elif what < 0.85:
                    ok = conn.execute("SELECT fenced_lock_release(%s, %s)", (name, token)).fetchone()[0]
                    log["releases"].append(ok)
                    del held[name]
                    finished.append((name, token))
                else:
                    # walk away: the lease is left to expire
                    del held[name]
            if finished and rnd.random() < 0.1:
                # A lease this worker no longer has is never live again.
                n, t = rnd.choice(finished)
                ok = conn.execute("SELECT fenced_lock_renew(%s, %s)", (n, t)).fetchone()[0]
                log["stale_ops"].append(ok)
            time.sleep(rnd.choice([0, 0.001, 0.003, 0.01, 0.02]))


def test_concurrent_leases_never_overlap_and_tokens_are_unique(cluster, history):
    db = history
    with cluster.connect(db) as conn:
        conn.execute("TRUNCATE public.it_lease_history")

    logs = []
    deadline = time.monotonic() + 45
    calls = []
    for i in range(WORKERS):
        log = dict(tokens=[], renews=[], releases=[], stale_ops=[], acquire_calls=0)
        logs.append(log)
        calls.append(it_support.start(lambda i=i, log=log: worker(cluster, db, 1000 + i, deadline, log),
                                      name=f"worker{i}"))
    for c in calls:
        c.outcome(timeout=60)

    tokens = [t for log in logs for t in log["tokens"]]
    renews = [r for log in logs for r in log["renews"]]
    releases = [r for log in logs for r in log["releases"]]
    stale = [r for log in logs for r in log["stale_ops"]]

    print("grants", len(tokens), "acquire calls", sum(log["acquire_calls"] for log in logs),
          "renews", len(renews), sum(renews), "releases", len(releases), "stale", len(stale))
    # The workload really contended: many grants, many refusals, expiries.
    assert len(tokens) > 300
    assert sum(log["acquire_calls"] for log in logs) > len(tokens)
    # client side: no token handed out twice, all positive
    assert len(tokens) == len(set(tokens))
    assert all(t > 0 for t in tokens)
    # a lease its holder gave up (released, or let expire) is never live again
    assert stale and not any(stale)

    with cluster.connect(db) as conn:
        events = it_support.read_history(conn, NAMES)
        live = conn.execute(
            "SELECT count(*) FROM fenced_lock_leases WHERE name = ANY(%s) AND live", (NAMES,)).fetchone()[0]
        # The lease records left behind are the last grant of each name.
        records = dict(conn.execute(
            "SELECT name, token FROM fenced_lock_internal.granted_leases WHERE name = ANY(%s)", (NAMES,)).fetchall())

    checked = it_support.check_history(events)  # no overlap, tokens increase per name
    # server side and client side agree on every grant, renew and release
    assert sorted(checked.grants) == sorted(tokens)
    assert checked.renews == sum(renews)
    assert checked.releases == sum(releases)
    assert any(not r for r in renews), "some renew should have found its lease expired"
    # leases left to expire were taken over by a later grant of the name
    assert any(e.op == "grant" and e.old_token is not None for e in events)
    assert live <= len(NAMES)
    for name, leases in checked.leases.items():
        if name in records:  # its last lease was not released
            assert records[name] == leases[-1].token
        else:
            assert leases[-1].end < leases[-1].expires_at or leases[-1].end == leases[-1].expires_at
    # tokens are unique across names too, and each name saw many grants
    assert all(len(checked.leases.get(n, [])) > 10 for n in NAMES)
