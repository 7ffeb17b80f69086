#!/usr/bin/env python3
"""Leader election with fenced_lock (docs/reference.md, "Leader election").

Run one process per node, all with the same --election:

    python3 examples/leader_election.py --dsn "host=db dbname=app user=app" \\
        --election billing:leader --node node-1 --address 10.0.0.1:8080

Every node campaigns and follows at the same time, on two connections:

- Campaign: fenced_lock_acquire(election, ttl, wait, holder => node,
  session_bound => true), in a loop (55P03 when `wait` runs out: ask again).
  Granted, the node leads: it publishes its address with fenced_lock_proclaim,
  renews its lease at a third of the ttl, and stamps its leader-only writes
  with its token (here: a heartbeat row in the guarded table
  leader_heartbeat). A write refused with FL001, a renew that returns false
  or a lost connection means it was deposed: it stops acting as the leader at
  once and campaigns again. Because the lease is session-bound, a leader whose
  process dies (or whose connection drops) is replaced within milliseconds,
  not after its ttl.
- Follow: LISTEN fenced_lock first, then read fenced_lock_leader(election);
  on every notification about the election, read it again (the payload says
  what happened, the read says what is true now); after a reconnect, start
  over with LISTEN and read again, since notifications sent while
  disconnected are lost.

Notifications are sent only where fenced_lock.notify is on, which only a
superuser can set, for example once for the database:

    ALTER DATABASE app SET fenced_lock.notify = on;

--setup creates the guarded heartbeat table (run it once, as the role that
will own the table) and exits. The application role needs EXECUTE on
fenced_lock_acquire, fenced_lock_renew, fenced_lock_release,
fenced_lock_proclaim and fenced_lock_leader, and INSERT/UPDATE/SELECT on
leader_heartbeat.

Output: one JSON object per line on stdout, each with "event", "node" and
"t" (time.monotonic() of this process; CLOCK_MONOTONIC is system-wide on
Linux, so tests/integration/test_leader.py compares it with its own):

    {"event": "campaigning"}
    {"event": "elected", "token": T}
    {"event": "proclaimed", "token": T, "value": ADDRESS}
    {"event": "deposed", "token": T, "why": "..."}
    {"event": "following", "backend_pid": P}     listening, after every (re)connect
    {"event": "leader", "holder": H, "token": T, "value": V, "why": "read" | "reconnect" | "notify", "on": EVENT}
                                                  what fenced_lock_leader says: after every
                                                  (re)connect, and after a notification that
                                                  changed it (holder null: no leader)
    {"event": "disconnected", "connection": "follow" | "campaign", "error": "..."}
"""

import argparse
import json
import sys
import threading
import time

import psycopg

TABLE_DDL = """
CREATE TABLE IF NOT EXISTS leader_heartbeat (
    election    text PRIMARY KEY,
    node        text NOT NULL,
    address     text,
    beats       bigint NOT NULL,
    fence_token bigint
);
SELECT fenced_lock_protect('leader_heartbeat', '{election}');
"""

HEARTBEAT = """
INSERT INTO leader_heartbeat AS h (election, node, address, beats, fence_token)
VALUES (%(election)s, %(node)s, %(address)s, 1, %(token)s)
ON CONFLICT (election) DO UPDATE
   SET node = EXCLUDED.node, address = EXCLUDED.address, fence_token = EXCLUDED.fence_token,
       beats = CASE WHEN h.fence_token = EXCLUDED.fence_token THEN h.beats + 1 ELSE 1 END
"""

_print_lock = threading.Lock()


class Node:
    def __init__(self, args):
        self.args = args
        self.election = args.election

    def emit(self, event, **fields):
        fields = dict(event=event, node=self.args.node, **fields, t=time.monotonic())
        with _print_lock:
            sys.stdout.write(json.dumps(fields) + "\n")
            sys.stdout.flush()

    def connect(self):
        return psycopg.connect(self.args.dsn, autocommit=True, connect_timeout=10,
                               application_name=f"leader_election:{self.args.node}")

    # -- campaign and lead -------------------------------------------------------------

    def campaign_forever(self):
        while True:
            try:
                with self.connect() as conn:
                    while True:
                        token = self.campaign(conn)
                        self.lead(conn, token)
            except psycopg.Error as e:  # the connection is lost (a session-bound lease with it), or worse
                self.emit("disconnected", connection="campaign",
                          error=f"{e.sqlstate}: " + str(e).strip().splitlines()[0])
                time.sleep(self.args.reconnect_delay)

    def campaign(self, conn):
        """Wait (in line, asleep) until this node holds the election's lease."""
        self.emit("campaigning")
        while True:
            try:
                token = conn.execute(
                    "SELECT fenced_lock_acquire(%s, %s * interval '1 second', %s * interval '1 second', %s, "
                    "session_bound => true)",
                    (self.election, self.args.ttl, self.args.campaign_wait, self.args.node)).fetchone()[0]
            except psycopg.errors.LockNotAvailable:  # 55P03: `wait` ran out; stay in the race
                continue
            self.emit("elected", token=token)
            return token

    def lead(self, conn, token):
        """Act as the leader until deposed (then return) or the connection is lost (raise)."""
        proclaimed = conn.execute("SELECT fenced_lock_proclaim(%s, %s, %s)",
                                  (self.election, token, self.args.address)).fetchone()[0]
        if not proclaimed:
            self.emit("deposed", token=token, why="proclaim returned false")
            return
        self.emit("proclaimed", token=token, value=self.args.address)
        renew_every = self.args.ttl / 3
        renewed = time.monotonic()
        while True:
            try:
                # a leader-only write, stamped with the token: refused (FL001) once deposed
                conn.execute(HEARTBEAT, dict(election=self.election, node=self.args.node,
                                             address=self.args.address, token=token))
            except psycopg.Error as e:
                if e.sqlstate != "FL001":
                    raise
                self.emit("deposed", token=token, why="FL001: " + e.diag.message_primary)
                return
            if time.monotonic() - renewed >= renew_every:
                if not conn.execute("SELECT fenced_lock_renew(%s, %s)", (self.election, token)).fetchone()[0]:
                    self.emit("deposed", token=token, why="renew returned false")
                    return
                renewed = time.monotonic()
            time.sleep(self.args.beat)

    # -- follow ------------------------------------------------------------------------

    def read(self, conn):
        row = conn.execute("SELECT holder, token, value FROM fenced_lock_leader(%s)", (self.election,)).fetchone()
        return row if row is not None else (None, None, None)

    def report(self, leader, why, on=None):
        holder, token, value = leader
        self.emit("leader", holder=holder, token=token, value=value, why=why, on=on)

    def follow_forever(self):
        first = True
        last = None
        while True:
            try:
                with self.connect() as conn:
                    conn.execute("LISTEN fenced_lock")  # 1. listen first ...
                    self.emit("following", backend_pid=conn.info.backend_pid)
                    last = self.read(conn)               # 2. ... then read
                    self.report(last, "read" if first else "reconnect")
                    first = False
                    for n in conn.notifies():            # 3. read again on every notification
                        try:
                            event = json.loads(n.payload)
                        except ValueError:
                            continue
                        if event.get("name") != self.election:
                            continue
                        now = self.read(conn)
                        if now != last:
                            self.report(now, "notify", on=event.get("event"))
                            last = now
            except psycopg.Error as e:                   # 4. after a reconnect, back to 1
                self.emit("disconnected", connection="follow",
                          error=f"{e.sqlstate}: " + str(e).strip().splitlines()[0])
                time.sleep(self.args.reconnect_delay)


def setup(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('leader_heartbeat') IS NOT NULL").fetchone()[0]
        if not exists:
            conn.execute(TABLE_DDL)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", required=True, help="libpq connection string")
    p.add_argument("--election", default="leader", help="the lock name everyone campaigns for")
    p.add_argument("--node", help="this node's holder text (unique per node)")
    p.add_argument("--address", help="the value proclaimed when this node leads")
    p.add_argument("--ttl", type=float, default=15.0, help="lease ttl in seconds (renewed at a third)")
    p.add_argument("--campaign-wait", type=float, default=10.0, help="seconds per fenced_lock_acquire call")
    p.add_argument("--beat", type=float, default=1.0, help="seconds between the leader's heartbeat writes")
    p.add_argument("--reconnect-delay", type=float, default=1.0, help="seconds before reconnecting")
    p.add_argument("--setup", action="store_true", help="create the guarded heartbeat table and exit")
    args = p.parse_args(argv)
    if args.setup:
        setup(args.dsn)
        return 0
    if not args.node or not args.address:
        p.error("--node and --address are required")
    node = Node(args)
    threading.Thread(target=node.campaign_forever, name="campaign", daemon=True).start()
    node.follow_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
