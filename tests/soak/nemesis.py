"""The soak's faults. Each nemesis picks its victim at random, does its harm
for a random while, undoes it, and logs one JSON line (kind, victim,
monotonic start and end) to the nemesis log, which the checker counts. The
runner starts them at random moments from several threads, so faults
overlap: a worker can be partitioned while another is stopped, the server
is crashed while a third's clock is off.

- kill_client: SIGKILL of a worker process; a new one takes its place.
- kill_server: kill -9 of the postmaster (every backend dies with it), then
  crash recovery and a restart.
- stop_holder: SIGSTOP of a worker that holds a lease, past its ttl, then
  SIGCONT (the GC pause of the seeds' story).
- partition_client: every packet of one worker's connection dropped both
  ways (iptables), then healed; some workers' sessions have server-side
  keepalives, which end the session (and a session-bound lease) meanwhile.
- clock_step: one worker's wall clock stepped by up to ±60 s (libfaketime's
  timestamp file), then stepped back; the worker trusts its wall clock for
  renewals, so a step makes it renew too late or too early.
- failover (SOAK_HA=1): kill -9 of the Patroni primary's postmaster.
"""

import json
import signal
import threading
import time


class NemesisLog:
    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.counts = {}

    def record(self, kind, start, **fields):
        fields.update(kind=kind, start=start, end=time.monotonic())
        with self.lock:
            with open(self.path, "a") as f:
                f.write(json.dumps(fields) + "\n")
            self.counts[kind] = self.counts.get(kind, 0) + 1


class Nemeses:
    """`soak` is the runner (workers, server, rules); `rnd` a random.Random."""

    def __init__(self, soak, rnd, log):
        self.soak, self.rnd, self.log = soak, rnd, log
        self.server_lock = threading.Lock()  # one server kill (or failover) at a time
        self.stopping = threading.Event()

    def _sleep(self, s):
        self.stopping.wait(s)

    def kill_client(self):
        w = self.soak.random_worker(self.rnd)
        if w is None:
            return
        t0 = time.monotonic()
        w.proc.send_signal(signal.SIGKILL)
        w.proc.wait(10)
        self._sleep(self.rnd.uniform(0, 1))
        self.soak.respawn(w)
        self.log.record("kill_client", t0, victim=w.wid)

    def kill_server(self):
        if not self.server_lock.acquire(blocking=False):
            return
        try:
            t0 = time.monotonic()
            self.soak.crash_server(down_for=self.rnd.uniform(0.2, 2.0))
            self.log.record("kill_server", t0)
        finally:
            self.server_lock.release()

    def failover(self):
        if not self.server_lock.acquire(blocking=False):
            return
        try:
            t0 = time.monotonic()
            info = self.soak.failover()
            self.log.record("failover", t0, **info)
        finally:
            self.server_lock.release()

    def stop_holder(self):
        holders = self.soak.holders()
        w = self.rnd.choice(holders) if holders else self.soak.random_worker(self.rnd)
        if w is None or w.stopped:
            return
        t0 = time.monotonic()
        w.stopped = True
        try:
            w.proc.send_signal(signal.SIGSTOP)
            self._sleep(self.rnd.uniform(1.5, 6.0))  # ttls are 1-4 s
        finally:
            try:
                w.proc.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            w.stopped = False
        self.log.record("stop_holder", t0, victim=w.wid, held=bool(holders))

    def partition_client(self):
        w = self.soak.random_worker(self.rnd)
        if w is None:
            return
        ports = self.soak.client_port(w)
        if ports is None:
            return
        port, server_port = ports
        t0 = time.monotonic()
        cut = self.soak.rules.cut_connection(port, server_port)
        try:
            self._sleep(self.rnd.uniform(1.0, 10.0))
        finally:
            cut.heal()
        self.log.record("partition_client", t0, victim=w.wid, port=port, keepalives=w.keepalives)

    def clock_step(self):
        w = self.soak.random_worker(self.rnd)
        if w is None or w.clock_off:
            return
        step = self.rnd.choice([-1, 1]) * self.rnd.uniform(2, 60)
        t0 = time.monotonic()
        w.clock_off = True
        try:
            w.set_clock(step)
            self._sleep(self.rnd.uniform(3, 20))
        finally:
            w.set_clock(0)
            w.clock_off = False
        self.log.record("clock_step", t0, victim=w.wid, step_s=round(step, 1))


def start_mixer(nemeses, kinds, weights, rnd, deadline, mean_gap_s=2.0, threads=3):
    """`threads` threads, each starting a nemesis picked at random (by
    `weights`) every 0..2*mean_gap_s seconds until `deadline`; returns them."""
    def loop(seed):
        import random
        r = random.Random(seed)
        while time.monotonic() < deadline and not nemeses.stopping.is_set():
            nemeses.stopping.wait(r.uniform(0, 2 * mean_gap_s))
            if time.monotonic() >= deadline or nemeses.stopping.is_set():
                break
            kind = r.choices(kinds, weights)[0]
            try:
                getattr(nemeses, kind)()
            except Exception as e:  # noqa: BLE001 - a failed fault is logged, the soak goes on
                nemeses.log.record("nemesis_error", time.monotonic(), nemesis=kind, error=repr(e)[:300])
    ts = [threading.Thread(target=loop, args=(rnd.randrange(1 << 30),), daemon=True) for _ in range(threads)]
    for t in ts:
        t.start()
    return ts
