"""Network faults on loopback for fenced_lock's tests: cut one client's TCP
connection, drop a share of a port's packets, cut every connection a process
tree opens to some ports. The kernel here has no netem; iptables (Debian's,
nf_tables backend) works on `lo`, and a dropped packet is what a real
partition does to TCP: the sender retransmits, the receiver hears nothing, and
only keepalives or a user timeout on either end can declare the peer dead.

(A user-space proxy that stops forwarding keeps the server's own TCP
connection healthy, so the server's keepalives would never fire: use
netproxy.py for delay and jitter, and these rules for loss and partitions.)

Every rule carries the comment `fenced_lock_test:<owner>`, where <owner> is
`<suite>:<pid of the process that added it>`. `Rules.clear()` removes exactly
the rules it added (a fixture finalizer calls it, pass or fail), and
`remove_leftovers()` removes the rules of owners whose process is gone (an
interrupted run), without touching anyone else's rules.

    with Rules("net") as rules:
        cut = rules.cut_connection(client_port, server_port)   # both directions dropped
        ...
        cut.heal()
"""

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

TAG = "fenced_lock_test"
IPTABLES = shutil.which("iptables") or "/usr/sbin/iptables"
# cgroup v2 hierarchy (hybrid layouts mount it at .../unified); iptables'
# cgroup match takes a path relative to its root.
CGROUP2 = next((p for p in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
                if (p / "cgroup.controllers").exists()), None)


def available():
    """(True, '') when this process can add iptables rules, else (False, why)."""
    if os.geteuid() != 0:
        return False, "iptables rules need root"
    if not os.path.exists(IPTABLES):
        return False, "iptables is not installed (Debian package iptables)"
    r = subprocess.run([IPTABLES, "-w", "-S", "INPUT"], capture_output=True, text=True)
    if r.returncode != 0:
        return False, f"iptables does not work here: {r.stderr.strip()}"
    return True, ""


def _ipt(table, *args, check=True):
    r = subprocess.run([IPTABLES, "-w", "10", "-t", table, *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"iptables -t {table} {' '.join(args)}: {r.stderr.strip()}")
    return r


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def remove_leftovers(suite=None):
    """Remove rules tagged by owners whose process no longer exists (of one
    suite, or of all). Returns how many were removed."""
    removed = 0
    for table in ("filter", "mangle", "raw"):
        listing = _ipt(table, "-S", check=False).stdout.splitlines()
        for line in listing:
            m = re.search(rf'--comment "?{TAG}:([^" ]+):(\d+)"?', line)
            if not m or not line.startswith("-A ") or (suite and m.group(1) != suite):
                continue
            if _pid_alive(int(m.group(2))):
                continue
            _ipt(table, "-D", *shlex.split(line)[1:], check=False)
            removed += 1
    return removed


class Cut:
    """One fault made of several rules; heal() removes them (idempotent)."""

    def __init__(self, rules, specs, what):
        self._rules = rules
        self.specs = specs
        self.what = what
        self.healed = False

    def heal(self):
        if not self.healed:
            for table, chain, spec in reversed(self.specs):
                self._rules._delete(table, chain, spec)
            self.healed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.heal()


class Rules:
    """The rules one test (or one soak run) added; clear() removes them all."""

    def __init__(self, suite):
        assert re.fullmatch(r"[a-z0-9_]+", suite), suite
        self.owner = f"{TAG}:{suite}:{os.getpid()}"
        self.suite = suite
        self._added = []  # (table, chain, spec) in insertion order
        self._next_mark = 0x464C0100 + (os.getpid() % 0x100) * 0x100

    def _comment(self):
        return ["-m", "comment", "--comment", self.owner]

    def _insert(self, table, chain, spec):
        # -I: ahead of anything an operator has, so that the fault really applies.
        _ipt(table, "-I", chain, *spec, *self._comment())
        self._added.append((table, chain, spec))

    def _delete(self, table, chain, spec):
        _ipt(table, "-D", chain, *spec, *self._comment(), check=False)
        try:
            self._added.remove((table, chain, spec))
        except ValueError:
            pass

    def _fault(self, specs, what):
        done = []
        try:
            for s in specs:
                self._insert(*s)
                done.append(s)
        except BaseException:
            for s in reversed(done):
                self._delete(*s)
            raise
        return Cut(self, specs, what)

    def cut_connection(self, client_port, server_port):
        """Drop every packet of the loopback TCP connection between
        `client_port` (the server's inet_client_port()) and `server_port`,
        both ways: a partition between that one client and the server. Other
        connections, of the same processes or of anyone else, are untouched."""
        c, p = str(int(client_port)), str(int(server_port))
        specs = [("filter", "INPUT", ["-i", "lo", "-p", "tcp", "--sport", c, "--dport", p, "-j", "DROP"]),
                 ("filter", "INPUT", ["-i", "lo", "-p", "tcp", "--sport", p, "--dport", c, "-j", "DROP"])]
        return self._fault(specs, f"connection {c} <-> {p}")

    def lossy_port(self, port, probability):
        """Drop a random share of the packets to and from a loopback TCP port
        (each direction independently): real loss, which TCP repairs by
        retransmission, so segments arrive late and out of order."""
        p, prob = str(int(port)), f"{float(probability):.4f}"
        stat = ["-m", "statistic", "--mode", "random", "--probability", prob]
        specs = [("filter", "INPUT", ["-i", "lo", "-p", "tcp", "--dport", p, *stat, "-j", "DROP"]),
                 ("filter", "INPUT", ["-i", "lo", "-p", "tcp", "--sport", p, *stat, "-j", "DROP"])]
        return self._fault(specs, f"{probability:.0%} loss on port {p}")

    def cut_cgroup_from_ports(self, cgroup, ports):
        """Cut every TCP connection that a process of `cgroup` (a Cgroup)
        opens to one of `ports`, existing ones included, both directions: the
        connection is marked (conntrack) by its first packet from the cgroup
        after the cut and every packet of a marked connection is dropped."""
        mark = f"0x{self._next_mark:x}"
        self._next_mark += 1
        dports = ",".join(str(int(p)) for p in ports)
        specs = [("mangle", "OUTPUT", ["-p", "tcp", "-m", "cgroup", "--path", cgroup.path, "-m", "multiport",
                                       "--dports", dports, "-j", "CONNMARK", "--set-mark", mark]),
                 ("filter", "OUTPUT", ["-p", "tcp", "-m", "connmark", "--mark", mark, "-j", "DROP"]),
                 ("filter", "INPUT", ["-i", "lo", "-p", "tcp", "-m", "connmark", "--mark", mark, "-j", "DROP"])]
        return self._fault(specs, f"cgroup {cgroup.path} from ports {dports}")

    def clear(self):
        for table, chain, spec in reversed(list(self._added)):
            self._delete(table, chain, spec)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.clear()


class Cgroup:
    """A cgroup v2 group for a process tree, so that its sockets can be told
    apart by iptables' cgroup match (every node of a loopback cluster shares
    127.0.0.1). A socket belongs to the group its creator was in when it was
    created, so move a process in before it connects (children inherit)."""

    def __init__(self, name):
        if CGROUP2 is None:
            raise RuntimeError("no cgroup v2 hierarchy mounted")
        self.path = name
        self.dir = CGROUP2 / name
        self.dir.mkdir(exist_ok=True)

    @staticmethod
    def available():
        if os.geteuid() != 0 or CGROUP2 is None:
            return False
        return os.access(CGROUP2, os.W_OK)

    def add(self, pid):
        try:
            (self.dir / "cgroup.procs").write_text(str(pid))
        except ProcessLookupError:
            pass

    def pids(self):
        try:
            return [int(p) for p in (self.dir / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def remove(self):
        """Move what is left back to the root group and remove the group."""
        for pid in self.pids():
            try:
                (CGROUP2 / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass
        try:
            self.dir.rmdir()
        except OSError:
            pass
