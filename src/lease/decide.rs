//! The decisions of the lease state machine, as pure functions of the
//! record and the request (docs/design.md, "Transitions"): no PostgreSQL
//! needed, tested below. `lease/mod.rs` takes the locks, reads, calls these,
//! and carries the decision out.

use crate::store::{Ending, Lease};
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
    fn ending(self) -> Option<Ending> {
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

/// What an acquire should do with the current record of the name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireDecision {
    /// No live lease: grant a new one, replacing a record that ended so.
    Grant { ended: Option<Ending> },
    /// The same holder (and a role that acts for the owner), or the session
    /// the lease is bound to, asks again: keep the token, extend the lease.
    Extend { token: i64 },
    /// Someone else holds a live lease.
    Busy { expires_at: i64 },
}

/// `same_session`: the record is a session-bound lease of this session.
///
/// A session-bound lease belongs to its session: only that session gets it
/// back, whatever holder it names; another session is refused even with the
/// same holder (it would hold a lease that dies with someone else's session).
/// A plain lease goes back to the same non-NULL holder.
pub fn decide_acquire(
    current: Option<(&Lease, State)>,
    holder: Option<&str>,
    same_session: bool,
    acts_for_owner: impl FnOnce(pg_sys::Oid) -> bool,
) -> AcquireDecision {
    match current {
        None => AcquireDecision::Grant { ended: None },
        Some((_, state)) if state != State::Live => AcquireDecision::Grant { ended: state.ending() },
        Some((l, _)) => {
            let asks_again = if l.session_bound {
                same_session
            } else {
                holder.is_some() && l.holder.as_deref() == holder
            };
            if asks_again && acts_for_owner(l.owner) {
                AcquireDecision::Extend { token: l.token }
            } else {
                AcquireDecision::Busy { expires_at: l.expires_at }
            }
        }
    }
}

/// What a renew or release of lease `token` should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerDecision {
    Apply,
    /// `token` is not the live lease (expired, released, superseded, unknown,
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

/// The live token of the record, if it is live.
pub fn live_token(current: Option<(&Lease, State)>) -> Option<i64> {
    current.filter(|(_, s)| *s == State::Live).map(|(l, _)| l.token)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: u32 = 100;
    const BOB: u32 = 200;

    fn lease(token: i64, holder: Option<&str>, owner: u32) -> Lease {
        Lease {
            tid: Default::default(),
            name: "n".into(),
            token,
            holder: holder.map(String::from),
            owner: pg_sys::Oid::from(owner),
            acquired_at: 0,
            expires_at: 100,
            ttl_micros: 30_000_000,
            session_bound: false,
        }
    }

    fn same(role: u32) -> impl Fn(pg_sys::Oid) -> bool {
        move |owner| owner == pg_sys::Oid::from(role)
    }

    #[test]
    fn free_name_is_granted() {
        assert_eq!(decide_acquire(None, None, false, same(ALICE)), AcquireDecision::Grant { ended: None });
    }

    #[test]
    fn expired_lease_is_replaced_and_its_end_recorded_as_expiry() {
        let l = lease(5, Some("w1"), BOB);
        assert_eq!(
            decide_acquire(Some((&l, State::Live)), None, false, same(ALICE)),
            AcquireDecision::Busy { expires_at: 100 }
        );
        assert_eq!(
            decide_acquire(Some((&l, State::Expired)), None, false, same(ALICE)),
            AcquireDecision::Grant { ended: Some(Ending::Expiry) }
        );
    }

    #[test]
    fn a_lease_whose_session_ended_is_replaced_at_once() {
        let l = lease(5, Some("w1"), BOB);
        assert_eq!(
            decide_acquire(Some((&l, State::SessionEnded)), Some("w1"), false, same(BOB)),
            AcquireDecision::Grant { ended: Some(Ending::SessionEnd) }
        );
    }

    #[test]
    fn the_state_of_a_record_follows_the_clock_then_its_session() {
        let l = lease(5, None, ALICE);
        assert_eq!(decide_state(&l, 99, || true), State::Live);
        assert_eq!(decide_state(&l, 100, || true), State::Expired);
        assert_eq!(decide_state(&l, 99, || false), State::SessionEnded);
        assert_eq!(decide_state(&l, 100, || false), State::Expired, "expiry is told first");
    }

    #[test]
    fn same_holder_and_owner_reacquire_keeps_the_token() {
        let l = lease(5, Some("w1"), ALICE);
        assert_eq!(
            decide_acquire(Some((&l, State::Live)), Some("w1"), false, same(ALICE)),
            AcquireDecision::Extend { token: 5 }
        );
    }

    #[test]
    fn the_bound_session_reacquiring_keeps_the_token_whatever_the_holder() {
        let mut l = lease(5, Some("w"), ALICE);
        l.session_bound = true;
        assert_eq!(
            decide_acquire(Some((&l, State::Live)), None, true, same(ALICE)),
            AcquireDecision::Extend { token: 5 }
        );
        assert_eq!(
            decide_acquire(Some((&l, State::Live)), None, true, same(BOB)),
            AcquireDecision::Busy { expires_at: 100 }
        );
    }

    #[test]
    fn another_session_naming_the_holder_of_a_session_bound_lease_is_refused() {
        let mut l = lease(5, Some("w"), ALICE);
        l.session_bound = true;
        assert_eq!(
            decide_acquire(Some((&l, State::Live)), Some("w"), false, same(ALICE)),
            AcquireDecision::Busy { expires_at: 100 }
        );
    }

    #[test]
    fn same_holder_text_from_another_role_is_refused() {
        let l = lease(5, Some("w1"), ALICE);
        assert_eq!(
            decide_acquire(Some((&l, State::Live)), Some("w1"), false, same(BOB)),
            AcquireDecision::Busy { expires_at: 100 }
        );
    }

    #[test]
    fn null_holder_never_matches() {
        let l = lease(5, None, ALICE);
        assert_eq!(
            decide_acquire(Some((&l, State::Live)), None, false, same(ALICE)),
            AcquireDecision::Busy { expires_at: 100 }
        );
        let l = lease(5, Some("w1"), ALICE);
        assert_eq!(
            decide_acquire(Some((&l, State::Live)), Some("w2"), false, same(ALICE)),
            AcquireDecision::Busy { expires_at: 100 }
        );
    }

    #[test]
    fn an_ended_lease_is_never_revived_by_renew_or_release() {
        let l = lease(5, None, ALICE);
        for ended in [State::Expired, State::SessionEnded] {
            assert_eq!(decide_owner_change(Some((&l, ended)), 5, same(ALICE)), OwnerDecision::NotLive);
        }
        assert_eq!(decide_owner_change(Some((&l, State::Live)), 5, same(ALICE)), OwnerDecision::Apply);
    }

    #[test]
    fn renew_of_a_superseded_token_is_not_live() {
        let l = lease(6, None, ALICE);
        assert_eq!(decide_owner_change(Some((&l, State::Live)), 5, same(ALICE)), OwnerDecision::NotLive);
        assert_eq!(decide_owner_change(None, 5, same(ALICE)), OwnerDecision::NotLive);
    }

    #[test]
    fn only_the_owner_may_change_a_live_lease() {
        let l = lease(6, None, ALICE);
        assert_eq!(
            decide_owner_change(Some((&l, State::Live)), 6, same(BOB)),
            OwnerDecision::NotOwner { owner: pg_sys::Oid::from(ALICE) }
        );
    }

    #[test]
    fn live_token_is_none_unless_live() {
        let l = lease(6, None, ALICE);
        assert_eq!(live_token(Some((&l, State::Live))), Some(6));
        assert_eq!(live_token(Some((&l, State::Expired))), None);
        assert_eq!(live_token(Some((&l, State::SessionEnded))), None);
        assert_eq!(live_token(None), None);
    }
}
