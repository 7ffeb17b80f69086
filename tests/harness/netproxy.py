"""A user-space TCP proxy on loopback that makes a link slow: every chunk of
bytes is delivered `delay` ± `jitter` seconds after it was read, in order
within its direction (TCP delivers in order, so a late chunk holds back the
ones behind it, as a reordered or retransmitted segment does), independently
per connection and direction, so that messages of different clients overtake
each other. `hold()` stops delivery (bytes are kept, both TCP connections stay
healthy) until `release()`.

Packet loss is not done here: a proxy cannot lose bytes of a TCP stream
without corrupting it. Drop real packets on the proxy's port with
netfault.Rules.lossy_port(), and the kernel's TCP retransmits them: the
segments behind a lost one arrive first and wait in the receiver's
out-of-order queue, which is what reordering does to a TCP connection.

    with SlowProxy(listen_port, server_port, delay=0.2, jitter=0.1) as proxy:
        connect to 127.0.0.1:listen_port
"""

import random
import socket
import threading
import time
from collections import deque


class _Pipe:
    """One direction of one connection: a reader thread stamps chunks, a
    writer thread delivers them when due."""

    def __init__(self, proxy, src, dst, rnd):
        self.proxy, self.src, self.dst, self.rnd = proxy, src, dst, rnd
        self.queue = deque()
        self.cv = threading.Condition()
        self.closed = False
        self.last_due = 0.0
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()

    def _read(self):
        try:
            while True:
                data = self.src.recv(65536)
                if not data:
                    break
                d = max(0.0, self.proxy.delay + self.rnd.uniform(-self.proxy.jitter, self.proxy.jitter))
                with self.cv:
                    due = max(time.monotonic() + d, self.last_due)
                    self.last_due = due
                    self.queue.append((due, data))
                    self.cv.notify()
        except OSError:
            pass
        with self.cv:
            self.closed = True
            self.cv.notify()

    def _write(self):
        try:
            while True:
                with self.cv:
                    while not self.queue and not self.closed:
                        self.cv.wait(0.5)
                    if not self.queue:
                        break
                    due, data = self.queue[0]
                now = time.monotonic()
                if now < due:
                    time.sleep(min(due - now, 0.5))
                    continue
                if self.proxy.held.is_set():
                    time.sleep(0.05)
                    continue
                with self.cv:
                    self.queue.popleft()
                self.dst.sendall(data)
                self.proxy.bytes += len(data)
        except OSError:
            pass
        for s in (self.dst, self.src):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class SlowProxy:
    def __init__(self, listen_port, server_port, delay=0.2, jitter=0.1, seed=1, host="127.0.0.1"):
        self.listen_port, self.server_port, self.host = listen_port, server_port, host
        self.delay, self.jitter = delay, jitter
        self.rnd = random.Random(seed)
        self.held = threading.Event()
        self.connections = 0
        self.bytes = 0
        self._socks = []
        self._lock = threading.Lock()
        self._srv = None

    def start(self):
        self._srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._srv.bind((self.host, self.listen_port))
        self._srv.listen(256)
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self):
        while True:
            try:
                client, _ = self._srv.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection((self.host, self.server_port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.connections += 1
                self._socks += [client, upstream]
                seed = self.rnd.randrange(1 << 30)
            _Pipe(self, client, upstream, random.Random(seed))
            _Pipe(self, upstream, client, random.Random(seed + 1))

    def hold(self):
        self.held.set()

    def release(self):
        self.held.clear()

    def stop(self):
        if self._srv is not None:
            self._srv.close()
            self._srv = None
        with self._lock:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass
            self._socks.clear()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
