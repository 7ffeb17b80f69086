"""Fixtures for the HA suite (make test-ha): one Patroni + etcd cluster for the
whole session, stopped at the end whatever happens.

Bounds: every test runs under an alarm (its `budget`), every wait has a
deadline, every client connection has a connect and a statement timeout, and
worker threads are joined with a timeout. Cleanup: leftovers of an aborted
earlier run are stopped before the cluster starts; the cluster is stopped by
the fixture's `finally`, by atexit (an interrupted run), and SIGTERM is turned
into KeyboardInterrupt so that both of those run when CI or a user stops us.
"""

import atexit
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ha_cluster import HACluster, cleanup_leftovers  # noqa: E402
from ha_workload import install_history  # noqa: E402

TEST_BUDGET_S = 150


class BudgetExceeded(Exception):
    pass


def pytest_configure(config):
    config.addinivalue_line("markers", "budget(seconds): wall-clock budget of one test")


@pytest.fixture(autouse=True)
def time_budget(request):
    """Fail (with teardown) any test that runs past its budget."""
    marker = request.node.get_closest_marker("budget")
    seconds = int(marker.args[0]) if marker else TEST_BUDGET_S

    def expired(signum, frame):
        raise BudgetExceeded(f"{request.node.name} ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def cluster():
    cleanup_leftovers()
    c = HACluster()
    atexit.register(c.stop)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        c.start()
        with c.connect(user="postgres") as conn:
            install_history(conn)
        yield c
    finally:
        c.stop()
        atexit.unregister(c.stop)
        signal.signal(signal.SIGTERM, previous)
