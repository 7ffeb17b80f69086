"""The conformance examples of the Python client: main.py hold|inventory ARGS
(clients/README.md, "The conformance examples"; clients/run python calls
this through run-example). With FENCED_LOCK_EXAMPLE_ASYNC=1 they run on
AsyncLocker instead of Locker."""

import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cli import BAD_COMMAND_LINE, FAILED, emit_error  # noqa: E402

USAGE = "usage: clients/run python hold|inventory ARGS... (see clients/README.md)\n"


def main(argv):
    if not argv or argv[0] not in ("hold", "inventory"):
        sys.stderr.write(USAGE)
        return BAD_COMMAND_LINE
    # Diagnostics (renew retries, reconnects) go to stderr, never stdout.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        if argv[0] == "hold":
            from hold import main as run
        else:
            from inventory import main as run
    except ImportError as e:  # psycopg missing: say so the contract's way
        emit_error(e)
        return FAILED
    return run(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
