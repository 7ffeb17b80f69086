"""What one run cost, per operation, read from outside the client and the
servers, so that rows driven by different clients and served by different
servers compare on the same terms:

- the client's CPU: user + system time of the client process (pgbench or
  flbench) and everything it waited for, from getrusage(RUSAGE_CHILDREN)
  around the run;
- each server's CPU: for PostgreSQL every process of the cluster (the
  postmaster, backends, walwriter, checkpointer, autovacuum, ...): the live
  ones from /proc/<pid>/task/*/schedstat (ns), the ones that exited during
  the run from the postmaster's cutime + cstime (the kernel adds a child's
  time there when it is reaped); for Redis and etcd their process, all
  threads, from schedstat;
- each server's log: PostgreSQL's WAL bytes (pg_current_wal_insert_lsn()
  before and after) and WAL fsyncs (pg_stat_wal.wal_sync, every process);
  Redis' AOF bytes (INFO persistence aof_current_size; the bench turns the
  automatic rewrite off, so the file only grows) and its fsync and fdatasync
  calls, counted by `perf stat` on the syscall tracepoints (the only count
  there is: Redis keeps none); etcd's WAL bytes and fsyncs from its /metrics
  (etcd_disk_wal_write_bytes_total, etcd_disk_wal_fsync_duration_seconds_count).

flbench runs are measured over their window: flbench says on stdout when
every client is connected and warmed up and when the last one is done
(connections still open), and waits each time until the meter has read the
counters, so that CPU, log bytes and Redis' and etcd's fsyncs cover the
measured operations only. PostgreSQL's WAL fsyncs cannot be read that way
(a backend reports its counts when it has been idle a while, or when it
exits), so they are counted from before the client starts to after its
backends are gone and divided by every operation the run did, its warm-up's
too. A pgbench run is measured as a whole, its connections included (under
1% of a 4 s run). After a client exits the meter waits for the run's
backends to be gone (reaped) and 0.3 s more (the walwriter reports its
fsyncs every wal_writer_delay, 200 ms), then reads the "after" side.
"""

import json
import os
import resource
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from benchlib import SMOKE, WORK, check_flbench, connect, log, summary

ROOT = Path("/tmp/fenced_lock_tests")
PG_DATA = ROOT / "bench_pg" / "data"  # bench/servers.sh
PEERS = {  # name: (pid file, what)
    "redis_always": (ROOT / "bench_redis_always" / "redis.pid", 6390),
    "redis_everysec": (ROOT / "bench_redis_everysec" / "redis.pid", 6391),
    "etcd": (ROOT / "bench_etcd" / "etcd.pid", 2390),
}
HZ = os.sysconf("SC_CLK_TCK")
SETTLE = 0.1 if SMOKE else 0.3


def _stat(pid):
    """The fields of /proc/<pid>/stat after the command name, or None."""
    try:
        s = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return s[s.rindex(")") + 2:].split()


def _sched_ns(pid):
    """CPU time of every live thread of pid, in ns."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for t in tasks:
        try:
            total += int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def _children(ppid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            f = _stat(d)
            if f and int(f[1]) == ppid:
                out.append(int(d))
    return out


def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def postmaster_pid():
    return int(PG_DATA.joinpath("postmaster.pid").read_text().split()[0])


def pg_cpu_ns(pm):
    """Every process of the cluster: the postmaster, its live children, and
    (cutime + cstime) the children it has reaped. The live ones are read
    first: a child reaped in between is then counted twice (a backend's exit,
    a few ms) rather than not at all."""
    live = sum(_sched_ns(c) for c in _children(pm))
    f = _stat(pm)
    return live + _sched_ns(pm) + (int(f[13]) + int(f[14])) * 1_000_000_000 // HZ


def _redis_info(port, section):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"INFO {section}\r\n".encode())
        buf = b""
        while b"\r\n" not in buf:
            buf += s.recv(65536)
        head, _, rest = buf.partition(b"\r\n")
        n = int(head[1:])
        while len(rest) < n:
            rest += s.recv(65536)
    return dict(line.split(":", 1) for line in rest[:n].decode().splitlines() if ":" in line)


def _etcd_metrics(port):
    want = ("etcd_disk_wal_write_bytes_total", "etcd_disk_wal_fsync_duration_seconds_count",
            "etcd_disk_backend_commit_duration_seconds_count")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    got = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in want:
            got[name] = float(value)
    return got


class Syscalls:
    """fsync + fdatasync calls of one process over a window, from `perf stat`
    on the syscall tracepoints, started disabled and switched on and off
    through its control FIFOs, so that the count covers exactly the run."""

    EVENTS = "syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync"
    usable = None  # decided once: perf present, tracepoints readable

    def __init__(self, pid, tag):
        self.ctl, self.ack = WORK / f"perf_{tag}.ctl", WORK / f"perf_{tag}.ack"
        for f in (self.ctl, self.ack):
            f.unlink(missing_ok=True)
            os.mkfifo(f)
        self.out = WORK / f"perf_{tag}.out"
        self.proc = subprocess.Popen(
            ["perf", "stat", "-x", ",", "-D", "-1", "--control", f"fifo:{self.ctl},{self.ack}",
             "-e", self.EVENTS, "-p", str(pid), "-o", str(self.out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.w = self._open(self.ctl, os.O_WRONLY)
        self.r = self._open(self.ack, os.O_RDONLY)
        self._say("enable")

    def _open(self, path, mode):
        """Open a FIFO end once perf has the other; give up if perf exits."""
        deadline = time.monotonic() + 10
        while True:
            try:
                return os.open(path, mode | os.O_NONBLOCK)
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"perf stat did not start: {self.proc.stderr.read().decode()}")
                time.sleep(0.01)

    def _say(self, what):
        os.write(self.w, (what + "\n").encode())
        deadline, got = time.monotonic() + 10, b""
        while b"ack" not in got:
            try:
                got += os.read(self.r, 64)
            except BlockingIOError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"perf stat did not acknowledge {what}")
            time.sleep(0.002)

    def stop(self):
        self._say("disable")
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=10)
        os.close(self.w)
        os.close(self.r)
        n = 0
        for line in self.out.read_text().splitlines():
            f = line.split(",")
            if len(f) > 2 and f[2].startswith("syscalls:"):
                if f[0].isdigit():
                    n += int(f[0])
                elif f[0] != "<not counted>":  # that one: the process never ran in the window
                    raise RuntimeError(f"perf stat could not count {f[2]}: {line}")
        return n

    @classmethod
    def check(cls, pid):
        """Can perf count this process's syscalls here? (root, linux-perf,
        tracefs with syscall tracepoints)."""
        if cls.usable is None:
            try:
                Syscalls(pid, "probe").stop()
                cls.usable = True
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                log(f"costs: Redis fsyncs will not be counted ({str(e).strip()[:200]})")
                cls.usable = False
        return cls.usable


class Meter:
    """Measures runs against the servers each row uses: "pg", "redis_always",
    "redis_everysec", "etcd"."""

    def __init__(self):
        self.db = connect("postgres")
        self.pm = postmaster_pid()
        self.me = os.getpid()

    def close(self):
        self.db.close()

    def _peer_pid(self, name):
        return int(PEERS[name][0].read_text().split()[0])

    def _sample(self, servers):
        s = {}
        for name in servers:
            if name == "pg":
                lsn, sync, write = self.db.execute(
                    "SELECT pg_current_wal_insert_lsn(), wal_sync, wal_write FROM pg_stat_wal").fetchone()
                s[name] = {"cpu_ns": pg_cpu_ns(self.pm), "lsn": str(lsn), "fsyncs": sync, "writes": write}
            elif name.startswith("redis"):
                info = _redis_info(PEERS[name][1], "persistence")
                s[name] = {"cpu_ns": _sched_ns(self._peer_pid(name)), "log_bytes": int(info["aof_current_size"]),
                           "rewrites": int(info["aof_rewrites"])}
            else:
                m = _etcd_metrics(PEERS[name][1])
                s[name] = {"cpu_ns": _sched_ns(self._peer_pid(name)),
                           "log_bytes": m["etcd_disk_wal_write_bytes_total"],
                           "fsyncs": m["etcd_disk_wal_fsync_duration_seconds_count"],
                           "backend_commits": m["etcd_disk_backend_commit_duration_seconds_count"]}
        return s

    def _backends_gone(self, before):
        """Wait until every backend started during the run has exited and
        been reaped (autovacuum workers may live on; they are counted live)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            new = [c for c in _children(self.pm) if c not in before and "autovacuum" not in _cmdline(c)]
            if not new:
                return
            time.sleep(0.02)
        raise RuntimeError(f"costs: backends of the run still there after 10 s: {new}")

    def _wal_fsyncs(self):
        return self.db.execute("SELECT wal_sync, wal_write FROM pg_stat_wal").fetchone()

    def _counters(self, servers):
        return {n: Syscalls(self._peer_pid(n), n) for n in servers
                if n.startswith("redis") and Syscalls.check(self._peer_pid(n))}

    def _per_op(self, before, after, servers, ops, counted, client_s):
        if not ops:
            raise RuntimeError("costs: a run without operations")
        per = {"ops": ops, "client": {"cpu_us": 1e6 * client_s / ops}}
        for name in servers:
            b, a = before[name], after[name]
            d = {"cpu_us": (a["cpu_ns"] - b["cpu_ns"]) / 1e3 / ops}
            if name == "pg":
                wal = self.db.execute("SELECT pg_wal_lsn_diff(%s, %s)", (a["lsn"], b["lsn"])).fetchone()[0]
                d.update(log_bytes=float(wal) / ops, fsyncs=(a["fsyncs"] - b["fsyncs"]) / ops,
                         writes=(a["writes"] - b["writes"]) / ops)
            elif name.startswith("redis"):
                if a["rewrites"] != b["rewrites"]:
                    raise RuntimeError(f"costs: {name} rewrote its AOF during a run")
                d.update(log_bytes=(a["log_bytes"] - b["log_bytes"]) / ops,
                         fsyncs=counted[name] / ops if name in counted else None)
            else:
                d.update(log_bytes=(a["log_bytes"] - b["log_bytes"]) / ops,
                         fsyncs=(a["fsyncs"] - b["fsyncs"]) / ops,
                         backend_commits=(a["backend_commits"] - b["backend_commits"]) / ops)
            per[name] = d
        return per

    def run(self, fn, servers, ops_of):
        """Run fn() (one client run, pgbench) and return its result with
        "costs": the figures per operation (ops_of(result) operations), the
        whole run measured."""
        children0 = set(_children(self.pm)) if "pg" in servers else set()
        before = self._sample(servers)
        counters = self._counters(servers)
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        res = fn()
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        counted = {n: c.stop() for n, c in counters.items()}
        if "pg" in servers:
            self._backends_gone(children0)
            time.sleep(SETTLE)
        after = self._sample(servers)
        client = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
        return dict(res, costs=self._per_op(before, after, servers, ops_of(res), counted, client))

    def flbench(self, argv, servers, timeout=900):
        """One flbench run measured over its window (FLBENCH_WINDOW=1); its
        JSON line with "costs"."""
        children0 = set(_children(self.pm)) if "pg" in servers else set()
        wal0 = self._wal_fsyncs() if "pg" in servers else None
        err = tempfile.TemporaryFile(mode="w+")
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                             env=dict(os.environ, FLBENCH_WINDOW="1"))
        timer = threading.Timer(timeout, p.kill)  # a hung run fails, never blocks the bench
        timer.start()

        def edge(what):
            line = p.stdout.readline()
            if line.strip() != f"window {what}":
                p.kill()
                p.wait()
                err.seek(0)
                raise RuntimeError(f"{' '.join(map(str, argv[1:]))} failed:\n{line}{err.read()}")

        try:
            edge("start")
            before = self._sample(servers)
            counters = self._counters(servers)
            p.stdin.write("\n")
            p.stdin.flush()
            edge("end")
            counted = {n: c.stop() for n, c in counters.items()}
            after = self._sample(servers)
            p.stdin.write("\n")
            p.stdin.flush()
            out = p.stdout.read()
            p.wait()
        finally:
            timer.cancel()
        err.seek(0)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, argv[1:]))} failed:\n{err.read()}")
        res = check_flbench(json.loads(out.strip().splitlines()[-1]), argv)
        per = self._per_op(before, after, servers, res["window_ops"], counted, res["client_cpu_s"])
        if "pg" in servers:
            self._backends_gone(children0)
            time.sleep(SETTLE)
            wal1 = self._wal_fsyncs()
            per["pg"].update(fsyncs=(wal1[0] - wal0[0]) / res["total_ops"],
                             writes=(wal1[1] - wal0[1]) / res["total_ops"])
        return dict(res, costs=per)


def summarize_costs(runs):
    """{server: {field: summary}} over the runs' costs (run order kept)."""
    out = {}
    first = runs[0]["costs"]
    for name, fields in first.items():
        if not isinstance(fields, dict):
            continue
        out[name] = {f: summary([r["costs"][name][f] for r in runs]) for f in fields}
    return out

