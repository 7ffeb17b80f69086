"""The conformance examples of every client library (clients/README.md, "The
conformance examples"), driven through `clients/run LANG ...` against a real
server. Each test checks one promise for every language at the same time
(`each_lang`, one thread each, every failure named by its language):

- hold: only JSON lines on stdout; acquired, renewed and released carry the
  token the server granted (checked in the history, as superuser); a write
  under a live lease is accepted; exit 0;
- hold frozen with SIGSTOP past its ttl: `lost` within a second of SIGCONT,
  its write refused with FL001, no release sent (the history shows the
  lease ended by expiry), exit 3;
- hold whose --wait runs out: the error line with 55P03, exit 1;
- hold --shared and hold --permits 2: the server has the lease in that mode
  (another shared lease lives beside it, an exclusive one does not; a
  second permit of 2, no third), renewed and released;
- inventory: four processes selling 25 each from a stock of 100, one frozen
  past its ttl: the stock ends at 0, the 100 `sold` lines carry exactly the
  stocks 99..0, each process's `done` count matches its `sold` lines;
- a bad command line: exit 2 and nothing on stdout.
"""

import itertools
import signal
import threading
import time

import psycopg
import pytest

EVENTS = {"acquired", "renewed", "write", "released", "lost", "error", "sold", "sold_out", "done"}
_ids = itertools.count(1)
_ids_lock = threading.Lock()


def next_id():
    with _ids_lock:
        return next(_ids)


def only_json_objects(example):
    bad = [line for _, line in example.lines if not line.strip().startswith("{")]
    bad += [m["line"] for m in example.messages if m["event"] == "<not a JSON object>"]
    assert bad == [], f"stdout lines that are not JSON objects: {bad}"
    unknown = [m for m in example.messages if m["event"] not in EVENTS]
    assert unknown == [], f"unknown events: {unknown}"


def new_doc(admin):
    """A row of docs and its lock name. Rows are inserted under a lease."""
    i = next_id()
    lock = f"doc:{i}"
    t = admin.execute("SELECT fenced_lock_try_acquire(%s, '10 s')", (lock,)).fetchone()[0]
    admin.execute("INSERT INTO docs VALUES (%s, %s)", (i, t))
    admin.execute("SELECT fenced_lock_release(%s, %s)", (lock, t))
    return i, lock


def new_item(admin, stock):
    i = next_id()
    lock = f"inventory:{i}"
    t = admin.execute("SELECT fenced_lock_try_acquire(%s, '10 s')", (lock,)).fetchone()[0]
    admin.execute("INSERT INTO inventory VALUES (%s, %s, %s)", (i, stock, t))
    admin.execute("SELECT fenced_lock_release(%s, %s)", (lock, t))
    return i, lock


def history(admin, lock):
    return {row[0]: {"holder": row[1], "ended_by": row[2], "ended_by_role": row[3]} for row in admin.execute(
        "SELECT token, holder, ended_by, ended_by_role FROM fenced_lock_history WHERE name = %s", (lock,))}


def stopped(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def connect(dsn):
    """Each language's check has a superuser connection of its own (they
    run at once)."""
    return psycopg.connect(dsn, autocommit=True)


def test_hold_reports_the_servers_token_writes_under_the_live_lease_and_releases(each_lang, dsn, run_example):
    def check(lang):
        with connect(dsn) as admin:
            row, lock = new_doc(admin)
            holder = f"conformance-{lang}"
            hold = run_example(lang, "hold", "--dsn", dsn, "--name", lock, "--ttl", "1", "--hold", "1.5",
                               "--write", f"docs:{row}", "--holder", holder)
            token = hold.expect("acquired", 60)["token"]
            write = hold.expect("write", 30)
            assert write["ok"] is True, write
            released = hold.expect("released", 30)
            assert hold.wait(30) == 0, hold.stderr
            only_json_objects(hold)
            events = [m["event"] for m in hold.messages]
            assert events[0] == "acquired" and events[-1] == "released", events
            assert set(events) == {"acquired", "renewed", "write", "released"}, events
            assert all(m["token"] == token for m in hold.messages if m["event"] in ("acquired", "renewed", "released"))
            assert released["released"] is True
            # The server's side: that token is the lease this holder was
            # granted, ended by its release; the write carries it.
            h = history(admin, lock)
            assert token in h, f"token {token} is not in the history of {lock}: {h}"
            assert h[token]["holder"] == holder and h[token]["ended_by"] == "release", h[token]
            assert admin.execute("SELECT fence_token FROM docs WHERE id = %s", (row,)).fetchone()[0] == token

    each_lang(check)


def test_hold_frozen_past_its_ttl_is_lost_within_a_second_of_sigcont_writes_nothing_and_exits_3(
        each_lang, dsn, run_example):
    def check(lang):
        with connect(dsn) as admin:
            row, lock = new_doc(admin)
            # --hold outlasts the freeze, so that the write comes after the lost line.
            hold = run_example(lang, "hold", "--dsn", dsn, "--name", lock, "--ttl", "1", "--hold", "4",
                               "--write", f"docs:{row}")
            token = hold.expect("acquired", 60)["token"]
            hold.signal(signal.SIGSTOP)
            wait_until(lambda: stopped(hold.proc.pid), 5, "the example to stop")
            wait_until(lambda: not admin.execute("SELECT fenced_lock_validate(%s, %s)", (lock, token)).fetchone()[0],
                       15, "the lease to expire on the server")
            # Another holder takes over: that records the expiry in the history.
            other = admin.execute("SELECT fenced_lock_try_acquire(%s, '60 s')", (lock,)).fetchone()[0]
            assert other is not None and other > token, (other, token)
            try:
                resumed = hold.signal(signal.SIGCONT)
                lost = hold.expect("lost", 10)
                print(f"{lang}: lost {lost['_at'] - resumed:.3f} s after SIGCONT")
                assert lost["token"] == token
                assert lost["_at"] - resumed < 1.0, f"lost {lost['_at'] - resumed:.2f} s after SIGCONT"
                write = hold.expect("write", 30, skip=())
                assert (write["ok"], write.get("sqlstate")) == (False, "FL001"), write
                assert hold.wait(30) == 3, hold.stderr
                only_json_objects(hold)
                assert hold.events("released") == []
                assert admin.execute("SELECT fence_token FROM docs WHERE id = %s", (row,)).fetchone()[0] != token
            finally:
                admin.execute("SELECT fenced_lock_release(%s, %s)", (lock, other))
            h = history(admin, lock)
            assert h[token]["ended_by"] == "expiry" and h[token]["ended_by_role"] is None, h[token]

    each_lang(check)


def test_hold_whose_wait_runs_out_prints_the_error_with_55p03_and_exits_1(each_lang, dsn, run_example):
    def check(lang):
        with connect(dsn) as admin:
            _, lock = new_doc(admin)
            t = admin.execute("SELECT fenced_lock_try_acquire(%s, '60 s')", (lock,)).fetchone()[0]
            try:
                hold = run_example(lang, "hold", "--dsn", dsn, "--name", lock, "--ttl", "5", "--hold", "1",
                                   "--wait", "0.5")
                error = hold.expect("error", 60, skip=())
                assert hold.wait(30) == 1, hold.stderr
                only_json_objects(hold)
                assert [m["event"] for m in hold.messages] == ["error"]
                assert error["sqlstate"] == "55P03", error
                assert isinstance(error["message"], str) and error["message"]
                assert admin.execute("SELECT fenced_lock_validate(%s, %s)", (lock, t)).fetchone()[0]
            finally:
                admin.execute("SELECT fenced_lock_release(%s, %s)", (lock, t))

    each_lang(check)


def test_hold_takes_a_shared_lease_with_shared_and_a_permit_with_permits(each_lang, dsn, run_example):
    def check(lang):
        with connect(dsn) as admin:
            readers, sem = f"readers:{lang}:{next_id()}", f"sem:{lang}:{next_id()}"
            shared = run_example(lang, "hold", "--dsn", dsn, "--name", readers, "--ttl", "1", "--hold", "2",
                                 "--shared")
            permit = run_example(lang, "hold", "--dsn", dsn, "--name", sem, "--ttl", "1", "--hold", "2",
                                 "--permits", "2")
            ts = shared.expect("acquired", 60)["token"]
            tp = permit.expect("acquired", 60)["token"]
            # While they hold: the server has them in those modes; another
            # shared lease lives beside the first, an exclusive one does not;
            # a second permit of 2 is granted, then no third, and another
            # count is a mode conflict.
            assert admin.execute("SELECT mode, permits FROM fenced_lock_leases WHERE token = %s", (ts,)).fetchone() \
                == ("shared", None)
            assert admin.execute("SELECT mode, permits FROM fenced_lock_leases WHERE token = %s", (tp,)).fetchone() \
                == ("permit", 2)
            assert admin.execute("SELECT fenced_lock_try_acquire(%s, '5 s')", (readers,)).fetchone()[0] is None
            other = admin.execute("SELECT fenced_lock_try_acquire(%s, '5 s', shared => true)", (readers,)).fetchone()[0]
            second = admin.execute("SELECT fenced_lock_try_acquire(%s, '5 s', holder => 'h2', permits => 2)",
                                   (sem,)).fetchone()[0]
            assert other is not None and second is not None, (other, second)
            assert admin.execute("SELECT fenced_lock_try_acquire(%s, '5 s', holder => 'h3', permits => 2)",
                                 (sem,)).fetchone()[0] is None
            with pytest.raises(psycopg.Error) as e:
                admin.execute("SELECT fenced_lock_try_acquire(%s, '5 s', holder => 'h4', permits => 3)", (sem,))
            assert e.value.sqlstate == "FL003", e.value
            for hold, token in ((shared, ts), (permit, tp)):
                released = hold.expect("released", 30)
                assert hold.wait(30) == 0, hold.stderr
                only_json_objects(hold)
                assert released["token"] == token and released["released"] is True, released
                assert hold.events("renewed"), "no renew of a lease of that mode"
            assert admin.execute("SELECT fenced_lock_release(%s, %s)", (readers, other)).fetchone()[0]
            assert admin.execute("SELECT fenced_lock_release(%s, %s)", (sem, second)).fetchone()[0]
            ended = {**history(admin, readers), **history(admin, sem)}
            assert ended[ts]["ended_by"] == ended[tp]["ended_by"] == "release", ended

    each_lang(check)


def expiries(admin, lock):
    return admin.execute("SELECT count(*) FROM fenced_lock_history WHERE name = %s AND ended_by = 'expiry'",
                         (lock,)).fetchone()[0]


def freeze_one_past_its_ttl(admin, lock, item, procs, ttl):
    """SIGSTOP one of `procs` until a lease of `lock` ends by expiry, then
    SIGCONT; returns how many freezes it took. The running processes keep
    their leases alive, so an expiry means the frozen one held the lease, or
    was granted it while frozen: the line is FIFO, so a process frozen while
    queued is granted after at most the three others' sales. If the others
    sell a fourth unit meanwhile, it was between sales: resume it and freeze
    one again at once."""
    def stock():
        return admin.execute("SELECT stock FROM inventory WHERE item_id = %s", (item,)).fetchone()[0]

    for attempt in range(60):
        running = [p for p in procs if p.proc.poll() is None and len(p.events("sold")) < 24]
        if len(running) < 2:
            break
        target = running[attempt % len(running)]
        before, stock_before = expiries(admin, lock), stock()
        target.signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + ttl + 3
            while time.monotonic() < deadline:
                if expiries(admin, lock) > before:
                    return attempt + 1
                if stock_before - stock() >= 4:
                    break  # missed: it was neither holding nor in line
                time.sleep(0.02)
        finally:
            target.signal(signal.SIGCONT)
    raise AssertionError("no inventory process was ever frozen holding the lease past its ttl")


@pytest.mark.budget(240)
def test_inventory_four_processes_sell_100_exactly_once_while_one_is_frozen_past_its_ttl(
        each_lang, dsn, run_example):
    def check(lang):
        with connect(dsn) as admin:
            item, lock = new_item(admin, 100)
            ttl = 1.0
            started = time.monotonic()
            procs = [run_example(lang, "inventory", "--dsn", dsn, "--item", item, "--sales", 25, "--ttl", ttl)
                     for _ in range(4)]
            wait_until(lambda: sum(len(p.events("sold")) for p in procs) >= 4, 90, "the first sales")
            tries = freeze_one_past_its_ttl(admin, lock, item, procs, ttl)
            for p in procs:
                assert p.wait(120) == 0, p.stderr
            for p in procs:
                p.expect("<end of output>", 10, skip=("sold", "sold_out", "done"))
                only_json_objects(p)
            print(f"{lang}: 100 sales by 4 processes in {time.monotonic() - started:.1f} s (frozen {tries} time(s))")
            sold = [m["stock"] for p in procs for m in p.events("sold")]
            assert sorted(sold) == list(range(100)), f"sold stocks {sorted(sold)}; by process: " + \
                "; ".join(" ".join(str(m["stock"]) for m in p.events("sold")) for p in procs)
            for p in procs:
                (done,) = p.events("done")
                assert done["sold"] == len(p.events("sold")), f"done {done} after {len(p.events('sold'))} sales"
                assert p.messages[-1]["event"] == "done"
            assert admin.execute("SELECT stock FROM inventory WHERE item_id = %s", (item,)).fetchone()[0] == 0
            ended = [h["ended_by"] for h in history(admin, lock).values()]
            assert ended.count("expiry") >= 1 and set(ended) <= {"release", "expiry"}, ended

    each_lang(check)


BAD_COMMAND_LINES = {
    "no example": [],
    "unknown example": ["frobnicate"],
    "hold without its options": ["hold"],
    "hold missing --hold": ["hold", "--dsn", "{dsn}", "--name", "x", "--ttl", "1"],
    "hold with a ttl that is not a number": ["hold", "--dsn", "{dsn}", "--name", "x", "--ttl", "soon", "--hold", "1"],
    "hold with an unknown option": ["hold", "--dsn", "{dsn}", "--name", "x", "--ttl", "1", "--hold", "1",
                                    "--no-such-option"],
    "inventory with an item that is not a number": ["inventory", "--dsn", "{dsn}", "--item", "seven",
                                                    "--sales", "1", "--ttl", "1"],
    "inventory missing --sales": ["inventory", "--dsn", "{dsn}", "--item", "1", "--ttl", "1"],
}


@pytest.mark.parametrize("case", BAD_COMMAND_LINES)
def test_bad_command_line_exits_2_with_nothing_on_stdout(each_lang, dsn, case, run_example):
    def check(lang):
        args = [a.format(dsn=dsn) for a in BAD_COMMAND_LINES[case]]
        example = run_example(lang, *args)
        assert example.wait(120) == 2, f"{case}: stderr:\n{example.stderr}"
        example.expect("<end of output>", 10, skip=())  # fails on any line printed
        assert example.lines == [], case

    each_lang(check)
