"""The package test.sh built is the one under test: the suite imports it from
the unpacked wheel, whose metadata names distribution fenced-lock 0.3.0 and
which ships its type information (py.typed)."""

import os
from importlib import metadata
from pathlib import Path

import pytest

import fenced_lock

WHEEL = os.environ.get("FENCED_LOCK_PYTHONPATH")


@pytest.mark.skipif(not WHEEL, reason="run through test.sh, which builds and unpacks the wheel")
def test_the_suite_runs_on_the_built_wheel():
    assert Path(fenced_lock.__file__).resolve().is_relative_to(Path(WHEEL).resolve())
    assert (Path(fenced_lock.__file__).parent / "py.typed").exists()
    dist = metadata.distribution("fenced-lock")
    assert dist.version == fenced_lock.__version__ == "0.3.0"
    assert any(r.startswith("psycopg") for r in dist.requires)
