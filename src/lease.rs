//! The lease state machine (SPEC §2, §3): acquire, renew, release, force
//! release, validate. Every change of a lease record happens here.
//!
//! Each transition takes the name's FENCE lock exclusive (see `keys.rs`), then
//! reads the latest committed record and decides with the pure functions at
//! the top of this file. A transition that changes nothing gives the lock back
//! at once; one that changes the record keeps it until commit, so that the
//! change and everything ordered after it (guarded writes, other transitions)
//! see it in commit order.

use crate::durability::require_durable_commit;
use crate::errors::FlError;
use crate::keys::{Key, Mode};
use crate::store::{acts_for, now, read, role_name, Lease, Store};
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use std::cell::Cell;

/// What an acquire should do with the current record of the name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireDecision {
    /// No live lease: grant a new one (`replaces`: an expired record exists).
    Grant { replaces: bool },
    /// The same holder (and a role that acts for the owner) asks again:
    /// keep the token, extend the lease.
    Extend { token: i64 },
    /// Someone else holds a live lease.
    Busy { expires_at: i64 },
}

pub fn decide_acquire(
    current: Option<&Lease>,
    now: i64,
    holder: Option<&str>,
    acts_for_owner: impl FnOnce(pg_sys::Oid) -> bool,
) -> AcquireDecision {
    match current {
        None => AcquireDecision::Grant { replaces: false },
        Some(l) if !l.is_live(now) => AcquireDecision::Grant { replaces: true },
        Some(l) if holder.is_some() && l.holder.as_deref() == holder && acts_for_owner(l.owner) => {
            AcquireDecision::Extend { token: l.token }
        }
        Some(l) => AcquireDecision::Busy { expires_at: l.expires_at },
    }
}

/// What a renew or release of lease `token` should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerDecision {
    Apply,
    /// `token` is not the live lease (expired, released, superseded, unknown).
    NotLive,
    /// It is, but the caller does not act for its owner.
    NotOwner {
        owner: pg_sys::Oid,
    },
}

pub fn decide_owner_change(
    current: Option<&Lease>,
    now: i64,
    token: i64,
    acts_for_owner: impl FnOnce(pg_sys::Oid) -> bool,
) -> OwnerDecision {
    match current {
        Some(l) if l.token == token && l.is_live(now) => {
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
pub fn live_token(current: Option<&Lease>, now: i64) -> Option<i64> {
    current.filter(|l| l.is_live(now)).map(|l| l.token)
}

/// A request to acquire `name`.
pub struct AcquireRequest<'a> {
    pub name: &'a str,
    pub ttl: Datum,
    pub ttl_micros: i64,
    pub holder: Option<&'a str>,
    pub caller: pg_sys::Oid,
}

/// Outcome of one attempt to acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    Granted(i64),
    Busy { expires_at: Option<i64> },
}

/// Records that expired this long ago are removed by later grants.
const REAP_AFTER_MICROS: i64 = 60 * 1_000_000;
/// Every this many grants a backend removes up to `REAP_BATCH` old records.
const REAP_EVERY: u32 = 8;
const REAP_BATCH: usize = 16;

thread_local! {
    static GRANTS: Cell<u32> = const { Cell::new(0) };
}

/// One attempt to acquire, without waiting for the lease (it does wait for
/// in-flight transactions on the name: guarded writes and uncommitted
/// transitions). `fence_locked` takes the FENCE lock, so that a caller with a
/// deadline can bound that wait.
///
/// When the name is free but others are queued in `fenced_lock_acquire`, the
/// attempt reports Busy: a try never jumps the queue.
pub fn attempt_acquire(
    store: &Store,
    req: &AcquireRequest,
    fence_locked: impl FnOnce(&Key) -> Result<(), FlError>,
) -> Result<Attempt, FlError> {
    let fence = Key::fence(req.name);
    fence_locked(&fence)?;
    let now = now();
    let current = read(req.name)?;
    match decide_acquire(current.as_ref(), now, req.holder, |owner| acts_for(req.caller, owner)) {
        AcquireDecision::Extend { token } => {
            let lease = current.as_ref().expect("Extend implies a record");
            store.extend(req.name, lease, now, req.ttl_micros)?;
            require_durable_commit();
            Ok(Attempt::Granted(token))
        }
        AcquireDecision::Grant { replaces } => {
            if !queue_is_empty(req.name) {
                fence.unlock(Mode::Exclusive);
                return Ok(Attempt::Busy { expires_at: None });
            }
            let token = store.next_token();
            let replaces = current.as_ref().filter(|_| replaces).map(|l| l.tid);
            store.grant(req.name, replaces, token, req.holder, req.caller, now, req.ttl, req.ttl_micros)?;
            require_durable_commit();
            reap_now_and_then(store, now)?;
            Ok(Attempt::Granted(token))
        }
        AcquireDecision::Busy { expires_at } => {
            fence.unlock(Mode::Exclusive);
            Ok(Attempt::Busy { expires_at: Some(expires_at) })
        }
    }
}

/// Nobody but (perhaps) this backend is queued for `name`.
fn queue_is_empty(name: &str) -> bool {
    let queue = Key::queue(name);
    if queue.try_lock(Mode::Exclusive) {
        queue.unlock(Mode::Exclusive);
        true
    } else {
        false
    }
}

/// Reaping takes the FENCE lock of each name it removes until commit; inside a
/// long explicit transaction that would hold up other sessions, so only
/// single-statement transactions reap.
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
    if n.is_multiple_of(REAP_EVERY) && !in_transaction_block() {
        store.reap(now - REAP_AFTER_MICROS, REAP_BATCH)?;
    }
    Ok(())
}

/// `fenced_lock_try_acquire`.
pub fn try_acquire(req: &AcquireRequest) -> Result<Option<i64>, FlError> {
    let store = Store::open()?;
    match attempt_acquire(&store, req, |fence| {
        fence.lock(Mode::Exclusive);
        Ok(())
    })? {
        Attempt::Granted(token) => Ok(Some(token)),
        Attempt::Busy { .. } => Ok(None),
    }
}

/// `fenced_lock_renew`: `ttl_micros` None renews for the ttl the lease was
/// granted with.
pub fn renew(
    function: &str,
    name: &str,
    token: i64,
    ttl_micros: Option<i64>,
    caller: pg_sys::Oid,
) -> Result<bool, FlError> {
    let store = Store::open()?;
    let fence = Key::fence(name);
    fence.lock(Mode::Exclusive);
    let now = now();
    let current = read(name)?;
    match decide_owner_change(current.as_ref(), now, token, |owner| acts_for(caller, owner)) {
        OwnerDecision::Apply => {
            let lease = current.as_ref().expect("Apply implies a record");
            store.extend(name, lease, now, ttl_micros.unwrap_or(lease.ttl_micros))?;
            require_durable_commit();
            Ok(true)
        }
        OwnerDecision::NotLive => {
            fence.unlock(Mode::Exclusive);
            Ok(false)
        }
        OwnerDecision::NotOwner { owner } => {
            fence.unlock(Mode::Exclusive);
            Err(FlError::not_owner(function, name, token, &role_name(owner)))
        }
    }
}

/// `fenced_lock_release`.
pub fn release(function: &str, name: &str, token: i64, caller: pg_sys::Oid) -> Result<bool, FlError> {
    let store = Store::open()?;
    let fence = Key::fence(name);
    fence.lock(Mode::Exclusive);
    let now = now();
    let current = read(name)?;
    match decide_owner_change(current.as_ref(), now, token, |owner| acts_for(caller, owner)) {
        OwnerDecision::Apply => {
            store.delete(name, current.as_ref().expect("Apply implies a record"))?;
            require_durable_commit();
            Key::queue(name).wake_holders();
            Ok(true)
        }
        OwnerDecision::NotLive => {
            fence.unlock(Mode::Exclusive);
            Ok(false)
        }
        OwnerDecision::NotOwner { owner } => {
            fence.unlock(Mode::Exclusive);
            Err(FlError::not_owner(function, name, token, &role_name(owner)))
        }
    }
}

/// `fenced_lock_force_release`: the caller has been checked as operator.
pub fn force_release(name: &str) -> Result<bool, FlError> {
    let store = Store::open()?;
    let fence = Key::fence(name);
    fence.lock(Mode::Exclusive);
    let now = now();
    match read(name)? {
        Some(lease) if lease.is_live(now) => {
            store.delete(name, &lease)?;
            require_durable_commit();
            Key::queue(name).wake_holders();
            Ok(true)
        }
        _ => {
            fence.unlock(Mode::Exclusive);
            Ok(false)
        }
    }
}

/// `fenced_lock_validate`: a read of the latest committed state, no lock.
pub fn validate(name: &str, token: i64) -> Result<bool, FlError> {
    Ok(live_token(read(name)?.as_ref(), now()) == Some(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: u32 = 100;
    const BOB: u32 = 200;

    fn lease(token: i64, holder: Option<&str>, owner: u32, expires_at: i64) -> Lease {
        Lease {
            tid: Default::default(),
            token,
            holder: holder.map(String::from),
            owner: pg_sys::Oid::from(owner),
            expires_at,
            ttl_micros: 30_000_000,
        }
    }

    fn same(role: u32) -> impl Fn(pg_sys::Oid) -> bool {
        move |owner| owner == pg_sys::Oid::from(role)
    }

    #[test]
    fn free_name_is_granted() {
        assert_eq!(decide_acquire(None, 10, None, same(ALICE)), AcquireDecision::Grant { replaces: false });
    }

    #[test]
    fn expired_lease_is_replaced_at_its_expiry_instant() {
        let l = lease(5, Some("w1"), BOB, 100);
        assert_eq!(
            decide_acquire(Some(&l), 99, None, same(ALICE)),
            AcquireDecision::Busy { expires_at: 100 }
        );
        assert_eq!(
            decide_acquire(Some(&l), 100, None, same(ALICE)),
            AcquireDecision::Grant { replaces: true }
        );
    }

    #[test]
    fn same_holder_and_owner_reacquire_keeps_the_token() {
        let l = lease(5, Some("w1"), ALICE, 100);
        assert_eq!(
            decide_acquire(Some(&l), 50, Some("w1"), same(ALICE)),
            AcquireDecision::Extend { token: 5 }
        );
    }

    #[test]
    fn same_holder_text_from_another_role_is_refused() {
        let l = lease(5, Some("w1"), ALICE, 100);
        assert_eq!(
            decide_acquire(Some(&l), 50, Some("w1"), same(BOB)),
            AcquireDecision::Busy { expires_at: 100 }
        );
    }

    #[test]
    fn null_holder_never_matches() {
        let l = lease(5, None, ALICE, 100);
        assert_eq!(
            decide_acquire(Some(&l), 50, None, same(ALICE)),
            AcquireDecision::Busy { expires_at: 100 }
        );
        let l = lease(5, Some("w1"), ALICE, 100);
        assert_eq!(
            decide_acquire(Some(&l), 50, Some("w2"), same(ALICE)),
            AcquireDecision::Busy { expires_at: 100 }
        );
    }

    #[test]
    fn expired_lease_is_never_revived_by_renew_or_release() {
        let l = lease(5, None, ALICE, 100);
        assert_eq!(decide_owner_change(Some(&l), 100, 5, same(ALICE)), OwnerDecision::NotLive);
        assert_eq!(decide_owner_change(Some(&l), 99, 5, same(ALICE)), OwnerDecision::Apply);
    }

    #[test]
    fn renew_of_a_superseded_token_is_not_live() {
        let l = lease(6, None, ALICE, 100);
        assert_eq!(decide_owner_change(Some(&l), 50, 5, same(ALICE)), OwnerDecision::NotLive);
        assert_eq!(decide_owner_change(None, 50, 5, same(ALICE)), OwnerDecision::NotLive);
    }

    #[test]
    fn only_the_owner_may_change_a_live_lease() {
        let l = lease(6, None, ALICE, 100);
        assert_eq!(
            decide_owner_change(Some(&l), 50, 6, same(BOB)),
            OwnerDecision::NotOwner { owner: pg_sys::Oid::from(ALICE) }
        );
    }

    #[test]
    fn live_token_is_none_after_expiry() {
        let l = lease(6, None, ALICE, 100);
        assert_eq!(live_token(Some(&l), 99), Some(6));
        assert_eq!(live_token(Some(&l), 100), None);
        assert_eq!(live_token(None, 0), None);
    }
}
