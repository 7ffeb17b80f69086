"""Guarantee (docs/design.md, "Invariants" 1-4 and 6) on a slow, lossy link:
the soak's workers (tests/soak/worker.py: the inventory job, with renewals
and session-bound leases) reach their server through a proxy that delays
every chunk 200 ms ± 100 ms (harness/netproxy.py), while iptables drops 5%
of the packets on the proxy's port, each direction (TCP retransmits them,
so segments arrive late and out of order, and messages of different clients
overtake each other). Leases of 1-4 s then often run out between a grant
and its write. The soak's independent checker (tests/soak/checker.py) must
find: no two live exclusive leases of a name, no token repeated or going
backwards, every accepted write under a lease live at its commit, and no
acknowledged grant, renewal or sale lost (the stock adds up).
"""

import json
import sys
from pathlib import Path

import pytest

from ports import LOSSY_PORT, LOSSY_PROXY_PORT
from harness.netproxy import SlowProxy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "soak"))
from run import Soak  # noqa: E402

RUN_S = 50


@pytest.mark.budget(150)
def test_slow_lossy_link_keeps_every_invariant_and_loses_no_acknowledged_operation(rules):
    out = Path("/tmp/fenced_lock_tests/n_lossy_run")
    soak = Soak(out, port=LOSSY_PORT, worker_port=LOSSY_PROXY_PORT, workers=8, items=3, seed=24,
                nemeses={}, faketime=False, cluster_name="n_lossy")
    proxy = SlowProxy(LOSSY_PROXY_PORT, LOSSY_PORT, delay=0.2, jitter=0.1, seed=24)
    try:
        proxy.start()
        rules.lossy_port(LOSSY_PROXY_PORT, 0.05)
        nemesis_log, unexpected = soak.run(RUN_S)
        assert not unexpected, unexpected
        rc = soak.check(nemesis_log.path)
        report = json.loads((out / "checker.json").read_text())
    finally:
        proxy.stop()
        soak.close()
    counts = report["counts"]
    print(f"\nslow lossy link ({proxy.connections} connections, {proxy.bytes} bytes through the proxy): "
          f"{ {k: v for k, v in counts.items() if not k.startswith('log: ')} }")
    assert rc == 0 and report["violations"] == [], report["violations"][:20]
    assert proxy.connections >= 8
    assert counts["acknowledged grants"] >= 15 and counts["acknowledged sales"] >= 5
    assert counts["writes refused with FL001"] > 0, "no lease ran out on the slow link: the test proved nothing"
