"""What both conformance examples share: JSON lines on stdout (and nothing
else there), exit statuses, argument parsing (clients/README.md, "The
conformance examples")."""

import argparse
import json
import sys
import threading

DONE, FAILED, BAD_COMMAND_LINE, LOST = 0, 1, 2, 3

_out = threading.Lock()


def emit(event, **fields):
    """One JSON line on stdout. The keepalive thread (renewed) and the lost
    callback print too, so lines are written whole under a lock."""
    line = json.dumps({"event": event, **fields})
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def emit_error(e):
    """The error line for `e` (sqlstate null when it has none); exit 1."""
    emit("error", sqlstate=getattr(e, "sqlstate", None), message=str(e).strip() or type(e).__name__)
    return FAILED


class Parser(argparse.ArgumentParser):
    """argparse, with every complaint on stderr and exit status 2."""

    def error(self, message):
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(BAD_COMMAND_LINE)


def table_and_id(value):
    table, sep, row_id = value.rpartition(":")
    if not sep or not table or not row_id:
        raise argparse.ArgumentTypeError(f"expected TABLE:ID, got {value!r}")
    return table, row_id
