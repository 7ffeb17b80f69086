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

from harness.budget import budget_fixture, register_budget_marker

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ha_cluster import HACluster, cleanup_leftovers  # noqa: E402
from ha_workload import install_history  # noqa: E402

TEST_BUDGET_S = 150




time_budget = budget_fixture(default_seconds=TEST_BUDGET_S)
pytest_configure = register_budget_marker


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
