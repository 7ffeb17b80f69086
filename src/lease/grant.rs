//! Grants: one attempt to acquire a name in any mode, the try, all or
//! nothing for several names, and the reaper that rides on grants
//! (docs/design.md, "Transitions" and "Lock protocol").
//!
//! An attempt takes the name lock (exclusive, for the decision only: no one
//! holding it ever waits for anything), reads the name's records with what
//! other transactions are doing to them, and decides. A grant first ends
//! the records that ended without anyone saying so, each under its lease
//! lock taken without waiting (so a grant never passes a guarded write of
//! the lease it replaces), then writes its own record, and gives the name
//! lock back before it returns: its uncommitted record is what the next
//! decision sees, and counts as held until it commits or rolls back.

use super::decide::{decide_acquire, judge, AcquireDecision, Request, State, Status};
use super::{after, conflict_error, current, state_of, Change};
use crate::clock::now;
use crate::errors::FlError;
use crate::locktags::{LockTag, Mode};
use crate::mode::LeaseMode;
use crate::roles::acts_for;
use crate::store::{records_of_under_name_lock, Ending, Grant, Lease, Store, Visibility};
use crate::{session, xact};
use pgrx::pg_sys;
use std::cell::Cell;

/// A request to acquire `name`.
pub struct AcquireRequest<'a> {
    pub name: &'a str,
    pub ttl_micros: i64,
    pub holder: Option<&'a str>,
    pub session_bound: bool,
    pub mode: LeaseMode,
    pub caller: pg_sys::Oid,
}

/// Outcome of one attempt to acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    Granted(i64),
    /// Not now; what stands in the way, for a waiter.
    Busy {
        busy: super::Busy,
        /// an ended lease whose lease lock is taken (a guarded write of it
        /// is in flight): the grant must wait for it
        ended_in_use: Option<i64>,
    },
}

impl Attempt {
    fn busy() -> Attempt {
        Attempt::Busy { busy: Default::default(), ended_in_use: None }
    }
}

/// Records that expired this long ago are removed by later grants.
const REAP_AFTER_MICROS: i64 = 60 * 1_000_000;
/// Every this many grants a backend prunes up to `PRUNE_BATCH` history rows
/// (through the `ended_at` index) and, at most once every `REAP_INTERVAL_MICROS`,
/// removes up to `REAP_BATCH` old records (a scan of the lease table, which
/// has no index on `expires_at`: it holds only records not cleaned up yet).
const REAP_EVERY: u32 = 8;
const REAP_INTERVAL_MICROS: i64 = 1_000_000;
const REAP_BATCH: usize = 16;
const PRUNE_BATCH: usize = 64;

thread_local! {
    static GRANTS: Cell<u32> = const { Cell::new(0) };
    /// When this backend last reaped (server clock), 0: never.
    static LAST_REAP: Cell<i64> = const { Cell::new(0) };
}

/// The name lock, given back when dropped: it is only ever held for one
/// decision and its writes, never across a wait or a commit.
struct NameLock(LockTag);

impl NameLock {
    fn take(name: &str) -> NameLock {
        let tag = LockTag::name(name);
        tag.lock(Mode::Exclusive);
        NameLock(tag)
    }
}

impl Drop for NameLock {
    fn drop(&mut self) {
        // On an error the abort gives it back.
        if !std::thread::panicking() {
            self.0.unlock(Mode::Exclusive);
        }
    }
}

/// The records of `name` as a grant counts them: one per lease, judged at
/// the instant returned with them, read after the records. Reading the
/// clock after the scan keeps a grant's `acquired_at` later than the end of
/// every lease the scan found ended: a release committing between an
/// earlier clock reading and the scan would otherwise end after the grant
/// that replaced it began, on the history's clock.
fn judged(name: &str) -> Result<(Vec<(Lease, Status)>, i64), FlError> {
    let records = records_of_under_name_lock(name, Visibility::WithInProgress)?;
    let now = now();
    let mut out: Vec<(Lease, Status)> = Vec::new();
    for seen in records {
        let status = judge(state_of(&seen.lease, now), seen.in_progress);
        // An update in flight (a renew) shows both versions: one lease, held.
        match out.iter_mut().find(|(l, _)| l.token == seen.lease.token) {
            Some(known) => {
                if matches!(status, Status::InFlight(_)) {
                    known.1 = status;
                }
            }
            None => out.push((seen.lease, status)),
        }
    }
    Ok((out, now))
}

/// One attempt to acquire, without waiting for anything but the name lock
/// (held by others only for their decisions).
///
/// When the name could be granted but others are queued in
/// `fenced_lock_acquire`, the attempt reports Busy: a try never jumps the
/// queue (the head of the queue holds the queue lock, so it passes).
pub fn attempt_acquire(function: &str, req: &AcquireRequest) -> Result<Attempt, FlError> {
    crate::store::check_catalog_writable()?;
    let name_lock = NameLock::take(req.name);
    let (records, now) = judged(req.name)?;
    let refs: Vec<(&Lease, Status)> = records.iter().map(|(l, s)| (l, *s)).collect();
    let asks_again = |l: &Lease| {
        let same = if l.session_bound {
            session::bound_here(l)
        } else {
            req.holder.is_some() && l.holder.as_deref() == req.holder
        };
        same && acts_for(req.caller, l.owner)
    };
    // Which leases in the way are this very session's, so that an acquire
    // would only wait for itself: those bound to it, those granted in this
    // transaction, and those it was granted with no holder, asked for again
    // with none. A lease with a holder belongs to its holder, not to the
    // session: behind a transaction pooler one server session serves many
    // clients, each known by its holder.
    let mine = |l: &Lease| {
        session::bound_here(l)
            || session::granted_in_this_transaction(l.token)
            || (l.holder.is_none() && req.holder.is_none() && session::granted_here(l.token))
    };
    let decision = decide_acquire(&refs, &Request { mode: req.mode }, asks_again, mine);
    match decision {
        AcquireDecision::Extend { token } => {
            drop(name_lock);
            extend(req, token)
        }
        AcquireDecision::Conflict(c) => Err(conflict_error(function, req.name, req.mode, c)),
        AcquireDecision::Busy(busy) => Ok(Attempt::Busy { busy, ended_in_use: None }),
        AcquireDecision::Grant { displace } => {
            if !queue_is_empty(req.name) {
                return Ok(Attempt::busy());
            }
            // End what ended, under each lease's lock, without waiting: an
            // in-flight guarded write of it means not now.
            let mut ended = Vec::new();
            for token in displace {
                let lock = LockTag::lease(token);
                if !lock.try_lock(Mode::Exclusive) {
                    for (taken, _) in &ended {
                        LockTag::lease(*taken).unlock(Mode::Exclusive);
                    }
                    return Ok(Attempt::Busy { busy: Default::default(), ended_in_use: Some(token) });
                }
                // Under the lock, re-read: someone may have cleaned it up meanwhile.
                match current(req.name, token, now)? {
                    Some((lease, state)) if state != State::Live => ended.push((token, (lease, state))),
                    _ => lock.unlock(Mode::Exclusive),
                }
            }
            let store = Store::open()?;
            for (_, (old, state)) in &ended {
                let ending = state.ending().expect("not live");
                let ended_at = if ending == Ending::Expiry { old.expires_at } else { now };
                store.end(req.name, old, ending, ended_at, None)?;
                after(Change::Ended { lease: old, ending, taken_over: true });
            }
            let token = store.next_token()?;
            store.grant(&Grant {
                name: req.name,
                token,
                holder: req.holder,
                owner: req.caller,
                now,
                ttl_micros: req.ttl_micros,
                session_bound: req.session_bound,
                mode: req.mode,
                // SAFETY: plain accessor.
                pid: req.session_bound.then_some(unsafe { pg_sys::MyProcPid }),
            })?;
            drop(name_lock);
            after(Change::Granted {
                name: req.name,
                token,
                mode: req.mode,
                session_bound: req.session_bound,
            });
            reap_now_and_then(&store, now)?;
            Ok(Attempt::Granted(token))
        }
    }
}

/// The same holder or session asks again: extend its lease, as a renew would.
fn extend(req: &AcquireRequest, token: i64) -> Result<Attempt, FlError> {
    let lock = LockTag::lease(token);
    lock.lock(Mode::ShareUpdateExclusive);
    let now = now();
    match current(req.name, token, now)? {
        Some((lease, State::Live)) => {
            Store::open()?.extend(req.name, &lease, now, req.ttl_micros)?;
            after(Change::Extended { mode: lease.mode });
            Ok(Attempt::Granted(token))
        }
        // It ended between the decision and the lock: try again from the top.
        _ => {
            lock.unlock(Mode::ShareUpdateExclusive);
            Ok(Attempt::busy())
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
pub fn try_acquire(function: &str, req: &AcquireRequest) -> Result<Option<i64>, FlError> {
    match attempt_acquire(function, req)? {
        Attempt::Granted(token) => Ok(Some(token)),
        Attempt::Busy { .. } => Ok(None),
    }
}

/// `fenced_lock_try_acquire_all`: every name of `names` (distinct, in the
/// order given) now, or none. The names are taken in byte order, whatever
/// the order given, so two callers never wait for each other in a circle;
/// the tokens come back in the order given. If any name is busy, every
/// grant of this call is rolled back (a subtransaction) and the result is
/// None.
pub fn try_acquire_all(
    function: &str,
    names: &[String],
    template: &AcquireRequest,
) -> Result<Option<Vec<i64>>, FlError> {
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by(|&a, &b| names[a].as_bytes().cmp(names[b].as_bytes()));
    xact::in_subtransaction(|| {
        let mut tokens = vec![0; names.len()];
        for &i in &order {
            let req = AcquireRequest { name: &names[i], ..*template };
            match attempt_acquire(function, &req)? {
                Attempt::Granted(token) => tokens[i] = token,
                Attempt::Busy { .. } => return Ok(None),
            }
        }
        Ok(Some(tokens))
    })
}

// ---- reaping ---------------------------------------------------------------

/// Reaping takes the lease lock of each record it removes until commit;
/// inside a long explicit transaction that would hold up other sessions, so
/// only single-statement transactions reap. Pruning the history takes no
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
    if !xact::in_transaction_block()
        && now.saturating_sub(LAST_REAP.with(|r| r.get())) >= REAP_INTERVAL_MICROS
    {
        LAST_REAP.with(|r| r.set(now));
        reap(store, now)?;
    }
    Ok(())
}

/// Remove up to `REAP_BATCH` records that expired a while ago or whose
/// session has ended, skipping leases whose lock is busy. Keeps the table
/// from growing without bound when leases are left to expire.
fn reap(store: &Store, now: i64) -> Result<(), FlError> {
    let expired = store.expired(now - REAP_AFTER_MICROS, REAP_BATCH);
    let orphaned = store.session_bound(REAP_BATCH);
    for (name, token) in expired.into_iter().chain(orphaned) {
        let lock = LockTag::lease(token);
        if !lock.try_lock(Mode::Exclusive) {
            continue;
        }
        // Under the lock, re-read: the record may be gone.
        let ending = match current(&name, token, now)? {
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
                after(Change::Ended { lease: &lease, ending, taken_over: false });
            }
            None => lock.unlock(Mode::Exclusive),
        }
    }
    Ok(())
}
