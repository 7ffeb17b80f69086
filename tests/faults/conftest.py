"""Fixtures for the fault, failover and pooler tests (docs/design.md, "The guard", "Durability").

Every server here listens on 127.0.0.1, on ports 5520-5559, with its files
under /tmp/fenced_lock_tests/f_*. Every test is bounded: an alarm fails a test
that runs longer than its budget (default `TEST_BUDGET_S`), every connection
has a connect timeout and a statement timeout, and every server or pooler a
test starts is stopped by the fixture that started it, pass or fail.
"""


import pytest

from harness.budget import budget_fixture, register_budget_marker

from harness.cluster import Cluster
from faultkit import MAIN_PORT

TEST_BUDGET_S = 150



time_budget = budget_fixture(default_seconds=TEST_BUDGET_S)
pytest_configure = register_budget_marker



# -- clusters -------------------------------------------------------------------

class Clusters:
    """Starts clusters for one test and stops every one of them afterwards."""

    def __init__(self):
        self.started = []

    def new(self, name, port, conf=None, start=True):
        assert name.startswith("f_"), name
        c = Cluster(name, port, conf).init()
        self.started.append(c)
        if start:
            c.start()
        return c

    def adopt(self, cluster):
        self.started.append(cluster)
        return cluster

    def stop_all(self):
        for c in reversed(self.started):
            try:
                c.stop(mode="immediate", check=False)
            except Exception:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop_all()


@pytest.fixture
def clusters():
    with Clusters() as cs:
        yield cs


@pytest.fixture(scope="session")
def main_cluster():
    """One cluster shared by the tests that do not crash or replace their server;
    each of them works in a database of its own. track_commit_timestamp lets
    the history checker order committed transactions."""
    c = Cluster("f_main" if MAIN_PORT == 5520 else f"f_main_{MAIN_PORT}", MAIN_PORT, {"track_commit_timestamp": "on", "max_connections": "200"}).init()
    try:
        c.start()
        yield c
    finally:
        c.stop(mode="immediate", check=False)


@pytest.fixture
def fresh_db(main_cluster, request):
    """A new database with the extension, named after the test."""
    name = "f_" + request.node.name.replace("test_", "")[:50]
    main_cluster.create_database(name)
    return name


