"""Promise (clients/README.md, "The scoped form and the retry helper"): `run`
acquires (waiting) with keepalive, calls fn(lease), releases and returns
fn's result; when fn raises FL001 the lease is dropped without a release and
everything runs again from the acquire, up to `attempts` times, then the
last FL001 is raised; any other error is raised at once, after the release.
Shown deterministically, and with four inventory processes selling 25 each
from a stock of 100 while one of them is frozen past its ttl."""

import asyncio
import signal
import time

import pytest

from conftest import history, wait_until
from fenced_lock import AsyncLocker, Locker, StaleToken

_items = iter(range(100, 1 << 20))  # item 1 is the README's


def new_item(admin, stock):
    item = next(_items)
    lock = f"inventory:{item}"
    t = admin.execute("SELECT fenced_lock_try_acquire(%s, '10 s')", (lock,)).fetchone()[0]
    admin.execute("INSERT INTO inventory VALUES (%s, %s, %s)", (item, stock, t))
    admin.execute("SELECT fenced_lock_release(%s, %s)", (lock, t))
    return item, lock


def take_over(admin, lock):
    """What a takeover after a pause looks like to the holder: its lease is
    gone and another holder wrote with a larger token."""
    admin.execute("SELECT fenced_lock_force_release(%s)", (lock,))
    t = admin.execute("SELECT fenced_lock_try_acquire(%s, '10 s')", (lock,)).fetchone()[0]
    item = int(lock.split(":")[1])
    admin.execute("UPDATE inventory SET stock = stock - 1, fence_token = %s WHERE item_id = %s", (t, item))
    admin.execute("SELECT fenced_lock_release(%s, %s)", (lock, t))


def sell(lease, item):
    with lease.conn.transaction():
        (stock,) = lease.conn.execute("SELECT stock FROM inventory WHERE item_id = %s", (item,)).fetchone()
        lease.conn.execute("UPDATE inventory SET stock = %s, fence_token = %s WHERE item_id = %s",
                           (stock - 1, lease.token, item))
    return stock - 1


def test_fn_refused_with_fl001_runs_again_from_the_acquire_and_its_lease_is_not_released(dsn, admin):
    item, lock = new_item(admin, 10)
    tokens = []

    def fn(lease):
        tokens.append(lease.token)
        if len(tokens) == 1:
            take_over(admin, lock)  # as if we had been paused here past the ttl
        return sell(lease, item)

    assert Locker(dsn).run(lock, fn, ttl=5) == 8  # 10, the takeover's sale, ours
    assert len(tokens) == 2 and tokens[1] > tokens[0]
    ended = {h["token"]: h["ended_by"] for h in history(admin, lock)}
    assert ended[tokens[0]] == "force_release"  # never released by the client
    assert ended[tokens[1]] == "release"
    assert admin.execute("SELECT stock, fence_token FROM inventory WHERE item_id = %s", (item,)).fetchone() == \
        (8, tokens[1])


def test_after_attempts_fl001s_the_last_one_is_raised(dsn, admin):
    item, lock = new_item(admin, 10)
    calls = []

    def fn(lease):
        calls.append(lease.token)
        take_over(admin, lock)
        return sell(lease, item)

    with pytest.raises(StaleToken) as e:
        Locker(dsn, attempts=4).run(lock, fn, ttl=5)
    assert len(calls) == 4
    assert f"presented token: {calls[-1]}" in e.value.detail
    calls.clear()
    with pytest.raises(StaleToken):
        Locker(dsn).run(lock, fn, ttl=5, attempts=2)
    assert len(calls) == 2
    ended = {h["token"]: h["ended_by"] for h in history(admin, lock)}
    assert all(ended[t] == "force_release" for t in calls)


def test_any_other_error_is_raised_at_once_after_the_release(dsn, admin, name):
    calls = []

    def fn(lease):
        calls.append(lease.token)
        raise KeyError("not a lease problem")

    with pytest.raises(KeyError):
        Locker(dsn).run(name, fn, ttl=5)
    assert len(calls) == 1
    assert [h["ended_by"] for h in history(admin, name)] == ["release"]


def test_default_is_five_attempts(dsn, admin):
    item, lock = new_item(admin, 100)
    calls = []

    def fn(lease):
        calls.append(1)
        take_over(admin, lock)
        return sell(lease, item)

    with pytest.raises(StaleToken):
        Locker(dsn).run(lock, fn, ttl=5)
    assert len(calls) == 5


def test_async_run_retries_after_fl001_and_releases_after_other_errors(dsn, admin, name):
    item, lock = new_item(admin, 10)
    tokens = []

    async def fn(lease):
        tokens.append(lease.token)
        if len(tokens) == 1:
            take_over(admin, lock)
        async with lease.conn.transaction():
            cur = await lease.conn.execute("SELECT stock FROM inventory WHERE item_id = %s", (item,))
            (stock,) = await cur.fetchone()
            await lease.conn.execute("UPDATE inventory SET stock = %s, fence_token = %s WHERE item_id = %s",
                                     (stock - 1, lease.token, item))
        return stock - 1

    async def failing(lease):
        raise KeyError("not a lease problem")

    async def go():
        locker = AsyncLocker(dsn)
        assert await locker.run(lock, fn, ttl=5) == 8
        with pytest.raises(KeyError):
            await locker.run(name, failing, ttl=5)

    asyncio.run(go())
    ended = {h["token"]: h["ended_by"] for h in history(admin, lock)}
    assert ended[tokens[0]] == "force_release" and ended[tokens[1]] == "release"
    assert [h["ended_by"] for h in history(admin, name)] == ["release"]


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


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
@pytest.mark.budget(150)
def test_four_processes_sell_a_stock_of_100_exactly_once_while_one_is_frozen_past_its_ttl(
        mode, dsn, admin, examples):
    item, lock = new_item(admin, 100)
    ttl = 1.0
    env = {"FENCED_LOCK_EXAMPLE_ASYNC": "1"} if mode == "asyncio" else {}
    started = time.monotonic()
    procs = [examples("inventory", "--dsn", dsn, "--item", item, "--sales", 25, "--ttl", ttl, env=env)
             for _ in range(4)]
    wait_until(lambda: sum(len(p.events("sold")) for p in procs) >= 4, 60, "the first sales")
    tries = freeze_one_past_its_ttl(admin, lock, item, procs, ttl)
    for p in procs:
        assert p.wait(90) == 0, p.stderr
    took = time.monotonic() - started
    for p in procs:
        p.expect("<eof>", 10, skip=("sold", "sold_out", "done"))
    stocks = sorted(m["stock"] for p in procs for m in p.events("sold"))
    retries = sum(p.stderr.count("retrying a sale") for p in procs)
    print(f"{mode}: 100 sales by 4 processes in {took:.1f} s, frozen {tries} time(s), "
          f"{retries} sale(s) retried after FL001")
    assert all(m["event"] != "<not json>" for p in procs for m in p.all)
    assert stocks == list(range(100))
    for p in procs:
        (done,) = p.events("done")
        assert done["sold"] == len(p.events("sold")) == 25
        assert p.events("sold_out") == []
    assert admin.execute("SELECT stock FROM inventory WHERE item_id = %s", (item,)).fetchone()[0] == 0
    ended = [h["ended_by"] for h in history(admin, lock)]
    assert ended.count("expiry") >= 1 and set(ended) <= {"release", "expiry"}
