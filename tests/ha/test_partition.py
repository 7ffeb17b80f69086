"""fenced_lock under Patroni when the primary is cut off from its synchronous
standby (issue 24; docs/operations.md, "Keepalives and partitions").

Every node runs in a cgroup of its own (ha_cluster.Node.start), so iptables
can cut every TCP connection between two nodes although all of them share
127.0.0.1 (harness/netfault.py, cut_cgroup_from_ports): replication, and
each Patroni's calls to the other's REST API. Both nodes still reach etcd
and the clients, which is the partition that matters here: nothing tells the
primary its synchronous standby is unreachable except wal_sender_timeout.

- Cut shorter than anything notices: every grant waits (a grant is
  acknowledged only once the synchronous standby has it, invariant 6), and
  after the heal they all complete; nothing acknowledged is lost.
- Cut past Patroni's ttl, with wal_sender_timeout lowered to 3 s: whatever
  Patroni does meanwhile (it may move synchronous replication to the other
  replica once the walsender times out), no acknowledged grant, renewal or
  write is lost and no token repeats — also through a failover right after
  the heal, which promotes whichever node Patroni then holds synchronous.

Figures (printed): how long grants stalled, what Patroni did.
"""

import os
import signal
import time

import pytest

from ha_cluster import http, wait_until
from ha_workload import EPOCH_SHIFT, Workload
from harness import netfault
from test_ha import first_grant_after, verify, wait_rejoined

LOAD_BEFORE_S = 3.0


@pytest.fixture
def rules():
    ok, why = netfault.available()
    if not ok:
        pytest.skip(f"partitions need iptables as root: {why}")
    if not netfault.Cgroup.available():
        pytest.skip("partitions between nodes need a writable cgroup v2 hierarchy")
    netfault.remove_leftovers("ha")
    r = netfault.Rules("ha")
    try:
        yield r
    finally:
        r.clear()


def sync_standby(cluster):
    name = next((k for k, m in cluster.members().items() if m["role"] == "sync_standby"), None)
    return cluster.node(name) if name else None


def cut_between(rules, a, b):
    """Every connection between nodes a and b, both ways, PostgreSQL and REST."""
    assert a.cgroup is not None and b.cgroup is not None, "nodes were started without their cgroups"
    return [rules.cut_cgroup_from_ports(a.cgroup, [b.port, b.rest]),
            rules.cut_cgroup_from_ports(b.cgroup, [a.port, a.rest])]


def probe_acks(rec, since, until=None):
    return sorted(g["acked"] for g in list(rec.grants)
                  if g["worker"] == "probe" and g["acked"] >= since and (until is None or g["acked"] <= until))


def longest_stall(rec, since, until):
    """The longest time in [since, until] without an acknowledged grant of the prober."""
    ts = [since] + probe_acks(rec, since, until) + [until]
    return max(b - a for a, b in zip(ts, ts[1:]))


def set_wal_sender_timeout(cluster, value):
    status, body = http("PATCH", f"http://127.0.0.1:{cluster.leader().rest}/config",
                        {"postgresql": {"parameters": {"wal_sender_timeout": value}}})
    assert status == 200, body
    want = value or "1min"
    wait_until(lambda: cluster.sql_primary("SHOW wal_sender_timeout")[0][0] == want, 30,
               what=f"wal_sender_timeout = {want} on the primary")


@pytest.mark.budget(120)
def test_sync_standby_cut_off_holds_every_grant_until_the_heal_and_none_is_lost(cluster, rules):
    cut_s = 6.0
    cluster.set_sync(True)
    primary, standby = cluster.leader(), sync_standby(cluster)
    assert standby is not None, cluster.members()
    wl = Workload(4).start()
    try:
        time.sleep(LOAD_BEFORE_S)
        assert len(wl.rec.grants) > 10, f"no progress: {wl.rec.failures[:5]}\n{cluster.diagnose()}"
        cut_at = time.time()
        cuts = cut_between(rules, primary, standby)
        time.sleep(cut_s)
        during = probe_acks(wl.rec, cut_at + 1.0, time.time())
        sync_during = sync_standby(cluster)
        heal_at = time.time()
        for c in cuts:
            c.heal()
        resumed = wait_until(lambda: (probe_acks(wl.rec, heal_at) or [None])[0], 60, interval=0.05,
                             what="grants to resume after the heal")
        cluster.wait_healthy(60, sync=True)
        time.sleep(2.0)
    finally:
        wl.stop()
    stall = longest_stall(wl.rec, cut_at, resumed)
    fig, _ = verify(cluster, wl, None, cut_at)
    fig.update(cut_s=cut_s, longest_stall_s=round(stall, 2), heal_to_first_grant_s=round(resumed - heal_at, 2),
               grants_acknowledged_during_cut=len(during), sync_standby_before=standby.name,
               sync_standby_during=sync_during.name if sync_during else None, leader_after=cluster.leader().name)
    print(f"\nsync standby cut off {cut_s:.0f} s: {fig}")
    assert cluster.leader().name == primary.name, "a cut between two nodes caused a failover"
    assert not during, f"grants were acknowledged without the synchronous standby: {len(during)}"
    assert stall >= cut_s - 1.5, "grants did not wait for the cut-off synchronous standby"
    lost = {k: v for k, v in fig.items() if k in ("lost_grants", "lost_renews", "lost_writes") and v}
    assert not lost, f"acknowledged operations lost: {lost}"


@pytest.mark.budget(180)
def test_sync_standby_cut_off_past_patronis_ttl_loses_no_acknowledged_grant_and_repeats_no_token(cluster, rules):
    cut_s = 15.0  # Patroni's ttl is 10 s
    cluster.set_sync(True)
    set_wal_sender_timeout(cluster, "3s")
    try:
        primary, standby = cluster.leader(), sync_standby(cluster)
        assert standby is not None, cluster.members()
        wl = Workload(4).start()
        try:
            time.sleep(LOAD_BEFORE_S)
            cut_at = time.time()
            cuts = cut_between(rules, primary, standby)
            sync_seen = []
            while time.time() < cut_at + cut_s:
                s = sync_standby(cluster)
                if s is not None and (not sync_seen or sync_seen[-1][1] != s.name):
                    sync_seen.append((round(time.time() - cut_at, 1), s.name))
                time.sleep(0.5)
            heal_at = time.time()
            for c in cuts:
                c.heal()
            cluster.wait_healthy(90, sync=True)
            # Whatever Patroni did, a failover now promotes its synchronous
            # standby: it must have every grant acknowledged so far.
            old = cluster.leader()
            epoch = max(g["token"] for g in wl.rec.grants) >> EPOCH_SHIFT
            kill_at = time.time()
            os.kill(old.postmaster_pid(), signal.SIGKILL)
            wait_until(lambda: (cluster.leader() or old).name != old.name, 60, interval=0.05,
                       what="a replica to be promoted")
            first_grant = first_grant_after(wl.rec, epoch, 60)
            wait_rejoined(cluster, old, 90)
            time.sleep(2.0)
        finally:
            wl.stop()
        stall = longest_stall(wl.rec, cut_at, heal_at)
        fig, _ = verify(cluster, wl, old.port, kill_at)
        fig.update(cut_s=cut_s, longest_stall_during_cut_s=round(stall, 2),
                   grants_during_cut=len(probe_acks(wl.rec, cut_at, heal_at)),
                   sync_standby_over_the_cut=sync_seen, leader_before=primary.name,
                   promoted=cluster.leader().name, kill_to_first_grant_s=round(first_grant - kill_at, 2))
        print(f"\nsync standby cut off {cut_s:.0f} s (> Patroni ttl), wal_sender_timeout 3 s, then failover: {fig}")
        lost = {k: v for k, v in fig.items() if k in ("lost_grants", "lost_renews", "lost_writes") and v}
        assert not lost, f"acknowledged operations lost: {lost}"
    finally:
        set_wal_sender_timeout(cluster, None)
        cluster.set_sync(False)
