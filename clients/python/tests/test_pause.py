"""Promise (clients/README.md, "Keepalive" 3 and "The conformance examples"):
a client process frozen (SIGSTOP) past its lease's ttl signals lost within a
second of resuming (SIGCONT), without sending anything first; its guarded
write is refused with FL001, and it does not release. Shown with the hold
example as a real child process, on Locker and on AsyncLocker."""

import signal

import pytest

from conftest import history, process_state, wait_until

MODES = {"sync": {}, "asyncio": {"FENCED_LOCK_EXAMPLE_ASYNC": "1"}}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.budget(90)
def test_client_stopped_past_its_ttl_is_lost_within_a_second_of_sigcont_and_its_write_is_refused(
        mode, dsn, admin, doc, examples):
    row, lock = doc
    ttl = 1.0
    hold = examples("hold", "--dsn", dsn, "--name", lock, "--ttl", ttl, "--hold", 4, "--write", f"docs:{row}",
                    env=MODES[mode])
    token = hold.expect("acquired", 30)["token"]
    hold.signal(signal.SIGSTOP)
    wait_until(lambda: process_state(hold.proc.pid) == "T", 5, "the client to stop")
    # Frozen past the ttl: the server's lease expires; another holder takes
    # the name over (recording the expiry) with a larger token.
    wait_until(lambda: not admin.execute("SELECT fenced_lock_validate(%s, %s)", (lock, token)).fetchone()[0],
               10, "the lease to expire on the server")
    other = admin.execute("SELECT fenced_lock_try_acquire(%s, '30 s')", (lock,)).fetchone()[0]
    assert other > token
    try:
        resumed = hold.signal(signal.SIGCONT)
        lost = hold.expect("lost", 5)
        print(f"{mode}: lost {lost['_at'] - resumed:.3f} s after SIGCONT")
        assert lost["token"] == token
        assert lost["_at"] - resumed < 1.0
        write = hold.expect("write", 10)
        assert (write["ok"], write["sqlstate"]) == (False, "FL001")
        assert hold.expect("<eof>", 10)
        assert hold.wait(10) == 3
        assert hold.events("released") == []
        # No renew after the pause either: the lines after `lost` are the write only.
        after = hold.all[hold.all.index(next(m for m in hold.all if m["event"] == "lost")):]
        assert [m["event"] for m in after] == ["lost", "write"]
    finally:
        admin.execute("SELECT fenced_lock_release(%s, %s)", (lock, other))
    ended = {h["token"]: h["ended_by"] for h in history(admin, lock)}
    assert ended[token] == "expiry"  # expired, never released by the client
    assert admin.execute("SELECT fence_token FROM docs WHERE id = %s", (row,)).fetchone()[0] != token
