"""The soak's checker, fed planted violations: a checker that stays quiet on
a history with an overlap is a defect (issue 24). Each test starts from one
small, consistent run (built here by hand: history, logs, audit, final
stock, as the soak would leave them), plants one violation, and requires the
checker to name it; the untouched run must pass, so that a checker that
reports everything is caught too. No server needed: check() takes plain data.

Times are server microseconds (history, audit) or client monotonic seconds
(logs), as the checker reads them.
"""

import copy
import json

import pytest

import checker

S = 1_000_000  # one second in the history's microseconds
INITIAL = 100


def lease(name, token, acquired, end, ended_by="release", mode=None, permits=None, holder=None,
          expires=None):
    return dict(name=name, token=token, holder=holder or f"h{token}", session_bound=False,
                acquired=acquired, expires=expires if expires is not None else end, ended=end,
                ended_by=ended_by, mode=mode, permits=permits)


def sale(i, item, token, old, stamped, commit, sid=None):
    return dict(id=i, item=item, sale=sid or f"w0.1:s{i}", token=token, old=old, new=old - 1,
                stamped=stamped, commit=commit)


def baseline():
    """Two items; item 0 taken by tokens 1, 3, 4 in turn (4 expired), item 1
    by token 2; three acknowledged sales of item 0 and one of item 1."""
    history = [
        lease("inv:0", 1, 10 * S, 12 * S),
        lease("inv:1", 2, 11 * S, 13 * S),
        lease("inv:0", 3, 12 * S, 15 * S),
        lease("inv:0", 4, 16 * S, 18 * S, ended_by="expiry"),
    ]
    audit = [
        sale(1, 0, 1, 100, 10 * S + 100, 10 * S + 200),
        sale(2, 1, 2, 100, 11 * S + 100, 11 * S + 200),
        sale(3, 0, 3, 99, 12 * S + 100, 12 * S + 200),
        sale(4, 0, 4, 98, 16 * S + 100, 16 * S + 200),
    ]
    logs = {"w0.1.jsonl": []}
    ev = logs["w0.1.jsonl"]
    t = 100.0
    for h, a in zip(sorted(history, key=lambda h: h["token"]), sorted(audit, key=lambda a: a["token"])):
        ev.append(dict(ev="acquire_sent", name=h["name"], holder=h["holder"], mono=t))
        ev.append(dict(ev="grant", name=h["name"], holder=h["holder"], token=h["token"], mono=t + 0.01,
                       expires=h["expires"] / S))
        ev.append(dict(ev="write_sent", name=h["name"], token=h["token"], item=a["item"], sale=a["sale"],
                       mono=t + 0.02))
        ev.append(dict(ev="write", name=h["name"], token=h["token"], item=a["item"], sale=a["sale"],
                       new_stock=a["new"], mono=t + 0.03))
        t += 1
    final = {0: 97, 1: 99}
    return dict(history=history, logs=logs, audit=audit, final=final, initial=INITIAL, nemesis=[], items=2)


def run(d):
    return checker.check(d["history"], d["logs"], d["audit"], d["final"], d["initial"], d["nemesis"],
                         items=d["items"], shelf=d.get("shelf"), pool=d.get("pool"))


def assert_reported(d, *words):
    violations, _ = run(d)
    hits = [x for x in violations if all(w in x for w in words)]
    assert hits, f"no violation mentioning {words}; got {violations}"
    return violations


def test_the_untouched_run_passes_and_is_counted():
    violations, counts = run(baseline())
    assert violations == []
    assert counts["leases in the history"] == 4
    assert counts["acknowledged grants"] == 4
    assert counts["acknowledged sales"] == counts["committed sales"] == 4


def test_two_overlapping_exclusive_leases_are_reported():
    d = baseline()
    d["history"][2]["acquired"] = 11 * S + 500_000  # token 3 granted while token 1 lives until 12 s
    assert_reported(d, "inv:0", "exclusive lease overlap", "token 1", "token 3")


def test_a_lease_granted_exactly_when_the_previous_one_expires_is_no_overlap():
    d = baseline()
    d["history"][0]["ended_by"] = "expiry"  # token 1 expired at 12 s; token 3 granted at 12 s
    assert run(d)[0] == []


def test_a_shared_lease_live_with_an_exclusive_one_is_reported():
    d = baseline()
    d["history"].append(lease("inv:1", 9, 12 * S, 14 * S, mode="shared"))  # token 2 lives until 13 s
    assert_reported(d, "inv:1", "exclusive lease overlap", "token 9")


def test_shared_leases_may_live_together():
    d = baseline()
    d["history"] += [lease("inv:7", 10, 20 * S, 25 * S, mode="shared"),
                     lease("inv:7", 11, 21 * S, 24 * S, mode="shared")]
    assert run(d)[0] == []


def test_one_permit_more_than_the_count_is_reported():
    d = baseline()
    d["history"] += [lease("pool:0", 20 + i, (30 + i) * S, 40 * S, mode="permit", permits=3) for i in range(4)]
    assert_reported(d, "pool:0", "4 permits live at once", "count 3")


def test_as_many_permits_as_the_count_pass():
    d = baseline()
    d["history"] += [lease("pool:0", 20 + i, (30 + i) * S, 40 * S, mode="permit", permits=3) for i in range(3)]
    d["history"].append(lease("pool:0", 30, 40 * S, 41 * S, mode="permit", permits=3))  # after one ended
    violations, counts = run(d)
    assert violations == [] and counts["most permits live at once"] == 3


def test_permits_of_two_counts_live_together_are_reported():
    d = baseline()
    d["history"] += [lease("pool:1", 40, 30 * S, 40 * S, mode="permit", permits=3),
                     lease("pool:1", 41, 31 * S, 40 * S, mode="permit", permits=5)]
    assert_reported(d, "pool:1", "permits of counts 3 and 5")


def test_rows_under_shared_leases_and_permits_must_carry_a_lease_of_that_kind():
    d = baseline()
    d["history"] += [lease("inv:1", 50, 20 * S, 21 * S, mode="shared"),
                     lease("pool:0", 51, 20 * S, 21 * S, mode="permit", permits=3)]
    d["shelf"] = [dict(item=1, token=50)]
    d["pool"] = [dict(pool=0, token=51)]
    assert run(d)[0] == []
    d["shelf"] = [dict(item=1, token=2)]  # an exclusive lease's token in the shared guard's table
    d["pool"] = [dict(pool=1, token=51)]  # another pool's permit
    assert_reported(d, "a count of item 1 recorded under token 2, not a shared lease")
    assert_reported(d, "a use of pool 1 recorded under token 51, not a permit")


def test_a_write_checked_after_its_lease_ended_is_reported():
    d = baseline()
    d["audit"][3]["stamped"] = 18 * S + 1  # token 4 expired at 18 s
    d["audit"][3]["commit"] = 18 * S + 5
    assert_reported(d, "write outside its lease", "w0.1:s4")


def test_a_write_committed_after_the_next_grant_is_reported():
    d = baseline()
    d["audit"][0]["commit"] = 12 * S + 50  # token 1's sale commits after token 3 was granted at 12 s
    assert_reported(d, "committed at", "after inv:0 was granted to token 3")


def test_a_write_under_a_token_of_another_name_is_reported():
    d = baseline()
    d["audit"][1]["token"] = 1  # item 1's sale stamped with inv:0's token
    assert_reported(d, "not a lease of inv:1")


def test_a_repeated_token_is_reported():
    d = baseline()
    d["history"][1]["token"] = 3  # inv:1 and inv:0 both granted token 3
    d["audit"][1]["token"] = 3
    assert_reported(d, "token 3 is in the history twice")


def test_a_token_acknowledged_to_two_grants_is_reported():
    d = baseline()
    d["logs"]["w9.1.jsonl"] = [dict(ev="acquire_sent", name="inv:1", holder="other", mono=300.0),
                               dict(ev="grant", name="inv:1", holder="other", token=2, mono=300.1, expires=13.0)]
    assert_reported(d, "token 2 acknowledged to two grants")


def test_a_session_re_acquiring_its_session_bound_lease_may_get_its_token_again_but_no_one_else():
    d = baseline()
    ev = d["logs"]["w0.1.jsonl"]
    ev.insert(0, dict(ev="connect", pid=1, port=1, mono=99.0))
    g = next(e for e in ev if e.get("token") == 4 and e["ev"] == "grant")
    g["session_bound"] = True
    again = [dict(ev="acquire_sent", name="inv:0", holder="again", mono=103.5),
             dict(ev="grant", name="inv:0", holder="again", token=4, mono=103.6, expires=18.0, session_bound=True)]
    d["logs"]["w0.1.jsonl"] = ev + again
    violations, counts = run(d)
    assert violations == [] and counts["session-bound re-acquires (same token)"] == 1
    # ... but not from another session of the same worker,
    d["logs"]["w0.1.jsonl"] = ev + [dict(ev="connect", pid=2, port=2, mono=103.4)] + again
    assert_reported(d, "token 4 acknowledged to two grants")
    # ... nor for a lease that is not session-bound.
    g["session_bound"] = False
    d["logs"]["w0.1.jsonl"] = ev + again
    assert_reported(d, "token 4 acknowledged to two grants")


def test_a_token_going_backwards_in_grant_order_is_reported():
    d = baseline()
    d["history"][3]["token"] = 0
    for a in d["audit"]:
        if a["token"] == 4:
            a["token"] = 0
    for e in d["logs"]["w0.1.jsonl"]:
        if e.get("token") == 4:
            e["token"] = 0
    assert_reported(d, "inv:0", "token 0 granted at", "tokens must grow in grant order")


def test_a_grant_sent_after_another_was_acknowledged_with_a_smaller_token_is_reported():
    d = baseline()
    # w5 asks for inv:9 after token 4 was acknowledged (mono 103.01) and gets token 1... of its own name.
    d["history"].append(lease("inv:9", 5, 1 * S, 2 * S))
    d["logs"]["w5.1.jsonl"] = [dict(ev="acquire_sent", name="inv:9", holder="h5", mono=200.0),
                               dict(ev="grant", name="inv:9", holder="h5", token=5, mono=200.1, expires=2.0)]
    assert run(d)[0] == []  # larger than everything acknowledged before: fine
    d["history"][-1]["token"] = -1
    d["logs"]["w5.1.jsonl"][1]["token"] = -1
    assert_reported(d, "token -1 (inv:9) was sent for after token 4")


def test_an_acknowledged_grant_missing_from_the_history_is_reported():
    d = baseline()
    d["logs"]["w0.1.jsonl"] += [dict(ev="acquire_sent", name="inv:1", holder="lost", mono=500.0),
                                dict(ev="grant", name="inv:1", holder="lost", token=77, mono=500.1, expires=1.0)]
    assert_reported(d, "acknowledged grant lost", "token 77")


def test_an_acknowledged_renewal_missing_from_the_history_is_reported():
    d = baseline()
    d["logs"]["w0.1.jsonl"].append(dict(ev="renew", name="inv:0", token=4, expires=19.5, mono=104.0))
    assert_reported(d, "acknowledged renewal lost", "inv:0/4")


def test_a_session_bound_re_acquire_that_shortens_the_lease_is_not_a_lost_renewal():
    d = baseline()
    ev = d["logs"]["w0.1.jsonl"]
    next(e for e in ev if e.get("token") == 4 and e["ev"] == "grant")["session_bound"] = True
    ev.append(dict(ev="renew", name="inv:0", token=4, expires=19.5, mono=104.0))
    ev.append(dict(ev="acquire_sent", name="inv:0", holder="again", mono=104.5))
    ev.append(dict(ev="grant", name="inv:0", holder="again", token=4, expires=18.0, mono=104.6, session_bound=True))
    assert run(d)[0] == []
    ev.pop()  # the re-acquire's answer never came: its expiry is unknown, and so no promise is checked
    assert run(d)[0] == []
    ev.pop()
    assert_reported(d, "acknowledged renewal lost", "inv:0/4")


def test_a_stock_that_does_not_add_up_is_reported():
    d = baseline()
    d["final"][0] = 98  # three sales of item 0 committed, but the stock is 100 - 2
    assert_reported(d, "item 0: final stock 98 != initial 100 - 3 committed sales")


def test_a_lost_update_is_reported():
    d = baseline()
    d["audit"][2]["old"] = 100  # token 3's sale replaced 100, not the 99 left by the sale before it
    d["audit"][2]["new"] = 99
    d["logs"]["w0.1.jsonl"][11]["new_stock"] = 99
    d["final"][0] = 98
    assert_reported(d, "item 0: lost update at sale w0.1:s3")


def test_an_acknowledged_sale_missing_from_the_data_is_reported():
    d = baseline()
    del d["audit"][3]
    d["final"][0] = 98
    assert_reported(d, "acknowledged sale lost: w0.1:s4")


def test_a_sale_nobody_sent_is_reported():
    d = baseline()
    d["audit"].append(sale(5, 1, 2, 99, 11 * S + 300, 11 * S + 400, sid="ghost:s1"))
    d["final"][1] = 98
    assert_reported(d, "sale ghost:s1 is in the data but no worker sent it")


def test_a_refused_sale_that_committed_is_reported():
    d = baseline()
    d["logs"]["w0.1.jsonl"] = [e for e in d["logs"]["w0.1.jsonl"] if not (e["ev"] == "write" and e["sale"] == "w0.1:s4")]
    d["logs"]["w0.1.jsonl"].append(dict(ev="fenced", name="inv:0", token=4, item=0, sale="w0.1:s4", mono=104.0))
    assert_reported(d, "sale w0.1:s4 was refused (FL001) yet committed")


def test_a_sale_whose_answer_was_lost_counts_without_a_violation():
    d = baseline()
    d["logs"]["w0.1.jsonl"] = [e for e in d["logs"]["w0.1.jsonl"] if not (e["ev"] == "write" and e["sale"] == "w0.1:s4")]
    violations, counts = run(d)
    assert violations == [] and counts["sales committed, answer lost"] == 1


def test_a_release_undone_without_a_crash_is_reported_and_with_one_is_allowed():
    d = baseline()
    d["history"][1]["ended_by"] = "expiry"
    d["logs"]["w0.1.jsonl"].append(dict(ev="release", name="inv:1", token=2, ok=True, mono=101.5))
    assert_reported(d, "acknowledged release of inv:1/2 undone without a crash")
    d["nemesis"] = [dict(kind="kill_server", start=101.7, end=103.0)]
    violations, counts = run(d)
    assert violations == [] and counts["releases undone by a crash"] == 1


def test_an_unexpected_error_of_a_worker_is_reported_and_expected_ones_are_not():
    d = baseline()
    d["logs"]["w0.1.jsonl"] += [dict(ev="conn_error", sqlstate=None, msg="connection refused", mono=200.0),
                                dict(ev="error", sqlstate="57014", msg="statement timeout", mono=201.0)]
    assert run(d)[0] == []
    d["logs"]["w0.1.jsonl"].append(dict(ev="error", sqlstate="XX000", msg="internal error", mono=202.0))
    assert_reported(d, "unexpected error XX000")


def test_faults_are_counted_from_the_nemesis_log():
    d = baseline()
    d["nemesis"] = [dict(kind=k, start=1.0, end=2.0) for k in ("kill_server", "partition_client", "partition_client")]
    _, counts = run(d)
    assert counts["fault: partition_client"] == 2 and counts["fault: kill_server"] == 1


def test_torn_last_lines_are_skipped_but_a_torn_line_in_the_middle_is_an_error(tmp_path):
    good = json.dumps(dict(ev="connect", w="w0.1", mono=1.0))
    (tmp_path / "w0.1.jsonl").write_text(good + "\n" + '{"ev":"gra')
    logs, torn = checker.load_logs(str(tmp_path))
    assert torn == 1 and logs["w0.1.jsonl"] == [json.loads(good)]
    (tmp_path / "w1.1.jsonl").write_text('{"ev":"gra\n' + good + "\n" + good + "\n")
    with pytest.raises(ValueError, match="not JSON"):
        checker.load_logs(str(tmp_path))


def test_the_report_prints_faults_operations_and_every_violation(capsys):
    d = copy.deepcopy(baseline())
    d["history"][2]["acquired"] = 11 * S
    d["nemesis"] = [dict(kind="stop_holder", start=1.0, end=2.0)]
    violations, counts = run(d)
    checker.report(violations, counts)
    out = capsys.readouterr().out
    assert "faults injected: stop_holder 1" in out
    assert "acknowledged sales 4" in out
    assert "VIOLATIONS:" in out and "exclusive lease overlap" in out
