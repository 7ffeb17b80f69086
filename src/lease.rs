//! The lease state machine: acquire, renew, release, force release, expiry
//! and session end (docs/design.md, "Transitions"). Every change of a lease
//! record happens here.
//!
//! Each transition takes the name lock exclusive (`locktags.rs`), then reads
//! the latest committed record and decides with the pure functions at the top
//! of this file. A transition that changes nothing gives the lock back at
//! once; one that changes the record keeps it until commit, so that the change
//! and everything ordered after it (guarded writes, other transitions) see it
//! in commit order.

use crate::errors::{quote_name, sqlstate, FlError};
use crate::locktags::{LockTag, Mode};
use crate::stats::Event;
use crate::store::{acts_for, now, read, role_name, Ending, Grant, Lease, Store};
use crate::{durability, notify, session, stats};
use pgrx::pg_sys;
use std::cell::Cell;

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

/// The state of `lease` now; probes its session only when that matters.
pub fn state_of(lease: &Lease, now: i64) -> State {
    decide_state(lease, now, || session::alive(lease))
}

fn decide_state(lease: &Lease, now: i64, session_alive: impl FnOnce() -> bool) -> State {
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

/// The record of `name` with its state now.
fn current(name: &str) -> Result<Option<(Lease, State)>, FlError> {
    let now = now();
    Ok(read(name)?.map(|l| {
        let s = state_of(&l, now);
        (l, s)
    }))
}

fn as_ref(c: &Option<(Lease, State)>) -> Option<(&Lease, State)> {
    c.as_ref().map(|(l, s)| (l, *s))
}

/// A request to acquire `name`.
pub struct AcquireRequest<'a> {
    pub name: &'a str,
    pub ttl_micros: i64,
    pub holder: Option<&'a str>,
    pub session_bound: bool,
    pub caller: pg_sys::Oid,
}

/// Outcome of one attempt to acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    Granted(i64),
    /// Not now: `expires_at` of the live lease, if that is what stands in the way.
    Busy {
        expires_at: Option<i64>,
    },
}

/// Records that expired this long ago are removed by later grants.
const REAP_AFTER_MICROS: i64 = 60 * 1_000_000;
/// Every this many grants a backend removes up to `REAP_BATCH` old records
/// and prunes up to `PRUNE_BATCH` history rows.
const REAP_EVERY: u32 = 8;
const REAP_BATCH: usize = 16;
const PRUNE_BATCH: usize = 64;

thread_local! {
    static GRANTS: Cell<u32> = const { Cell::new(0) };
}

/// One attempt to acquire, without waiting for the lease. `name_locked`
/// takes the name lock and says whether it got it: a try never waits for it,
/// a waiter waits with a deadline.
///
/// When the name is free but others are queued in `fenced_lock_acquire`, the
/// attempt reports Busy: a try never jumps the queue.
pub fn attempt_acquire(
    store: &Store,
    req: &AcquireRequest,
    name_locked: impl FnOnce(&LockTag) -> Result<bool, FlError>,
) -> Result<Attempt, FlError> {
    let name_lock = LockTag::name(req.name);
    if !name_locked(&name_lock)? {
        return Ok(Attempt::Busy { expires_at: None });
    }
    let now = now();
    let current = current(req.name)?;
    let same_session = current.as_ref().is_some_and(|(l, _)| session::mine(l));
    match decide_acquire(as_ref(&current), req.holder, same_session, |owner| acts_for(req.caller, owner)) {
        AcquireDecision::Extend { token } => {
            let (lease, _) = current.as_ref().expect("Extend implies a record");
            store.extend(req.name, lease, now, req.ttl_micros)?;
            durability::must_flush();
            stats::at_commit(Event::Renewal);
            Ok(Attempt::Granted(token))
        }
        AcquireDecision::Grant { ended } => {
            if !queue_is_empty(req.name) {
                name_lock.unlock(Mode::Exclusive);
                return Ok(Attempt::Busy { expires_at: None });
            }
            if let (Some(ending), Some((old, _))) = (ended, current.as_ref()) {
                record_observed_end(store, req.name, old, ending, now);
            }
            let token = store.next_token()?;
            let grant = Grant {
                name: req.name,
                token,
                holder: req.holder,
                owner: req.caller,
                now,
                ttl_micros: req.ttl_micros,
                session_bound: req.session_bound,
            };
            store.grant(&grant, current.as_ref().map(|(l, _)| l.tid))?;
            if req.session_bound {
                session::bind(req.name, token);
            }
            durability::must_flush();
            stats::at_commit(Event::Grant);
            notify::event(req.name, "grant", token);
            reap_now_and_then(store, now)?;
            Ok(Attempt::Granted(token))
        }
        AcquireDecision::Busy { expires_at } => {
            name_lock.unlock(Mode::Exclusive);
            Ok(Attempt::Busy { expires_at: Some(expires_at) })
        }
    }
}

/// `old` ended (expiry or session end) without anyone saying so; now that it
/// is seen, write that down: history, counters, notification.
fn record_observed_end(store: &Store, name: &str, old: &Lease, ending: Ending, now: i64) {
    let ended_at = if ending == Ending::Expiry { old.expires_at } else { now };
    store.record_end(old, ending, ended_at, None);
    session::ended(old.token);
    stats::at_commit(if ending == Ending::Expiry { Event::Expiry } else { Event::SessionEnd });
    notify::event(name, ending.as_str(), old.token);
}

/// Nobody but (perhaps) this backend is queued for `name`.
fn queue_is_empty(name: &str) -> bool {
    let queue = LockTag::queue(name);
    if queue.try_lock(Mode::Exclusive) {
        queue.unlock(Mode::Exclusive);
        true
    } else {
        false
    }
}

/// Reaping takes the name lock of each name it removes until commit; inside
/// a long explicit transaction that would hold up other sessions, so only
/// single-statement transactions reap. Pruning the history takes no name
/// lock and runs in any transaction.
fn in_transaction_block() -> bool {
    // SAFETY: plain accessor of the transaction state.
    unsafe { pg_sys::IsTransactionBlock() }
}

fn reap_now_and_then(store: &Store, now: i64) -> Result<(), FlError> {
    let n = GRANTS.with(|g| {
        let n = g.get().wrapping_add(1);
        g.set(n);
        n
    });
    if !n.is_multiple_of(REAP_EVERY) {
        return Ok(());
    }
    let retention = crate::settings::history_retention_seconds();
    store.prune_history(now.saturating_sub(retention.saturating_mul(1_000_000)), PRUNE_BATCH);
    if !in_transaction_block() {
        reap(store, now)?;
    }
    Ok(())
}

/// Remove up to `REAP_BATCH` records that expired a while ago or whose
/// session has ended, skipping names whose lock is busy. Keeps the table
/// from growing without bound when leases are left to expire.
fn reap(store: &Store, now: i64) -> Result<(), FlError> {
    let expired = store.expired_names(now - REAP_AFTER_MICROS, REAP_BATCH);
    let orphaned = store.session_bound_names(REAP_BATCH).into_iter().map(|(name, _)| name);
    for name in expired.into_iter().chain(orphaned) {
        let name_lock = LockTag::name(&name);
        if !name_lock.try_lock(Mode::Exclusive) {
            continue;
        }
        // Under the lock, re-read: the record may have been replaced.
        let reaped = match current(&name)? {
            Some((lease, State::Expired)) if lease.expires_at < now - REAP_AFTER_MICROS => {
                store.end(&name, &lease, Ending::Expiry, lease.expires_at, None)?;
                finish_end(&name, &lease, Ending::Expiry);
                true
            }
            Some((lease, State::SessionEnded)) => {
                store.end(&name, &lease, Ending::SessionEnd, now, None)?;
                finish_end(&name, &lease, Ending::SessionEnd);
                true
            }
            _ => false,
        };
        if !reaped {
            name_lock.unlock(Mode::Exclusive);
        }
    }
    Ok(())
}

/// Book-keeping of a lease that ended in this transaction.
fn finish_end(name: &str, lease: &Lease, ending: Ending) {
    session::ended(lease.token);
    stats::at_commit(match ending {
        Ending::Release => Event::Release,
        Ending::Expiry => Event::Expiry,
        Ending::ForceRelease => Event::ForceRelease,
        Ending::SessionEnd => Event::SessionEnd,
    });
    notify::event(name, ending.as_str(), lease.token);
    LockTag::queue(name).wake_holders();
}

/// `fenced_lock_try_acquire`: never waits for another transaction.
pub fn try_acquire(req: &AcquireRequest) -> Result<Option<i64>, FlError> {
    let store = Store::open()?;
    match attempt_acquire(&store, req, |name_lock| Ok(name_lock.try_lock(Mode::Exclusive)))? {
        Attempt::Granted(token) => Ok(Some(token)),
        Attempt::Busy { .. } => Ok(None),
    }
}

fn not_owner(function: &str, name: &str, token: i64, owner: pg_sys::Oid) -> FlError {
    FlError::new(
        sqlstate::INSUFFICIENT_PRIVILEGE,
        format!(
            "{function}: lease {token} of lock {} belongs to role \"{}\"",
            quote_name(name),
            role_name(owner)
        ),
    )
    .hint("Only the role that acquired a lease (or a member of it) may renew or release it.")
}

/// Take the name lock, read, and decide a change by the owner of `token`.
fn owner_change(
    function: &str,
    name: &str,
    token: i64,
    caller: pg_sys::Oid,
) -> Result<Option<(Store, Lease, LockTag)>, FlError> {
    let store = Store::open()?;
    let name_lock = LockTag::name(name);
    name_lock.lock(Mode::Exclusive);
    let current = current(name)?;
    match decide_owner_change(as_ref(&current), token, |owner| acts_for(caller, owner)) {
        OwnerDecision::Apply => Ok(Some((store, current.expect("Apply implies a record").0, name_lock))),
        OwnerDecision::NotLive => {
            name_lock.unlock(Mode::Exclusive);
            Ok(None)
        }
        OwnerDecision::NotOwner { owner } => {
            name_lock.unlock(Mode::Exclusive);
            Err(not_owner(function, name, token, owner))
        }
    }
}

/// `fenced_lock_renew`: `ttl_micros` None renews for the ttl the lease was
/// granted with. A renew that brings the expiry forward wakes the head
/// waiter, so the handoff happens at the new expiry instant.
pub fn renew(
    function: &str,
    name: &str,
    token: i64,
    ttl_micros: Option<i64>,
    caller: pg_sys::Oid,
) -> Result<bool, FlError> {
    let Some((store, lease, _)) = owner_change(function, name, token, caller)? else { return Ok(false) };
    let now = now();
    let ttl = ttl_micros.unwrap_or(lease.ttl_micros);
    store.extend(name, &lease, now, ttl)?;
    durability::must_flush();
    stats::at_commit(Event::Renewal);
    if now.saturating_add(ttl) < lease.expires_at {
        LockTag::queue(name).wake_holders();
    }
    Ok(true)
}

/// `fenced_lock_release`.
pub fn release(function: &str, name: &str, token: i64, caller: pg_sys::Oid) -> Result<bool, FlError> {
    let Some((store, lease, _)) = owner_change(function, name, token, caller)? else { return Ok(false) };
    store.end(name, &lease, Ending::Release, now(), Some(caller))?;
    durability::released();
    finish_end(name, &lease, Ending::Release);
    Ok(true)
}

/// `fenced_lock_force_release`: the caller has been checked as operator.
pub fn force_release(name: &str, caller: pg_sys::Oid) -> Result<bool, FlError> {
    let store = Store::open()?;
    let name_lock = LockTag::name(name);
    name_lock.lock(Mode::Exclusive);
    match current(name)? {
        Some((lease, State::Live)) => {
            store.end(name, &lease, Ending::ForceRelease, now(), Some(caller))?;
            durability::released();
            finish_end(name, &lease, Ending::ForceRelease);
            Ok(true)
        }
        _ => {
            name_lock.unlock(Mode::Exclusive);
            Ok(false)
        }
    }
}

/// `fenced_lock_validate`: a read of the latest committed state, no lock.
pub fn validate(name: &str, token: i64) -> Result<bool, FlError> {
    Ok(live_token(as_ref(&current(name)?)) == Some(token))
}

/// The session that held `bound` (token, name) is ending: end those leases
/// in one last transaction of its own, never waiting for a lock (a name
/// that is busy is left to the next acquirer's probe).
pub fn end_session_leases(bound: &[(i64, String)]) {
    crate::xact::in_own_transaction(|| {
        let store = Store::open()?;
        for (token, name) in bound {
            let name_lock = LockTag::name(name);
            if !name_lock.try_lock(Mode::Exclusive) {
                continue;
            }
            match read(name)? {
                Some(lease) if lease.token == *token && lease.session_bound => {
                    store.end(name, &lease, Ending::SessionEnd, now(), None)?;
                    durability::released();
                    finish_end(name, &lease, Ending::SessionEnd);
                }
                _ => name_lock.unlock(Mode::Exclusive),
            }
        }
        Ok(())
    });
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
