//! The decisions of the lease state machine, as pure functions of the
//! records and the request (docs/design.md, "Transitions" and "Modes"): no
//! PostgreSQL needed, tested below. `lease/mod.rs` takes the locks, reads,
//! calls these, and carries the decision out.

use crate::mode::{fit, Fit, LeaseMode};
use crate::store::{Ending, InProgress, Lease};
use pgrx::pg_sys;

/// Where a lease record stands at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Live,
    /// its `expires_at` has passed
    Expired,
    /// it was session-bound and its session has ended
    SessionEnded,
}

impl State {
    /// How a lease in this state ended, if it did.
    pub fn ending(self) -> Option<Ending> {
        match self {
            State::Live => None,
            State::Expired => Some(Ending::Expiry),
            State::SessionEnded => Some(Ending::SessionEnd),
        }
    }
}

/// The state of `lease` at `now`, asking `session_alive` only when that matters.
pub fn decide_state(lease: &Lease, now: i64, session_alive: impl FnOnce() -> bool) -> State {
    if !lease.unexpired(now) {
        State::Expired
    } else if !session_alive() {
        State::SessionEnded
    } else {
        State::Live
    }
}

/// How a grant counts one record of the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// committed and live
    Live,
    /// committed and ended (expired, or its session ended), not yet cleaned
    /// up: the grant must end it first (and so wait for its in-flight writes)
    Ended(Ending),
    /// another transaction is granting it, or ending or renewing it while it
    /// is live: it counts as held until that transaction is over
    InFlight(pg_sys::TransactionId),
    /// ended, and another transaction is cleaning it up: it does not count
    Leaving,
}

/// Judge a record as a grant sees it (with what other transactions are
/// doing to it), given its state by clock and session.
pub fn judge(state: State, in_progress: InProgress) -> Status {
    match (in_progress.inserting, state.ending(), in_progress.deleting) {
        (Some(xid), _, _) => Status::InFlight(xid),
        (None, None, Some(xid)) => Status::InFlight(xid),
        (None, None, None) => Status::Live,
        (None, Some(_), Some(_)) => Status::Leaving,
        (None, Some(ending), None) => Status::Ended(ending),
    }
}

/// What an acquire asks for (who asks is told by `asks_again` and `mine`).
pub struct Request {
    pub mode: LeaseMode,
}

/// Why a request can never be granted as asked (`FL003`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conflict {
    /// The name's live leases are of another mode or count.
    Mode { live: LeaseMode },
    /// The same holder or session holds lease `token` of another mode
    /// (an upgrade from shared to exclusive, or a change of mode).
    OwnOtherMode { token: i64, live: LeaseMode },
    /// Only the end of lease `token`, held by this very session, could let
    /// the request in: waiting for it would be waiting for oneself.
    OwnLease { token: i64 },
}

/// What an acquire should do with the records of the name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireDecision {
    /// The same holder (and a role that acts for the owner), or the session
    /// the lease is bound to, asks again for the same mode: keep the token,
    /// extend the lease.
    Extend { token: i64 },
    /// Grant a new lease, once the ended records `displace` (tokens) are
    /// cleaned up (which waits for their in-flight guarded writes).
    Grant { displace: Vec<i64> },
    /// Not now.
    Busy(Busy),
    /// Never as asked.
    Conflict(Conflict),
}

/// What stands in the way of a grant, for a waiter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Busy {
    /// the earliest expiry among the live leases in the way
    pub expires_at: Option<i64>,
    /// a transaction in the way (when no live lease is): wait for its end
    pub in_flight: Option<pg_sys::TransactionId>,
    /// a lease of this very session in the way that only its own end could
    /// move (an acquire refuses to wait for it, `Conflict::OwnLease`)
    pub own: Option<i64>,
}

/// Decide an acquire on the records of a name, each with its status.
///
/// - `asks_again(lease)`: the request comes from the same non-NULL holder of
///   a plain lease (and a role that acts for its owner), or from the session
///   a session-bound lease is bound to. A session-bound lease goes back only
///   to its own session, whatever holder it names.
/// - `mine(lease)`: the lease was granted to this very session.
pub fn decide_acquire(
    records: &[(&Lease, Status)],
    req: &Request,
    asks_again: impl Fn(&Lease) -> bool,
    mine: impl Fn(&Lease) -> bool,
) -> AcquireDecision {
    let live: Vec<&Lease> = records.iter().filter(|(_, s)| *s == Status::Live).map(|(l, _)| *l).collect();
    if let Some(l) = live.iter().find(|l| asks_again(l)) {
        return if l.mode == req.mode {
            AcquireDecision::Extend { token: l.token }
        } else {
            AcquireDecision::Conflict(Conflict::OwnOtherMode { token: l.token, live: l.mode })
        };
    }
    // Every live lease of a name has the same mode (this function keeps it so).
    if let Some(first) = live.first() {
        if fit(req.mode, first.mode, live.len()) == Fit::Conflict {
            return AcquireDecision::Conflict(Conflict::Mode { live: first.mode });
        }
    }
    let in_flight: Vec<(&Lease, pg_sys::TransactionId)> = records
        .iter()
        .filter_map(|(l, s)| match s {
            Status::InFlight(xid) => Some((*l, *xid)),
            _ => None,
        })
        .collect();
    // Everything held, live or in flight, as this request must count it.
    let held = live.len() + in_flight.len();
    let compatible = |l: &Lease| matches!(fit(req.mode, l.mode, 0), Fit::Together);
    let blocked = match req.mode {
        LeaseMode::Exclusive => held > 0,
        LeaseMode::Shared => {
            live.iter().any(|l| !compatible(l)) || in_flight.iter().any(|(l, _)| !compatible(l))
        }
        LeaseMode::Permit(n) => {
            live.iter().any(|l| l.mode != req.mode)
                || in_flight.iter().any(|(l, _)| l.mode != req.mode)
                || held >= n as usize
        }
    };
    if !blocked {
        let displace =
            records.iter().filter_map(|(l, s)| matches!(s, Status::Ended(_)).then_some(l.token)).collect();
        return AcquireDecision::Grant { displace };
    }
    let in_the_way: Vec<&Lease> =
        live.iter().copied().filter(|l| !compatible(l) || req.mode.capacity().is_some()).collect();
    let own = match req.mode {
        // Every live permit is this session's: only one of them ending lets it in.
        LeaseMode::Permit(_) => {
            (in_flight.is_empty() && !live.is_empty() && live.iter().all(|l| mine(l))).then(|| live[0].token)
        }
        // Any one of this session's leases in the way can never be waited out.
        _ => in_the_way.iter().find(|l| mine(l)).map(|l| l.token),
    };
    AcquireDecision::Busy(Busy {
        expires_at: in_the_way.iter().map(|l| l.expires_at).min(),
        in_flight: if in_the_way.is_empty() { in_flight.first().map(|(_, x)| *x) } else { None },
        own,
    })
}

/// What a renew, release or proclaim of lease `token` should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerDecision {
    Apply,
    /// `token` is not a live lease of the name (expired, released, unknown,
    /// or its session ended).
    NotLive,
    /// It is, but the caller does not act for its owner.
    NotOwner {
        owner: pg_sys::Oid,
    },
}

pub fn decide_owner_change(
    current: Option<(&Lease, State)>,
    token: i64,
    acts_for_owner: impl FnOnce(pg_sys::Oid) -> bool,
) -> OwnerDecision {
    match current {
        Some((l, State::Live)) if l.token == token => {
            if acts_for_owner(l.owner) {
                OwnerDecision::Apply
            } else {
                OwnerDecision::NotOwner { owner: l.owner }
            }
        }
        _ => OwnerDecision::NotLive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::InProgress;
    use LeaseMode::*;

    const ALICE: u32 = 100;
    const BOB: u32 = 200;
    const XID: pg_sys::TransactionId = pg_sys::TransactionId::from_inner(777);

    fn lease(token: i64, holder: Option<&str>, owner: u32, mode: LeaseMode) -> Lease {
        Lease {
            tid: Default::default(),
            name: "n".into(),
            token,
            holder: holder.map(String::from),
            owner: pg_sys::Oid::from(owner),
            acquired_at: 0,
            expires_at: 100 + token,
            ttl_micros: 30_000_000,
            session_bound: false,
            mode,
            value: None,
        }
    }

    fn req(mode: LeaseMode, holder: Option<&str>) -> (Request, Option<&str>) {
        (Request { mode }, holder)
    }

    /// The usual `asks_again`: the same non-NULL holder and owner ALICE.
    fn holder_of(holder: Option<&str>) -> impl Fn(&Lease) -> bool + '_ {
        move |l| holder.is_some() && l.holder.as_deref() == holder && l.owner == pg_sys::Oid::from(ALICE)
    }

    fn nobody(_: &Lease) -> bool {
        false
    }

    fn decide(records: &[(&Lease, Status)], r: &(Request, Option<&str>)) -> AcquireDecision {
        decide_acquire(records, &r.0, holder_of(r.1), nobody)
    }

    #[test]
    fn a_free_name_is_granted_and_ended_records_are_displaced_first() {
        assert_eq!(decide(&[], &req(Exclusive, None)), AcquireDecision::Grant { displace: vec![] });
        let old = lease(5, None, BOB, Exclusive);
        let gone = lease(6, None, BOB, Exclusive);
        assert_eq!(
            decide(&[(&old, Status::Ended(Ending::Expiry)), (&gone, Status::Leaving)], &req(Exclusive, None)),
            AcquireDecision::Grant { displace: vec![5] }
        );
    }

    #[test]
    fn the_state_of_a_record_follows_the_clock_then_its_session() {
        let l = lease(5, None, ALICE, Exclusive);
        assert_eq!(decide_state(&l, 104, || true), State::Live);
        assert_eq!(decide_state(&l, 105, || true), State::Expired);
        assert_eq!(decide_state(&l, 104, || false), State::SessionEnded);
        assert_eq!(decide_state(&l, 105, || false), State::Expired, "expiry is told first");
    }

    #[test]
    fn what_other_transactions_do_counts_as_held_unless_the_record_has_ended() {
        let none = InProgress::default();
        let inserting = InProgress { inserting: Some(XID), deleting: None };
        let deleting = InProgress { inserting: None, deleting: Some(XID) };
        assert_eq!(judge(State::Live, none), Status::Live);
        assert_eq!(judge(State::Live, inserting), Status::InFlight(XID));
        assert_eq!(judge(State::Live, deleting), Status::InFlight(XID), "a release may yet roll back");
        assert_eq!(judge(State::Expired, none), Status::Ended(Ending::Expiry));
        assert_eq!(judge(State::SessionEnded, none), Status::Ended(Ending::SessionEnd));
        assert_eq!(judge(State::Expired, deleting), Status::Leaving);
    }

    #[test]
    fn an_exclusive_lease_excludes_every_other_lease_and_waits_for_uncommitted_ones() {
        let s = lease(5, None, BOB, Shared);
        assert!(matches!(decide(&[(&s, Status::Live)], &req(Exclusive, None)), AcquireDecision::Busy(b)
            if b.expires_at == Some(105)));
        let pending = lease(6, None, BOB, Exclusive);
        assert_eq!(
            decide(&[(&pending, Status::InFlight(XID))], &req(Exclusive, None)),
            AcquireDecision::Busy(Busy { expires_at: None, in_flight: Some(XID), own: None })
        );
        let e = lease(7, None, BOB, Exclusive);
        assert!(matches!(decide(&[(&e, Status::Live)], &req(Shared, None)), AcquireDecision::Busy(_)));
    }

    #[test]
    fn shared_leases_are_granted_together_each_with_its_own_token() {
        let a = lease(5, None, BOB, Shared);
        let b = lease(6, None, ALICE, Shared);
        assert_eq!(
            decide(&[(&a, Status::Live), (&b, Status::InFlight(XID))], &req(Shared, None)),
            AcquireDecision::Grant { displace: vec![] }
        );
    }

    #[test]
    fn a_semaphore_admits_its_count_counting_uncommitted_grants() {
        let a = lease(5, None, BOB, Permit(2));
        let b = lease(6, None, BOB, Permit(2));
        assert_eq!(
            decide(&[(&a, Status::Live)], &req(Permit(2), None)),
            AcquireDecision::Grant { displace: vec![] }
        );
        assert!(matches!(
            decide(&[(&a, Status::Live), (&b, Status::InFlight(XID))], &req(Permit(2), None)),
            AcquireDecision::Busy(_)
        ));
        assert!(matches!(decide(&[(&a, Status::Live), (&b, Status::Live)], &req(Permit(2), None)),
            AcquireDecision::Busy(b) if b.expires_at == Some(105)));
    }

    #[test]
    fn another_count_or_mode_on_a_semaphore_is_a_conflict_never_a_wait() {
        let a = lease(5, None, BOB, Permit(2));
        for asked in [Permit(3), Exclusive, Shared] {
            assert_eq!(
                decide(&[(&a, Status::Live)], &req(asked, None)),
                AcquireDecision::Conflict(Conflict::Mode { live: Permit(2) }),
                "{asked:?}"
            );
        }
        // Only committed leases own the count; an uncommitted one is waited for.
        assert!(matches!(
            decide(&[(&a, Status::InFlight(XID))], &req(Permit(3), None)),
            AcquireDecision::Busy(_)
        ));
    }

    #[test]
    fn the_same_holder_gets_its_token_back_for_the_same_mode_only() {
        let s = lease(5, Some("w"), ALICE, Shared);
        assert_eq!(
            decide(&[(&s, Status::Live)], &req(Shared, Some("w"))),
            AcquireDecision::Extend { token: 5 }
        );
        assert_eq!(
            decide(&[(&s, Status::Live)], &req(Exclusive, Some("w"))),
            AcquireDecision::Conflict(Conflict::OwnOtherMode { token: 5, live: Shared }),
            "no upgrade from shared to exclusive"
        );
        let e = lease(6, Some("w"), ALICE, Exclusive);
        assert_eq!(
            decide(&[(&e, Status::Live)], &req(Shared, Some("w"))),
            AcquireDecision::Conflict(Conflict::OwnOtherMode { token: 6, live: Exclusive })
        );
        let p = lease(7, Some("w"), ALICE, Permit(3));
        assert_eq!(
            decide(&[(&p, Status::Live)], &req(Permit(3), Some("w"))),
            AcquireDecision::Extend { token: 7 }
        );
    }

    #[test]
    fn the_same_holder_text_from_another_role_or_a_null_holder_never_matches() {
        let l = lease(5, Some("w"), BOB, Exclusive);
        assert!(matches!(
            decide(&[(&l, Status::Live)], &req(Exclusive, Some("w"))),
            AcquireDecision::Busy(_)
        ));
        let n = lease(6, None, ALICE, Exclusive);
        assert!(matches!(decide(&[(&n, Status::Live)], &req(Exclusive, None)), AcquireDecision::Busy(_)));
    }

    #[test]
    fn a_lease_of_this_session_in_the_way_is_named_so_an_acquire_does_not_wait_for_itself() {
        let mine = |l: &Lease| l.token == 5;
        let own = lease(5, None, ALICE, Exclusive);
        let theirs = lease(6, None, BOB, Shared);
        let d = decide_acquire(&[(&own, Status::Live)], &req(Exclusive, None).0, nobody, mine);
        assert!(matches!(d, AcquireDecision::Busy(b) if b.own == Some(5)));
        // A shared lease of ours beside another's: an exclusive request waits
        // for both, and ours never ends by waiting.
        let own_shared = lease(5, None, ALICE, Shared);
        let d = decide_acquire(
            &[(&own_shared, Status::Live), (&theirs, Status::Live)],
            &req(Exclusive, None).0,
            nobody,
            mine,
        );
        assert!(matches!(d, AcquireDecision::Busy(b) if b.own == Some(5)));
        // A full semaphore with one permit of another session can still be waited out.
        let p1 = lease(5, None, ALICE, Permit(2));
        let p2 = lease(6, None, BOB, Permit(2));
        let d = decide_acquire(
            &[(&p1, Status::Live), (&p2, Status::Live)],
            &req(Permit(2), None).0,
            nobody,
            mine,
        );
        assert!(matches!(d, AcquireDecision::Busy(b) if b.own.is_none()));
        let mine_all = |_: &Lease| true;
        let d = decide_acquire(
            &[(&p1, Status::Live), (&p2, Status::Live)],
            &req(Permit(2), None).0,
            nobody,
            mine_all,
        );
        assert!(matches!(d, AcquireDecision::Busy(b) if b.own.is_some()));
    }

    #[test]
    fn an_ended_lease_is_never_revived_by_renew_or_release() {
        let l = lease(5, None, ALICE, Exclusive);
        let same = |o| o == pg_sys::Oid::from(ALICE);
        for ended in [State::Expired, State::SessionEnded] {
            assert_eq!(decide_owner_change(Some((&l, ended)), 5, same), OwnerDecision::NotLive);
        }
        assert_eq!(decide_owner_change(Some((&l, State::Live)), 5, same), OwnerDecision::Apply);
        assert_eq!(decide_owner_change(None, 5, same), OwnerDecision::NotLive);
    }

    #[test]
    fn only_the_owner_may_change_a_live_lease() {
        let l = lease(6, None, ALICE, Exclusive);
        assert_eq!(
            decide_owner_change(Some((&l, State::Live)), 6, |o| o == pg_sys::Oid::from(BOB)),
            OwnerDecision::NotOwner { owner: pg_sys::Oid::from(ALICE) }
        );
    }
}
