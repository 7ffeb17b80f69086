"""Fixtures for the update tests (docs/design.md, "Versions and upgrades").

Servers here listen on 127.0.0.1 ports 5570-5579, with their files under
/tmp/fenced_lock_tests/up_*; each test stops what it started. They swap the
extension's files in the server's directories (as a package upgrade does)
and always put the files of the build under test back.
"""

import pytest

from harness.cluster import Cluster
from upgradekit import ExtensionFiles


@pytest.fixture
def current_files(tmp_path_factory):
    """The build under test; put back whatever a test installs instead."""
    files = ExtensionFiles.installed(tmp_path_factory.mktemp("current"))
    try:
        yield files
    finally:
        files.install()


@pytest.fixture
def cluster(request):
    c = Cluster("up_" + request.node.name[:40].replace("[", "_").replace("]", ""), 5570).init()
    c.start()
    try:
        yield c
    finally:
        c.stop(mode="immediate", check=False)
