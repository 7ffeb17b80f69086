#!/usr/bin/env python3
"""A counting semaphore with fenced_lock: N workers share K connections to
an external API (docs/reference.md, "Modes").

    python3 examples/api_pool.py --dsn "host=db dbname=app user=app" --setup
    python3 examples/api_pool.py --dsn "host=db dbname=app user=app" --workers 5 --permits 2 --jobs 20

The partner's API allows at most K calls at once. Each worker (a thread with
a database connection of its own; in real life, a process on some machine)
takes a job, then a permit of the semaphore --name:

    SELECT fenced_lock_acquire('partner-api', '30 s', '60 s', holder => 'worker-3', permits => 2);

It waits in line (asleep, in arrival order) while K others hold permits. With
a permit it calls the API, writes the result into api_results, stamped with
its permit's token, and releases the permit. api_results is guarded by the
semaphore's name (fenced_lock_protect('api_results', 'partner-api')): a
write is accepted only while its token is a live permit, so a worker that
lost its permit while it was calling (paused past the ttl, say, while
another worker took the permit over) cannot write a result: its write is
refused with FL001, and it does the job again under a new permit. A call
longer than a third of the ttl would renew the permit
(fenced_lock_renew) as it goes.

Without --api-url, the "external API" is a small HTTP server on 127.0.0.1
inside this process: each call takes --call-ms milliseconds, and it counts
how many calls it serves at once, so the output can show the limit held.

--setup creates api_results and guards it (run once, as the table's owner).
The application role needs EXECUTE on fenced_lock_acquire and
fenced_lock_release, and INSERT on api_results.

Output: one JSON object per line on stdout, each with "event" and "t"
(time.monotonic()):

    {"event": "api", "url": URL}                        the stand-in API is listening
    {"event": "call", "worker": W, "job": J, "token": T, "waited_ms": MS}
    {"event": "fenced", "worker": W, "job": J, "token": T, "sqlstate": "FL001"}   (then the job is retried)
    {"event": "done", "jobs": J, "calls": C, "fenced": F, "max_concurrent_calls": M, "seconds": S}
"""

import argparse
import http.server
import json
import sys
import threading
import time
import urllib.request

import psycopg

TABLE = """
CREATE TABLE api_results (
    job         int PRIMARY KEY,
    worker      text NOT NULL,
    response    text NOT NULL,
    written_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    fence_token bigint
)"""

_print_lock = threading.Lock()


def emit(event, **fields):
    fields = dict(event=event, **fields, t=time.monotonic())
    with _print_lock:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


class StandInAPI(http.server.ThreadingHTTPServer):
    """The partner's API: answers every GET after `delay` seconds, and keeps
    the largest number of calls it served at once."""

    daemon_threads = True

    def __init__(self, delay):
        self.delay = delay
        self.lock = threading.Lock()
        self.now = self.most = self.calls = 0
        super().__init__(("127.0.0.1", 0), StandInHandler)


class StandInHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        s = self.server
        with s.lock:
            s.now += 1
            s.calls += 1
            s.most = max(s.most, s.now)
        try:
            time.sleep(s.delay)
            body = json.dumps({"path": self.path, "answer": "ok"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        finally:
            with s.lock:
                s.now -= 1

    def log_message(self, *args):  # quiet
        pass


class Pool:
    def __init__(self, args, url):
        self.args = args
        self.url = url
        self.jobs = iter(range(1, args.jobs + 1))
        self.jobs_lock = threading.Lock()
        self.fenced = 0
        self.errors = []

    def next_job(self):
        with self.jobs_lock:
            return next(self.jobs, None)

    def worker(self, i):
        me = f"worker-{i}"
        a = self.args
        try:
            with psycopg.connect(a.dsn, autocommit=True, application_name=f"api_pool:{me}") as conn:
                job = self.next_job()
                while job is not None:
                    t0 = time.monotonic()
                    token = conn.execute(
                        "SELECT fenced_lock_acquire(%s, %s * interval '1 second', %s * interval '1 second', %s, "
                        "permits => %s)", (a.name, a.ttl, a.wait, me, a.permits)).fetchone()[0]
                    emit("call", worker=me, job=job, token=token, waited_ms=round((time.monotonic() - t0) * 1000, 1))
                    try:
                        with urllib.request.urlopen(f"{self.url}/jobs/{job}?worker={me}", timeout=30) as r:
                            response = r.read().decode()
                        conn.execute("INSERT INTO api_results (job, worker, response, fence_token) "
                                     "VALUES (%s, %s, %s, %s)", (job, me, response, token))
                    except psycopg.Error as e:
                        if e.sqlstate != "FL001":
                            raise
                        # the permit was lost during the call: the result is not written; do it again
                        with self.jobs_lock:
                            self.fenced += 1
                        emit("fenced", worker=me, job=job, token=token, sqlstate=e.sqlstate)
                        continue
                    finally:
                        conn.execute("SELECT fenced_lock_release(%s, %s)", (a.name, token))
                    job = self.next_job()
        except Exception as e:  # reported, and the exit code says so
            self.errors.append(f"{me}: {e!r}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", required=True)
    p.add_argument("--name", default="partner-api", help="the semaphore's lock name")
    p.add_argument("--workers", type=int, default=5)
    p.add_argument("--permits", type=int, default=2, help="K: calls the API allows at once")
    p.add_argument("--jobs", type=int, default=20)
    p.add_argument("--ttl", type=float, default=30.0, help="permit ttl, seconds")
    p.add_argument("--wait", type=float, default=60.0, help="longest wait for a permit, seconds")
    p.add_argument("--call-ms", type=float, default=50.0, help="how long the stand-in API takes per call")
    p.add_argument("--api-url", help="call this API instead of the stand-in (GET <url>/jobs/<n>)")
    p.add_argument("--setup", action="store_true", help="create and guard api_results, then exit")
    a = p.parse_args(argv)
    if a.setup:
        with psycopg.connect(a.dsn, autocommit=True) as conn:
            if not conn.execute("SELECT to_regclass('api_results') IS NOT NULL").fetchone()[0]:
                conn.execute(TABLE)
                # guarded by the semaphore's name: every write needs a live permit's token
                conn.execute("SELECT fenced_lock_protect('api_results', %s)", (a.name,))
        return 0

    api = None
    url = a.api_url
    if url is None:
        api = StandInAPI(a.call_ms / 1000)
        threading.Thread(target=api.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{api.server_address[1]}"
    emit("api", url=url)
    pool = Pool(a, url)
    t0 = time.monotonic()
    threads = [threading.Thread(target=pool.worker, args=(i,)) for i in range(1, a.workers + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    emit("done", jobs=a.jobs, calls=api.calls if api else None, fenced=pool.fenced,
         max_concurrent_calls=api.most if api else None, seconds=round(time.monotonic() - t0, 3),
         errors=pool.errors)
    if api:
        api.shutdown()
    return 1 if pool.errors else 0


if __name__ == "__main__":
    sys.exit(main())
