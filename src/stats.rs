//! Cumulative counters since server start, behind `fenced_lock_stats`
//! (docs/design.md, "Observability").
//!
//! They live in shared memory reserved at server start, so they exist only
//! when the library is in `shared_preload_libraries`; without it the view
//! says `preloaded = false` and shows every counter as NULL rather than a
//! number that could have missed events of backends that never loaded the
//! library. Counters of lease changes are added when the transaction commits
//! (a rolled-back grant never happened); rejections, waits and timeouts are
//! counted when they happen, whatever becomes of the transaction.

use crate::mode::LeaseMode;
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PgAtomic};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// What is counted, in the order of `fenced_lock_stats`' columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Grant,
    Renewal,
    Release,
    Expiry,
    ForceRelease,
    SessionEnd,
    Wait,
    WaitTimeout,
    FenceRejection,
    MissingToken,
}

// SAFETY: the name is unique to this library, and the counters are only
// touched after `pg_shmem_init!` attached them (`preloaded()`).
static COUNTERS: PgAtomic<[AtomicU64; EVENTS]> = unsafe { PgAtomic::new(c"fenced_lock counters") };
// SAFETY: as for COUNTERS.
static BY_MODE_COUNTERS: PgAtomic<[[AtomicU64; BY_MODE]; 3]> =
    unsafe { PgAtomic::new(c"fenced_lock counters by mode") };

/// The totals of every event; the lease events (the first `BY_MODE`) of
/// each mode again, in `MODES` order.
const EVENTS: usize = 10;
const BY_MODE: usize = 8;
const MODES: [&str; 3] = ["exclusive", "shared", "permit"];

/// Set in the postmaster when it preloads the library; backends inherit it.
static PRELOADED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Lease changes of the current transaction, with their mode and subtransaction.
    static PENDING: RefCell<Vec<(Event, Option<LeaseMode>, pg_sys::SubTransactionId)>> =
        const { RefCell::new(Vec::new()) };
}

/// Where the counter of `event` for `mode` is, if events of that kind are
/// counted by mode (the lease events and waits are; rejections are not).
fn mode_slot(event: Event, mode: LeaseMode) -> Option<(usize, usize)> {
    let m = MODES.iter().position(|m| *m == mode.as_str())?;
    ((event as usize) < BY_MODE).then_some((m, event as usize))
}

/// From `_PG_init`: reserve the counters if the library is being preloaded.
pub fn register() {
    // SAFETY: reading a flag the postmaster sets while it preloads libraries.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        pg_shmem_init!(COUNTERS);
        pg_shmem_init!(BY_MODE_COUNTERS);
        PRELOADED.store(true, Ordering::Relaxed);
    }
}

pub fn preloaded() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}

fn add(event: Event, mode: Option<LeaseMode>) {
    if preloaded() {
        let counters = COUNTERS.get();
        counters[event as usize].fetch_add(1, Ordering::Relaxed);
        if let Some((m, e)) = mode.and_then(|m| mode_slot(event, m)) {
            BY_MODE_COUNTERS.get()[m][e].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Count `event` (of a lease of `mode`, if it is about one) now, whatever
/// becomes of the transaction.
pub fn count(event: Event, mode: Option<LeaseMode>) {
    add(event, mode);
}

/// Count `event` of a lease of `mode` when (and if) the current transaction commits.
pub fn at_commit(event: Event, mode: Option<LeaseMode>) {
    if preloaded() {
        PENDING.with(|p| p.borrow_mut().push((event, mode, crate::xact::current_subid())));
    }
}

/// An error is being raised with `sqlstate`: some are counted.
pub fn count_error(sqlstate: &str) {
    match sqlstate {
        crate::errors::sqlstate::STALE_TOKEN => count(Event::FenceRejection, None),
        crate::errors::sqlstate::MISSING_TOKEN => count(Event::MissingToken, None),
        _ => {}
    }
}

pub fn at_transaction_end(committed: bool) {
    let pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if committed {
        pending.into_iter().for_each(|(e, m, _)| add(e, m));
    }
}

pub fn at_subtransaction_abort(subid: pg_sys::SubTransactionId) {
    PENDING.with(|p| p.borrow_mut().retain(|(_, _, s)| *s < subid));
}

/// The totals, in the order of `fenced_lock_stats`' columns, or None when
/// they are not kept.
pub fn snapshot() -> Option<[i64; EVENTS]> {
    preloaded().then(|| {
        let c = COUNTERS.get();
        std::array::from_fn(|i| c[i].load(Ordering::Relaxed) as i64)
    })
}

/// Per mode (its name, then the lease events in `Event` order, grants to
/// wait timeouts), or None when they are not kept.
pub fn snapshot_by_mode() -> Option<Vec<(&'static str, [i64; BY_MODE])>> {
    preloaded().then(|| {
        let c = BY_MODE_COUNTERS.get();
        MODES
            .iter()
            .enumerate()
            .map(|(m, name)| (*name, std::array::from_fn(|i| c[m][i].load(Ordering::Relaxed) as i64)))
            .collect()
    })
}
