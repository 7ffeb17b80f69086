//! The lease state machine: acquire, renew, release, force release, expiry
//! and session end (docs/design.md, "Transitions"). Every change of a lease
//! record happens here, and every change leaves through one exit (`after`):
//! session bookkeeping, durability, counters, NOTIFY and the wake-up.
//!
//! Each transition takes the name lock exclusive (`locktags.rs`), then reads
//! the latest committed record and decides with the pure functions of
//! `decide.rs`, reading the clock once. A transition that changes nothing
//! gives the lock back at once, before it has opened a write session; one
//! that changes the record keeps it until commit, so that the change and
//! everything ordered after it (guarded writes, other transitions) see it in
//! commit order.

mod decide;

use decide::{decide_acquire, decide_owner_change, decide_state};
pub use decide::{live_token, AcquireDecision, OwnerDecision, State};

use crate::clock::now;
use crate::errors::{quote_name, sqlstate, FlError};
use crate::locktags::{LockTag, Mode};
use crate::roles::{acts_for, role_name};
use crate::stats::Event;
use crate::store::{read, Ending, Grant, Lease, Store};
use crate::{durability, notify, session, stats, xact};
use pgrx::pg_sys;
use std::cell::Cell;

/// The state of `lease` at `now`; probes its session only when that matters.
pub fn state_of(lease: &Lease, now: i64) -> State {
    decide_state(lease, now, || session::alive(lease))
}

/// The record of `name` with its state at `now`.
fn current(name: &str, now: i64) -> Result<Option<(Lease, State)>, FlError> {
    Ok(read(name)?.map(|l| {
        let s = state_of(&l, now);
        (l, s)
    }))
}

fn as_ref(c: &Option<(Lease, State)>) -> Option<(&Lease, State)> {
    c.as_ref().map(|(l, s)| (l, *s))
}

// ---- the one exit ----------------------------------------------------------

/// A change this transaction made to a lease, for `after`.
enum Change<'a> {
    /// A new lease.
    Granted { name: &'a str, token: i64, session_bound: bool },
    /// The same holder or session asked again: same token, later expiry.
    Extended,
    /// `fenced_lock_renew`; `shortened`: the expiry moved earlier.
    Renewed { name: &'a str, shortened: bool },
    /// The lease `token` ended. `taken_over`: by the grant of the name in
    /// this very transaction, so there is nobody to wake.
    Ended { name: &'a str, token: i64, ending: Ending, taken_over: bool },
}

/// How each ending is counted.
fn counted(ending: Ending) -> Event {
    match ending {
        Ending::Release => Event::Release,
        Ending::Expiry => Event::Expiry,
        Ending::ForceRelease => Event::ForceRelease,
        Ending::SessionEnd => Event::SessionEnd,
    }
}

/// Everything that follows a change, in one place. Counters and NOTIFY take
/// effect only if the transaction commits; the wake-up is at once (the head
/// waiter then waits for the name lock, i.e. for the commit).
fn after(change: Change) {
    match change {
        Change::Granted { name, token, session_bound } => {
            if session_bound {
                session::bind(name, token);
                arm_session_end();
            }
            durability::must_flush();
            stats::at_commit(Event::Grant);
            notify::event(name, "grant", token);
        }
        Change::Extended => {
            durability::must_flush();
            stats::at_commit(Event::Renewal);
        }
        Change::Renewed { name, shortened } => {
            durability::must_flush();
            stats::at_commit(Event::Renewal);
            if shortened {
                LockTag::queue(name).wake_holders();
            }
        }
        Change::Ended { name, token, ending, taken_over } => {
            session::ended(token);
            // Alone in its transaction, an end may be acknowledged before the
            // flush; beside a grant, the grant's flush wins (durability.rs).
            durability::released();
            stats::at_commit(counted(ending));
            notify::event(name, ending.as_str(), token);
            if !taken_over {
                LockTag::queue(name).wake_holders();
            }
        }
    }
}

// ---- acquire ---------------------------------------------------------------

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
    req: &AcquireRequest,
    name_locked: impl FnOnce(&LockTag) -> Result<bool, FlError>,
) -> Result<Attempt, FlError> {
    crate::store::check_catalog_writable()?;
    let name_lock = LockTag::name(req.name);
    if !name_locked(&name_lock)? {
        return Ok(Attempt::Busy { expires_at: None });
    }
    let now = now();
    let current = current(req.name, now)?;
    let same_session = current.as_ref().is_some_and(|(l, _)| session::mine(l));
    match decide_acquire(as_ref(&current), req.holder, same_session, |owner| acts_for(req.caller, owner)) {
        AcquireDecision::Extend { token } => {
            let (lease, _) = current.as_ref().expect("Extend implies a record");
            Store::open()?.extend(req.name, lease, now, req.ttl_micros)?;
            after(Change::Extended);
            Ok(Attempt::Granted(token))
        }
        AcquireDecision::Grant { ended } => {
            if !queue_is_empty(req.name) {
                name_lock.unlock(Mode::Exclusive);
                return Ok(Attempt::Busy { expires_at: None });
            }
            let store = Store::open()?;
            if let (Some(ending), Some((old, _))) = (ended, current.as_ref()) {
                // `old` ended (expiry or session end) without anyone saying
                // so; now that it is seen, write that down.
                let ended_at = if ending == Ending::Expiry { old.expires_at } else { now };
                store.record_end(old, ending, ended_at, None);
                after(Change::Ended { name: req.name, token: old.token, ending, taken_over: true });
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
            after(Change::Granted { name: req.name, token, session_bound: req.session_bound });
            reap_now_and_then(&store, now)?;
            Ok(Attempt::Granted(token))
        }
        AcquireDecision::Busy { expires_at } => {
            name_lock.unlock(Mode::Exclusive);
            Ok(Attempt::Busy { expires_at: Some(expires_at) })
        }
    }
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

/// `fenced_lock_try_acquire`: never waits for another transaction.
pub fn try_acquire(req: &AcquireRequest) -> Result<Option<i64>, FlError> {
    match attempt_acquire(req, |name_lock| Ok(name_lock.try_lock(Mode::Exclusive)))? {
        Attempt::Granted(token) => Ok(Some(token)),
        Attempt::Busy { .. } => Ok(None),
    }
}

// ---- reaping ---------------------------------------------------------------

/// Reaping takes the name lock of each name it removes until commit; inside
/// a long explicit transaction that would hold up other sessions, so only
/// single-statement transactions reap. Pruning the history takes no name
/// lock and runs in any transaction.
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
    if !xact::in_transaction_block() {
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
        let ending = match current(&name, now)? {
            Some((lease, State::Expired)) if lease.expires_at < now - REAP_AFTER_MICROS => {
                Some((lease, Ending::Expiry))
            }
            Some((lease, State::SessionEnded)) => Some((lease, Ending::SessionEnd)),
            _ => None,
        };
        match ending {
            Some((lease, ending)) => {
                let ended_at = if ending == Ending::Expiry { lease.expires_at } else { now };
                store.end(&name, &lease, ending, ended_at, None)?;
                after(Change::Ended { name: &name, token: lease.token, ending, taken_over: false });
            }
            None => name_lock.unlock(Mode::Exclusive),
        }
    }
    Ok(())
}

// ---- the owner's changes: renew, release; force release ----------------------

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

/// Take the name lock, read, and decide a change by the owner of `token`:
/// the live lease and the instant of the decision, or None (not live).
fn owner_change(
    function: &str,
    name: &str,
    token: i64,
    caller: pg_sys::Oid,
) -> Result<Option<(Lease, i64)>, FlError> {
    crate::store::check_catalog_writable()?;
    let name_lock = LockTag::name(name);
    name_lock.lock(Mode::Exclusive);
    let now = now();
    let current = current(name, now)?;
    match decide_owner_change(as_ref(&current), token, |owner| acts_for(caller, owner)) {
        OwnerDecision::Apply => Ok(Some((current.expect("Apply implies a record").0, now))),
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
    let Some((lease, now)) = owner_change(function, name, token, caller)? else { return Ok(false) };
    let ttl = ttl_micros.unwrap_or(lease.ttl_micros);
    Store::open()?.extend(name, &lease, now, ttl)?;
    after(Change::Renewed { name, shortened: now.saturating_add(ttl) < lease.expires_at });
    Ok(true)
}

/// `fenced_lock_release`.
pub fn release(function: &str, name: &str, token: i64, caller: pg_sys::Oid) -> Result<bool, FlError> {
    let Some((lease, now)) = owner_change(function, name, token, caller)? else { return Ok(false) };
    Store::open()?.end(name, &lease, Ending::Release, now, Some(caller))?;
    after(Change::Ended { name, token, ending: Ending::Release, taken_over: false });
    Ok(true)
}

/// `fenced_lock_force_release`: the caller has been checked as operator.
pub fn force_release(name: &str, caller: pg_sys::Oid) -> Result<bool, FlError> {
    crate::store::check_catalog_writable()?;
    let name_lock = LockTag::name(name);
    name_lock.lock(Mode::Exclusive);
    let now = now();
    match current(name, now)? {
        Some((lease, State::Live)) => {
            Store::open()?.end(name, &lease, Ending::ForceRelease, now, Some(caller))?;
            after(Change::Ended {
                name,
                token: lease.token,
                ending: Ending::ForceRelease,
                taken_over: false,
            });
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
    Ok(live_token(as_ref(&current(name, now())?)) == Some(token))
}

// ---- session end -------------------------------------------------------------

thread_local! {
    static SESSION_END_ARMED: Cell<bool> = const { Cell::new(false) };
}

/// At the first session-bound grant of this backend: make sure the session's
/// leases are ended when it exits.
fn arm_session_end() {
    if !SESSION_END_ARMED.with(|a| a.replace(true)) {
        // SAFETY: registered from a backend after InitPostgres, so it runs
        // before ShutdownPostgres releases our locks and ends the transaction.
        unsafe { pg_sys::before_shmem_exit(Some(at_session_end), pg_sys::Datum::from(0)) };
    }
}

/// The session is ending: end its leases now, so that their names are free
/// at once rather than at the next probe (docs/design.md, "Session-bound
/// leases").
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn at_session_end(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    let bound = session::take_bound();
    if bound.is_empty() {
        return;
    }
    end_session_leases(&bound);
    for (token, name) in &bound {
        session::let_go(*token);
        LockTag::queue(name).wake_holders();
    }
}

/// End the leases `bound` (token, name) of the exiting session in one last
/// transaction of its own, never waiting for a lock (a name that is busy is
/// left to the next acquirer's probe).
fn end_session_leases(bound: &[(i64, String)]) {
    xact::in_own_transaction(|| {
        let mut store = None;
        for (token, name) in bound {
            let name_lock = LockTag::name(name);
            if !name_lock.try_lock(Mode::Exclusive) {
                continue;
            }
            match read(name)? {
                Some(lease) if lease.token == *token && lease.session_bound => {
                    if store.is_none() {
                        store = Some(Store::open()?);
                    }
                    let store = store.as_ref().expect("opened above");
                    store.end(name, &lease, Ending::SessionEnd, now(), None)?;
                    after(Change::Ended {
                        name,
                        token: *token,
                        ending: Ending::SessionEnd,
                        taken_over: false,
                    });
                }
                _ => name_lock.unlock(Mode::Exclusive),
            }
        }
        Ok(())
    });
}
