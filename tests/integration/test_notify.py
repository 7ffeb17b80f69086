"""docs/design.md, "Observability" (watch) and docs/reference.md, "Watching
leases": with fenced_lock.notify = on, every committed grant, release,
force_release, expiry (observed at a takeover) and session_end sends
NOTIFY fenced_lock with the JSON payload {"name", "event", "token"}. A LISTEN
client receives exactly the committed events, in commit order; nothing for
work that rolled back, for renewals (or re-acquires that extend), or from a
session where the setting is off. Only superusers can turn it on: an ordinary
role gets 42501, and a value it set before the library was loaded is
discarded.

The worked example of reference.md as a test: three follower processes
LISTEN; the session-bound leader process is killed with SIGKILL; a follower
reacts to the session_end notification within milliseconds (printed) and
becomes the leader with a larger token; exactly one does.

How "exactly" is checked without sleeping: notifications are delivered in
commit order, so once the listener has seen a marker committed after the
events under test, it has seen every one of them.
"""

import itertools
import json
import signal
import time

import psycopg
import pytest
from psycopg import sql

from it_support import elapsed_ms, one, wait_until

MARKS = itertools.count()


@pytest.fixture
def su(cluster, db):
    """A superuser session with fenced_lock.notify = on."""
    with cluster.connect(db) as conn:
        conn.execute("SET fenced_lock.notify = on")
        yield conn


class Listener:
    def __init__(self, conn):
        self.conn = conn
        self.seen = []
        conn.add_notify_handler(self._got)
        conn.execute("LISTEN fenced_lock")

    def _got(self, n):
        assert n.channel == "fenced_lock"
        payload = json.loads(n.payload)
        assert set(payload) == {"name", "event", "token", "mode"}, n.payload
        assert payload["mode"] in ("exclusive", "shared", "permit"), n.payload
        self.seen.append((payload["name"], payload["event"], payload["token"]))

    def until_marker(self, su, timeout=5):
        """Commit a marker (a grant and release by `su`), wait for it, and
        return (and forget) every event received before it."""
        name = f"marker:{next(MARKS)}"
        token = su.execute("SELECT fenced_lock_try_acquire(%s, '1 min')", (name,)).fetchone()[0]
        assert su.execute("SELECT fenced_lock_release(%s, %s)", (name, token)).fetchone()[0] is True
        want = [(name, "grant", token), (name, "release", token)]
        deadline = time.monotonic() + timeout
        while want[0] not in self.seen or want[1] not in self.seen:
            assert time.monotonic() < deadline, f"the marker never arrived; seen {self.seen}"
            self.conn.execute("SELECT 1")  # lets psycopg read what has arrived
            time.sleep(0.005)
        i = self.seen.index(want[0])
        assert self.seen[i:i + 2] == want, self.seen
        before, self.seen = self.seen[:i], self.seen[i + 2:]
        return before


@pytest.fixture
def listener(cluster, db):
    with cluster.connect(db) as conn:
        yield Listener(conn)


def test_listener_receives_exactly_the_committed_events_in_commit_order(cluster, db, su, listener):
    listener.until_marker(su)
    with cluster.connect(db) as b:
        b.execute("SET fenced_lock.notify = on")
        events = []

        t = one(su, "SELECT fenced_lock_try_acquire('ev:a', '1 min', 'h')")
        events.append(("ev:a", "grant", t))
        assert one(su, "SELECT fenced_lock_renew('ev:a', %s, '2 min')", (t,)) is True  # nothing
        assert one(b, "SELECT fenced_lock_try_acquire('ev:a', '1 min', 'h')") == t  # extend: nothing
        assert one(b, "SELECT fenced_lock_release('ev:a', %s)", (t,)) is True
        events.append(("ev:a", "release", t))

        t = one(su, "SELECT fenced_lock_acquire('ev:f', '1 min', '1 s')")
        events.append(("ev:f", "grant", t))
        assert one(b, "SELECT fenced_lock_force_release('ev:f')") is True
        events.append(("ev:f", "force_release", t))

        t = one(su, "SELECT fenced_lock_try_acquire('ev:e', '200 ms')")
        events.append(("ev:e", "grant", t))
        wait_until(lambda: not one(b, "SELECT live FROM fenced_lock_leases WHERE name = 'ev:e'"), 5, interval=0.02,
                   what="the lease to expire")
        t2 = one(b, "SELECT fenced_lock_try_acquire('ev:e', '1 min')")  # takeover: expiry, then grant
        events += [("ev:e", "expiry", t), ("ev:e", "grant", t2)]

        s = cluster.connect(db)
        s.execute("SET fenced_lock.notify = on")
        t = one(s, "SELECT fenced_lock_try_acquire('ev:s', '1 min', NULL, true)")
        events.append(("ev:s", "grant", t))
        s.close()  # the exiting backend ends the lease
        wait_until(lambda: one(b, "SELECT count(*) FROM fenced_lock_leases WHERE name = 'ev:s'") == 0, 5,
                   interval=0.01, what="the session's lease to end")
        events.append(("ev:s", "session_end", t))

        # rolled back: nothing
        su.execute("BEGIN")
        one(su, "SELECT fenced_lock_try_acquire('ev:rb', '1 min')")
        su.execute("ROLLBACK")
        su.execute("BEGIN")
        su.execute("SAVEPOINT s")
        one(su, "SELECT fenced_lock_try_acquire('ev:rb_sub', '1 min')")
        su.execute("ROLLBACK TO SAVEPOINT s")
        t = one(su, "SELECT fenced_lock_try_acquire('ev:kept', '1 min')")
        su.execute("COMMIT")
        events.append(("ev:kept", "grant", t))
        tk = one(su, "SELECT fenced_lock_try_acquire('ev:rb_release', '1 min')")
        events.append(("ev:rb_release", "grant", tk))
        su.execute("BEGIN")
        assert one(su, "SELECT fenced_lock_release('ev:rb_release', %s)", (tk,)) is True
        su.execute("ROLLBACK")

        # commit order, not call order: x is granted first, y commits first
        su.execute("BEGIN")
        tx = one(su, "SELECT fenced_lock_try_acquire('ev:x', '1 min')")
        b.execute("BEGIN")
        ty = one(b, "SELECT fenced_lock_try_acquire('ev:y', '1 min')")
        b.execute("COMMIT")
        su.execute("COMMIT")
        events += [("ev:y", "grant", ty), ("ev:x", "grant", tx)]

        assert listener.until_marker(su) == events


def test_nothing_is_sent_when_notify_is_off(cluster, db, su, listener):
    listener.until_marker(su)
    with cluster.connect(db) as off:
        t = one(off, "SELECT fenced_lock_try_acquire('off:a', '1 min')")
        assert one(off, "SHOW fenced_lock.notify") == "off"  # the default
        assert one(off, "SELECT fenced_lock_release('off:a', %s)", (t,)) is True
        t = one(off, "SELECT fenced_lock_try_acquire('off:b', '1 min', NULL, true)")
        assert one(off, "SELECT fenced_lock_force_release('off:b')") is True
        s = cluster.connect(db)
        one(s, "SELECT fenced_lock_try_acquire('off:s', '1 min', NULL, true)")
        s.close()
        wait_until(lambda: one(off, "SELECT count(*) FROM fenced_lock_leases WHERE name = 'off:s'") == 0, 5,
                   interval=0.01, what="the session's lease to end")
    assert listener.until_marker(su) == []


def test_an_ordinary_role_cannot_turn_notify_on(cluster, db, su, listener, execute_only_role):
    role = execute_only_role()
    listener.until_marker(su)
    # after the library is loaded: refused
    with cluster.connect(db, user=role) as r:
        one(r, "SELECT fenced_lock_validate('role:load', 1)")
        for stmt in ("SET fenced_lock.notify = on", "SELECT set_config('fenced_lock.notify', 'on', false)"):
            with pytest.raises(psycopg.Error) as err:
                r.execute(stmt)
            assert err.value.sqlstate == "42501", stmt
        assert one(r, "SHOW fenced_lock.notify") == "off"
        t = one(r, "SELECT fenced_lock_try_acquire('role:a', '1 min')")
        assert one(r, "SELECT fenced_lock_release('role:a', %s)", (t,)) is True
    # before it is loaded (a placeholder), or in the connection options: discarded when it loads
    for how in ("set", "options"):
        kw = {"options": "-c fenced_lock.notify=on"} if how == "options" else {}
        with cluster.connect(db, user=role, **kw) as r:
            if how == "set":
                r.execute("SET fenced_lock.notify = on")
            t = one(r, "SELECT fenced_lock_try_acquire('role:b', '1 min')")
            assert one(r, "SHOW fenced_lock.notify") == "off", how
            assert one(r, "SELECT fenced_lock_release('role:b', %s)", (t,)) is True
    assert listener.until_marker(su) == []
    # ALTER ROLE ... SET by the role itself is refused as well
    with cluster.connect(db, user=role) as r:
        one(r, "SELECT fenced_lock_validate('role:load', 1)")
        with pytest.raises(psycopg.Error) as err:
            r.execute(sql.SQL("ALTER ROLE {} SET fenced_lock.notify = on").format(sql.Identifier(role)))
        assert err.value.sqlstate == "42501"


# -- a worked example: leader election ------------------------------------------------------

LEADER = '''
conn.execute("SET fenced_lock.notify = on")
token = conn.execute("SELECT fenced_lock_try_acquire(%s, '15 s', %s, session_bound => true)",
                     (ARGS["name"], ARGS["node"])).fetchone()[0]
say("leader" if token else "refused", token=token)
time.sleep(600)
'''

FOLLOWER = '''
conn.execute("SET fenced_lock.notify = on")
conn.execute("LISTEN fenced_lock")


def attempt():
    return conn.execute("SELECT fenced_lock_try_acquire(%s, '15 s', %s, session_bound => true)",
                        (ARGS["name"], ARGS["node"])).fetchone()[0]


token = attempt()
if token is None:
    say("following")
    for n in conn.notifies():            # blocks until the next change
        event = json.loads(n.payload)
        if event["name"] == ARGS["name"] and event["event"] != "grant":
            say("saw", what=event["event"], token=event["token"])
            token = attempt()            # the leader is gone: try again
            if token is not None:
                break
say("leader", token=token)
time.sleep(600)                          # lead (stamp leader-only writes with token)
'''


def test_leader_election_followers_take_over_within_milliseconds_of_the_leader_dying(cluster, db, children):
    name = "election:billing"
    dsn = cluster.dsn(db)
    leader = children.start(dsn, LEADER, name=name, node="node-0")
    first = leader.expect("leader", 10)["token"]
    followers = [children.start(dsn, FOLLOWER, name=name, node=f"node-{i}") for i in (1, 2, 3)]
    for f in followers:
        f.expect("following", 10)
    with cluster.connect(db) as mon:
        # every follower is listening before the leader dies
        wait_until(lambda: one(mon, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s) AND state = 'idle'",
                               ([f.backend_pid for f in followers],)) == 3, 10, what="the followers to idle")
        killed = leader.kill(signal.SIGKILL)
        outcomes = []
        for f in followers:
            saw = f.expect("saw", 5)
            assert (saw["what"], saw["token"]) == ("session_end", first)
            outcomes.append((f, saw, f.message(1.0)))
        new_leaders = [(f, m) for f, _, m in outcomes if m is not None and m["event"] == "leader"]
        assert len(new_leaders) == 1, [m for _, _, m in outcomes]
        f, msg = new_leaders[0]
        reaction = [elapsed_ms(killed, saw["t"]) for _, saw, _ in outcomes]
        takeover = elapsed_ms(killed, msg["t"])
        print(f"leader election: followers saw session_end {', '.join(f'{r:.1f}' for r in reaction)} ms after the "
              f"leader was killed; the new leader held the lock {takeover:.1f} ms after the kill")
        assert takeover < 2000
        assert msg["token"] > first
        assert mon.execute("SELECT token, holder, live, session_bound FROM fenced_lock_leases WHERE name = %s",
                           (name,)).fetchone() == (msg["token"], f.args["node"], True, True)
        assert one(mon, "SELECT ended_by FROM fenced_lock_history WHERE token = %s", (first,)) == "session_end"
        # the others keep following: their attempt got NULL
        for other, _, m in outcomes:
            if other is not f:
                assert m is None, m
                assert other.alive()
