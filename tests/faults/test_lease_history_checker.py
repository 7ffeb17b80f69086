"""The history checker (lease_history.py) finds what it is there to find.

Each test hands it a small history made by hand with one violation planted,
and asserts that exactly that violation is reported, naming its tokens; a
clean history that uses every mode at its limits reports nothing. A checker
that cannot fail proves nothing about the stress run it checks. No server:
the checker reads plain data.
"""

from datetime import datetime, timedelta, timezone
from itertools import count

import pytest

import lease_history as lh

T0 = datetime(2026, 12, 2, 12, 0, 0, tzinfo=timezone.utc)
COMMIT = 0.001  # how long after its decision a grant or renew commits


def t(s):
    return T0 + timedelta(seconds=s)


class History:
    """Lease and write events as lease_history.lease_events/write_events
    return them; times in seconds after T0."""

    def __init__(self):
        self.leases, self.writes = [], []
        self.ids = count(1)
        self.records = {}  # token -> [name, expires, ttl, mode, permits]

    def grant(self, name, token, at, ttl=1.0, mode="exclusive", permits=1, commit=None, session_bound=False,
              xid=None):
        self.records[token] = [name, at + ttl, ttl, mode, permits]
        self.leases.append(dict(
            id=next(self.ids), op="INSERT", name=name, old_token=None, new_token=token, old_expires=None,
            new_expires=t(at + ttl), new_ttl=timedelta(seconds=ttl), acquired_at=t(at),
            commit_ts=t(at + COMMIT if commit is None else commit), at=t(at), session_bound=session_bound,
            mode=mode, permits=permits, ended_by=None, ended_at=None, xid=xid))
        return self

    def renew(self, token, at, ttl=None, written=None):
        """A renew decided at `at`; `ttl` other than the lease's own is what a
        test must not do (the record keeps the granted ttl)."""
        rec = self.records[token]
        name, old, own, mode, permits = rec
        rec[1] = at + (own if ttl is None else ttl)
        self.leases.append(dict(
            id=next(self.ids), op="UPDATE", name=name, old_token=token, new_token=token, old_expires=t(old),
            new_expires=t(rec[1]), new_ttl=timedelta(seconds=own), acquired_at=None, commit_ts=t(at + COMMIT),
            at=t(at if written is None else written), session_bound=False, mode=mode, permits=permits,
            ended_by=None, ended_at=None))
        return self

    def end(self, token, at, by="release", xid=None, session_bound=False):
        """The record removed by a transaction committed at `at` (for an
        expiry, by the grant that takes over in transaction `xid`, or the
        reaper)."""
        name, expires, ttl, mode, permits = self.records[token]
        self.leases.append(dict(
            id=next(self.ids), op="DELETE", name=name, old_token=token, new_token=None, old_expires=t(expires),
            new_expires=None, new_ttl=timedelta(seconds=ttl), acquired_at=None, commit_ts=t(at), at=t(at),
            session_bound=session_bound, mode=mode, permits=permits, ended_by=by,
            ended_at=t(expires if by == "expiry" else at), xid=xid))
        return self

    def write(self, name, token, at, tbl="rows", accepts_shared=False, op="INSERT", version=None, counter=None):
        self.writes.append(dict(id=next(self.ids), tbl=tbl, op=op, name=name, token=token, commit_ts=t(at),
                                accepts_shared=accepts_shared, version=version, counter=counter))
        return self

    def check(self, counters=None):
        return lh.check(self.leases, self.writes, counters)


def kinds(violations):
    return sorted({v.kind for v in violations})


def only(violations, kind):
    """The violations, all of `kind` (or the assertion shows them all)."""
    assert kinds(violations) == [kind], [str(v) for v in violations]
    return violations


def test_a_clean_history_of_every_mode_at_its_limits_reports_nothing():
    h = History()
    # exclusive: a write, a renew, a write and the release in one transaction;
    # the next lease expires with a write in flight that commits before the takeover.
    h.grant("x", 1, 0.0).write("x", 1, 0.2).renew(1, 0.5).write("x", 1, 0.7).end(1, 0.7)
    h.grant("x", 4, 0.8, ttl=0.5).write("x", 4, 1.35)
    h.end(4, 1.4, by="expiry", xid="900").grant("x", 9, 1.399, commit=1.4, xid="900")
    # shared: three together, written through a guard that accepts them; the
    # exclusive lease that waited for them, with its counter.
    h.grant("s", 2, 0.1, mode="shared").grant("s", 3, 0.2, mode="shared").grant("s", 5, 0.9, mode="shared")
    for token, at in ((2, 0.3), (3, 0.4), (5, 0.95)):
        h.write("s", token, at, tbl="readings", accepts_shared=True)
    h.end(2, 0.96).end(3, 1.0).end(5, 1.05)
    h.grant("s", 10, 1.5, commit=1.501)
    h.write("s", 10, 1.6, tbl="tallies", op="UPDATE", version=1, counter=1)
    h.write("s", 10, 1.7, tbl="tallies", op="UPDATE", version=2, counter=2)
    # permits of 3: three live at once, one handed over at a release; the count
    # changes once none is live.
    h.grant("p", 6, 1.01, mode="permit", permits=3).grant("p", 7, 1.02, mode="permit", permits=3)
    h.grant("p", 8, 1.03, mode="permit", permits=3).write("p", 8, 1.04).end(6, 1.05)
    h.grant("p", 11, 1.51, mode="permit", permits=3).write("p", 11, 1.52)
    for token, at in ((7, 1.6), (8, 1.61), (11, 1.62)):
        h.end(token, at)
    h.grant("p", 12, 1.7, mode="permit", permits=2)
    # session-bound: its session ended before its expiry, and the name went on.
    h.grant("b", 13, 1.71, ttl=5.0, session_bound=True).end(13, 1.8, by="session_end", session_bound=True)
    h.grant("b", 14, 1.81)
    assert h.check(counters={("tallies", "s"): (2, 2)}) == []
    assert lh.summary(h.leases, h.writes)["most_live"] == {"exclusive": 1, "permit": 3, "shared": 3}


def test_two_overlapping_exclusive_leases_are_reported():
    h = History().grant("x", 1, 0.0).grant("x", 2, 0.5)
    (v,) = only(h.check(), lh.EXCLUSIVE_OVERLAP)
    assert v.tokens == (1, 2) and v.at == t(0.5 + COMMIT)


@pytest.mark.parametrize("first,second", [("shared", "exclusive"), ("exclusive", "shared")])
def test_an_exclusive_lease_beside_a_shared_one_is_reported(first, second):
    h = History().grant("s", 1, 0.0, mode=first).grant("s", 2, 0.5, mode=second)
    (v,) = only(h.check(), lh.EXCLUSIVE_OVERLAP)
    assert v.tokens == (1, 2)


def test_a_grant_right_as_a_release_commits_is_not_an_overlap():
    h = History().grant("x", 1, 0.0).end(1, 0.5).grant("x", 2, 0.499, commit=0.5)
    assert h.check() == []


@pytest.mark.parametrize("plant", ["removed_as_expired_before_its_expiry", "not_session_bound"])
def test_a_live_lease_removed_as_if_it_had_ended_is_reported(plant):
    # The removal commits with the grant that replaces it: only the history's
    # word for how it ended, checked against its expiry and its binding, shows it.
    h = History().grant("x", 1, 0.0, ttl=1.0)
    if plant == "removed_as_expired_before_its_expiry":
        h.end(1, 0.5, by="expiry", xid="77").grant("x", 2, 0.499, commit=0.5, xid="77")
    else:
        h.end(1, 0.5, by="session_end", xid="77").grant("x", 2, 0.499, commit=0.5, xid="77")
    v = h.check()
    assert kinds(v) == [lh.ENDED_LIVE, lh.EXCLUSIVE_OVERLAP], [str(x) for x in v]
    assert {x.tokens for x in v} == {(1,), (1, 2)}


def test_a_removal_with_no_row_in_fenced_locks_history_is_flagged():
    h = History().grant("x", 1, 0.0).end(1, 0.5, by=None)
    only(h.check(), lh.HISTORY)


def test_n_plus_one_live_permits_are_reported():
    h = History()
    for token in range(1, 5):
        h.grant("p", token, token / 10, mode="permit", permits=3)
    (v,) = only(h.check(), lh.PERMITS_EXCEEDED)
    assert v.tokens == (1, 2, 3, 4)


def test_a_count_changed_while_a_permit_is_live_is_reported():
    h = History().grant("p", 1, 0.0, mode="permit", permits=3).grant("p", 2, 0.5, mode="permit", permits=4)
    (v,) = only(h.check(), lh.COUNT_CHANGED)
    assert v.tokens == (1, 2)


def test_shared_leases_beside_permits_are_reported():
    h = History().grant("p", 1, 0.0, mode="permit", permits=3).grant("p", 2, 0.5, mode="shared")
    only(h.check(), lh.MODES_MIXED)


@pytest.mark.parametrize("plant", ["after_its_release", "before_its_grant", "after_expiry_and_takeover",
                                   "under_a_token_never_granted", "under_another_names_lease"])
def test_an_accepted_write_outside_its_lease_is_reported(plant):
    h = History().grant("x", 1, 0.0).grant("y", 2, 0.1)
    if plant == "after_its_release":
        h.end(1, 0.5).write("x", 1, 0.6)
    elif plant == "before_its_grant":
        h.write("y", 2, 0.1)
    elif plant == "after_expiry_and_takeover":
        # the record removed with the takeover, but the stale write committed after it
        h.end(1, 1.2, by="expiry").grant("x", 3, 1.2, commit=1.2).write("x", 1, 1.1).write("x", 1, 1.3)
    elif plant == "under_a_token_never_granted":
        h.write("x", 99, 0.5)
    else:
        h.write("x", 2, 0.5)
    only(h.check(), lh.WRITE_OUTSIDE_LEASE)


def test_a_stale_write_after_a_takeover_that_left_the_old_record_is_reported():
    # If a grant took over without ending the expired record first, only the
    # times show that the write came too late.
    h = History().grant("x", 1, 0.0).grant("x", 2, 1.1).write("x", 1, 1.2)
    (v,) = only(h.check(), lh.WRITE_OUTSIDE_LEASE)
    assert v.tokens == (1, 2)


def test_a_shared_leases_write_accepted_by_a_guard_without_shared_is_reported():
    h = History().grant("s", 1, 0.0, mode="shared").write("s", 1, 0.5, accepts_shared=False)
    only(h.check(), lh.WRITE_MODE_REFUSED)


def test_a_token_granted_twice_is_reported():
    h = History().grant("x", 1, 0.0).end(1, 0.5).grant("y", 1, 1.0)
    (v,) = only(h.check(), lh.TOKEN_REPEATED)
    assert v.tokens == (1,)


@pytest.mark.parametrize("names", [("x", "x"), ("x", "y")], ids=["same_name", "across_names"])
def test_a_token_going_backwards_is_reported(names):
    h = History().grant(names[0], 5, 0.0).end(5, 0.5).grant(names[1], 3, 1.0)
    (v,) = only(h.check(), lh.TOKEN_BACKWARDS)
    assert v.tokens == (5, 3)


def test_tokens_of_two_names_decided_before_either_committed_may_come_in_any_order():
    h = History().grant("x", 2, 0.0, commit=0.01).grant("y", 1, 0.005)
    assert h.check() == []


@pytest.mark.parametrize("plant", ["after_its_expiry", "after_its_release"])
def test_a_renew_of_an_ended_lease_is_reported(plant):
    h = History().grant("x", 1, 0.0)
    if plant == "after_its_expiry":
        h.renew(1, 1.2)
    else:
        h.end(1, 0.5).renew(1, 0.6)
    only(h.check(), lh.RENEW_EXPIRED)


def test_a_renew_with_another_ttl_than_the_lease_was_granted_with_is_flagged():
    # The checker tells a renew's decision time by expires_at - ttl; a test
    # that renews with another ttl breaks that, and must hear of it.
    h = History().grant("x", 1, 0.0, ttl=1.0).renew(1, 0.5, ttl=0.2)
    only(h.check(), lh.HISTORY)


def test_a_lost_update_is_reported():
    h = History().grant("x", 1, 0.0, ttl=5.0)
    # Two read-modify-writes read counter 1: the second wrote 2 again.
    for version, counter in ((1, 1), (2, 2), (3, 2)):
        h.write("x", 1, version / 10, tbl="stock", op="UPDATE", version=version, counter=counter)
    (v,) = only(h.check(counters={("stock", "x"): (2, 3)}), lh.LOST_UPDATE)
    assert "version 3 with counter 2" in v.detail


def test_a_counter_short_of_its_updates_is_reported():
    h = History().grant("x", 1, 0.0).write("x", 1, 0.1, tbl="stock", op="UPDATE", version=1, counter=1)
    only(h.check(counters={("stock", "x"): (1, 2)}), lh.LOST_UPDATE)


def test_a_violation_says_what_was_violated_which_tokens_and_when():
    h = History().grant("x", 41, 0.0).grant("x", 42, 0.5)
    (text,) = [str(v) for v in h.check()]
    assert text.startswith("exclusive-overlap on 'x' at 12:00:00.501000: ")
    assert "exclusive lease 42 (live 12:00:00.501000..12:00:01.500000)" in text
    assert "exclusive lease 41 (live 12:00:00.001000..12:00:01.000000)" in text
