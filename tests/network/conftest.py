"""Fixtures for the network partition tests (tests/network, README "Network
partitions").

Partitions are real: iptables drops every packet of one client's loopback
TCP connection, both ways (harness/netfault.py), so neither end hears
anything until keepalives, a user timeout or the heal. Servers listen on
127.0.0.1 ports 5580-5589, files under /tmp/fenced_lock_tests/n_*. Every
rule a test adds is removed by the `rules` fixture's finalizer, pass or
fail; rules an interrupted earlier run left behind (their owner process is
gone) are removed before the first test. Every test runs under an alarm.
"""

import pytest

from harness import netfault
from harness.budget import budget_fixture, register_budget_marker
from harness.clientproc import Children
from harness.cluster import Cluster

from ports import MAIN_PORT

TEST_BUDGET_S = 120

time_budget = budget_fixture(default_seconds=TEST_BUDGET_S)
pytest_configure = register_budget_marker


@pytest.fixture(scope="session", autouse=True)
def iptables_ready():
    ok, why = netfault.available()
    if not ok:
        pytest.skip(f"network partition tests need iptables as root: {why}")
    netfault.remove_leftovers("net")
    yield


@pytest.fixture
def rules():
    r = netfault.Rules("net")
    try:
        yield r
    finally:
        r.clear()


@pytest.fixture
def children():
    cs = Children()
    try:
        yield cs
    finally:
        cs.close_all()


@pytest.fixture(scope="session")
def cluster(iptables_ready):
    c = Cluster("n_main", MAIN_PORT, {"track_commit_timestamp": "on"}).init()
    try:
        c.start()
        yield c
    finally:
        c.stop(mode="immediate", check=False)


@pytest.fixture
def db(cluster, request):
    name = "n_" + request.node.name.replace("test_", "")[:40].replace("[", "_").replace("]", "")
    cluster.create_database(name)
    with cluster.connect(name) as c:
        c.execute("CREATE TABLE stock (item_id int PRIMARY KEY, qty int NOT NULL, fence_token bigint)")
        t = c.execute("SELECT fenced_lock_try_acquire('net:1', '1 minute')").fetchone()[0]
        c.execute("CREATE TRIGGER stock_fence BEFORE INSERT OR UPDATE OR DELETE ON stock "
                  "FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('net:{item_id}', 'fence_token')")
        c.execute("INSERT INTO stock VALUES (1, 10, %s)", (t,))
        c.execute("SELECT fenced_lock_release('net:1', %s)", (t,))
    return name
