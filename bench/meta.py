"""Record what the run ran on (read by report.py): time, load, CPU, server
version, fenced_lock's version, and FL_BENCH_NOTE if set (e.g. "machine shared with other jobs")."""

import json
import os
import time

from benchlib import WORK, connect

with connect("postgres") as c:
    pg = c.execute("SHOW server_version").fetchone()[0]
    fl = c.execute("SELECT default_version FROM pg_available_extensions WHERE name = 'fenced_lock'").fetchone()
cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
load = " ".join(open("/proc/loadavg").read().split()[:3])
WORK.mkdir(parents=True, exist_ok=True)
(WORK / "meta.json").write_text(json.dumps({"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                            "load": load, "pg": pg, "cpu": cpu,
                                            "fenced_lock": fl[0] if fl else "not installed",
                                            "note": os.environ.get("FL_BENCH_NOTE", "")}))
