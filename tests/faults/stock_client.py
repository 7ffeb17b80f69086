"""A real client process for the paused-client test (docs/design.md, "Why": the worked example).

    stock_client.py PORT DBNAME LOCK ITEM GO_FILE RETRY_FILE

1. takes the lock with a 1 s ttl, prints `TOKEN t`, reads the stock, prints `READ q`;
2. waits until GO_FILE exists (the test SIGSTOPs it meanwhile, past its ttl);
3. writes stock = q - 1 with its token; prints `WROTE` or `SQLSTATE code`;
4. if the write was rejected, waits until RETRY_FILE exists, then retries the
   right way (acquire, read, write, release) and prints `RETRIED q`.
Exit status: 0 the first write went through, 3 it was rejected with FL001 (and
the retry succeeded), 1 anything else. Every step is bounded in time.
"""

import os
import sys
import time

import psycopg


def wait_for(path, seconds=60):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            print("TIMEOUT waiting for", path, flush=True)
            sys.exit(1)
        time.sleep(0.02)


def main():
    port, dbname, lock, item, go_file, retry_file = sys.argv[1:7]
    conn = psycopg.connect(host="127.0.0.1", port=int(port), dbname=dbname, user="postgres",
                           autocommit=True, connect_timeout=10, options="-c statement_timeout=20000")
    token = conn.execute("SELECT fenced_lock_try_acquire(%s, '1 second')", (lock,)).fetchone()[0]
    print("TOKEN", token, flush=True)
    if token is None:
        sys.exit(1)
    qty = conn.execute("SELECT qty FROM stock WHERE item_id = %s", (item,)).fetchone()[0]
    print("READ", qty, flush=True)

    wait_for(go_file)
    try:
        conn.execute("UPDATE stock SET qty = %s, fence_token = %s WHERE item_id = %s", (qty - 1, token, item))
        print("WROTE", flush=True)
        sys.exit(0)
    except psycopg.Error as e:
        print("SQLSTATE", e.sqlstate, flush=True)
        if e.sqlstate != "FL001":
            sys.exit(1)

    wait_for(retry_file)
    token = conn.execute("SELECT fenced_lock_acquire(%s, '30 seconds', '10 seconds')", (lock,)).fetchone()[0]
    qty = conn.execute("SELECT qty FROM stock WHERE item_id = %s", (item,)).fetchone()[0]
    conn.execute("UPDATE stock SET qty = %s, fence_token = %s WHERE item_id = %s", (qty - 1, token, item))
    released = conn.execute("SELECT fenced_lock_release(%s, %s)", (lock, token)).fetchone()[0]
    print("RETRIED", qty - 1, token, released, flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main()
