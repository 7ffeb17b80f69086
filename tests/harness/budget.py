"""A wall-clock budget for every test: an alarm fails a test that runs past
it (with its teardown), so that no suite can hang. A conftest.py uses it as

    from harness.budget import budget_fixture, register_budget_marker
    time_budget = budget_fixture(default_seconds=150)
    pytest_configure = register_budget_marker

and a test asks for more with `@pytest.mark.budget(seconds)`.
"""

import signal

import pytest


class BudgetExceeded(Exception):
    pass


def register_budget_marker(config):
    config.addinivalue_line("markers", "budget(seconds): wall-clock budget of one test")


def budget_fixture(default_seconds):
    @pytest.fixture(autouse=True)
    def time_budget(request):
        """Fail (with teardown) any test that runs past its budget."""
        marker = request.node.get_closest_marker("budget")
        seconds = int(marker.args[0]) if marker else default_seconds

        def expired(signum, frame):
            raise BudgetExceeded(f"{request.node.name} ran longer than {seconds} s")

        previous = signal.signal(signal.SIGALRM, expired)
        signal.alarm(seconds)
        try:
            yield
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)

    return time_budget
