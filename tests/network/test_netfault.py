"""The partition harness itself (harness/netfault.py): a cut drops exactly
one connection, both ways, and heals; every rule a test added is gone after
it, also when the test fails; rules an interrupted run left behind (their
owner process is gone) are removed, and nobody else's are touched."""

import socket
import subprocess
import sys
import threading

import pytest

from harness import netfault

PORT = 5589  # a plain TCP echo server, no PostgreSQL needed


def tagged_rules():
    out = subprocess.run([netfault.IPTABLES, "-w", "-S"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if netfault.TAG in line]


@pytest.fixture
def echo():
    srv = socket.create_server(("127.0.0.1", PORT), reuse_port=True)

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=c: [c.sendall(d) for d in iter(lambda: c.recv(100), b"")],
                             daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()
    yield
    srv.close()


def roundtrip(sock, timeout):
    sock.settimeout(timeout)
    sock.sendall(b"ping")
    try:
        return sock.recv(100) == b"ping"
    except socket.timeout:
        return False


def test_a_cut_drops_exactly_one_connection_both_ways_and_heals(echo):
    a = socket.create_connection(("127.0.0.1", PORT))
    b = socket.create_connection(("127.0.0.1", PORT))
    with netfault.Rules("net") as rules:
        assert roundtrip(a, 2) and roundtrip(b, 2)
        cut = rules.cut_connection(a.getsockname()[1], PORT)
        assert not roundtrip(a, 1.0), "a cut connection still carried data"
        assert roundtrip(b, 2), "the cut hit another connection"
        cut.heal()
        a.settimeout(10)
        assert a.recv(100) == b"ping"  # TCP's retransmission got through after the heal
        assert roundtrip(a, 5)
    a.close()
    b.close()


def test_rules_of_a_failing_test_are_removed():
    before = tagged_rules()
    with pytest.raises(RuntimeError, match="the test failed"):
        with netfault.Rules("net") as rules:
            rules.cut_connection(40000, PORT)
            rules.lossy_port(40001, 0.5)
            assert len(tagged_rules()) == len(before) + 4
            raise RuntimeError("the test failed")
    assert tagged_rules() == before


def test_leftovers_of_a_dead_owner_are_removed_and_a_live_owners_are_kept():
    code = ("import sys; sys.path.insert(0, %r); from harness import netfault; "
            "netfault.Rules('net').cut_connection(40002, 5589)") % str(netfault.__file__.rsplit("/harness/", 1)[0])
    subprocess.run([sys.executable, "-c", code], check=True)  # exits without clearing its rule
    with netfault.Rules("net") as mine:
        mine.cut_connection(40003, PORT)
        assert any("40002" in r for r in tagged_rules())
        assert netfault.remove_leftovers("net") == 2  # both directions of the dead owner's cut
        left = tagged_rules()
        assert not any("40002" in r for r in left) and sum("40003" in r for r in left) == 2
    assert not any("40003" in r for r in tagged_rules())


def test_a_cgroup_cut_drops_that_process_trees_connections_to_the_ports_both_ways_and_heals(echo):
    if not netfault.Cgroup.available():
        pytest.skip("no writable cgroup v2 hierarchy")
    cg = netfault.Cgroup("fl_net_selftest")
    # A child in the cgroup holds one connection open and answers "ping"
    # over it on request; the test's own connection is outside the cgroup.
    child = subprocess.Popen([sys.executable, "-c", f"""
import socket, sys
s = socket.create_connection(("127.0.0.1", {PORT}))
print("up", flush=True)
for line in sys.stdin:
    s.settimeout(float(line))
    s.sendall(b"ping")
    try:
        print("ok" if s.recv(100).startswith(b"ping") else "bad", flush=True)
    except socket.timeout:
        print("timeout", flush=True)
    except OSError as e:
        print("error", e, flush=True)
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        cg.add(child.pid)  # before it connects: the socket belongs to the group
        assert child.stdout.readline().strip() == "up"

        def child_roundtrip(timeout):
            child.stdin.write(f"{timeout}\n")
            child.stdin.flush()
            return child.stdout.readline().strip()

        outside = socket.create_connection(("127.0.0.1", PORT))
        with netfault.Rules("net") as rules:
            assert child_roundtrip(2) == "ok"
            cut = rules.cut_cgroup_from_ports(cg, [PORT])
            assert child_roundtrip(1) == "timeout"
            assert roundtrip(outside, 2), "the cut hit a connection from outside the cgroup"
            cut.heal()
            assert child_roundtrip(10) == "ok"  # the retransmitted ping and its echo got through
        outside.close()
    finally:
        child.kill()
        child.wait(10)
        cg.remove()
