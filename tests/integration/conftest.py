"""Fixtures for the multi-connection integration tests.

- `cluster`: one scratch PostgreSQL 15 (Cluster('it_main', 5500)) for the whole
  session, started once and stopped at the end.
- `db`: a fresh database with `CREATE EXTENSION fenced_lock`, one per test module
  (dropped when the module is done). Connect with `cluster.connect(db)`.
- `execute_only_role`: a factory, `execute_only_role(role=None, dbname=db,
  functions=None)`, making a LOGIN role that has nothing but EXECUTE on the
  fenced_lock functions (and SELECT on the view); dropped at module end.
- `history`: the database `db` with a test-only trigger logging every lease
  change into public.it_lease_history (see it_support.check_history).
- `preload_cluster`: a second scratch cluster (port 5502) with
  shared_preload_libraries = 'fenced_lock', started on first use and shared by
  every module that needs the preloaded library (counters, waiting both ways)
  or a server it may crash.
- `children`: client processes (harness.clientproc) that a test can kill with
  real signals; every one still alive is killed when the test ends.

Every test runs under an alarm (`budget` marker, default TEST_BUDGET_S).

Ports 5500-5509 and /tmp/fenced_lock_tests/it_* belong to this directory.
FL_IT_PORT (one of 5503-5509) moves the session cluster to that port and to
/tmp/fenced_lock_tests/it_main_<port>, so that two runs at once do not share it;
FL_IT_PRELOAD_PORT (one of 5503-5509 too) does the same for `preload_cluster`.
"""

import os

import pytest

from harness.budget import budget_fixture, register_budget_marker

from harness.clientproc import Children
from harness.cluster import Cluster

import it_support

# Under pytest-xdist (`make test-integration` runs two workers, a module
# each at a time) every worker gets clusters of its own: gw0 5503/5504, gw1
# 5505/5506, gw2 5507/5508.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_BASE = 5503 + 2 * int(_WORKER[2:]) if _WORKER.startswith("gw") else None
MAIN_PORT = int(os.environ.get("FL_IT_PORT") or _BASE or 5500)
PRELOAD_PORT = int(os.environ.get("FL_IT_PRELOAD_PORT") or (_BASE and _BASE + 1) or 5502)
TEST_BUDGET_S = 120




time_budget = budget_fixture(default_seconds=TEST_BUDGET_S)
pytest_configure = register_budget_marker


@pytest.fixture
def children():
    with Children() as cs:
        yield cs


@pytest.fixture(scope="session")
def preload_cluster():
    c = Cluster("it_preload" if PRELOAD_PORT == 5502 else f"it_preload_{PRELOAD_PORT}", PRELOAD_PORT,
                {"shared_preload_libraries": "'fenced_lock'"})
    c.init()
    c.start()
    try:
        assert "fenced_lock" in c.sql("SHOW shared_preload_libraries")[0][0]
        yield c
    finally:
        c.stop(check=False)


@pytest.fixture(scope="session")
def cluster():
    c = Cluster("it_main" if MAIN_PORT == 5500 else f"it_main_{MAIN_PORT}", MAIN_PORT)
    c.init()
    c.start()
    try:
        yield c
    finally:
        c.stop(check=False)


def _module_db(cluster, request):
    name = "it_" + it_support.safe_ident(request.module.__name__.rsplit(".", 1)[-1])
    cluster.create_database(name)
    return name


@pytest.fixture(scope="module")
def db(cluster, request):
    name = _module_db(cluster, request)
    yield name
    cluster.sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def execute_only_role(cluster, db, request):
    made = []
    prefix = "it_" + it_support.safe_ident(request.module.__name__.rsplit(".", 1)[-1])[:30]

    def make(role=None, dbname=None, functions=None, view=True):
        role = role or f"{prefix}_app{len(made) + 1}"
        it_support.create_execute_only_role(cluster, dbname or db, role, functions=functions, view=view)
        made.append(role)
        return role

    yield make
    for role in made:
        it_support.drop_role(cluster, role)


@pytest.fixture(scope="module")
def history(cluster, db):
    it_support.install_history(cluster, db)
    yield db
    it_support.remove_history(cluster, db)
