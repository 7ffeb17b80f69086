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
static COUNTERS: PgAtomic<[AtomicU64; 10]> = unsafe { PgAtomic::new(c"fenced_lock counters") };

/// Set in the postmaster when it preloads the library; backends inherit it.
static PRELOADED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Lease changes of the current transaction, with their subtransaction.
    static PENDING: RefCell<Vec<(Event, pg_sys::SubTransactionId)>> = const { RefCell::new(Vec::new()) };
}

/// From `_PG_init`: reserve the counters if the library is being preloaded.
pub fn register() {
    // SAFETY: reading a flag the postmaster sets while it preloads libraries.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        pg_shmem_init!(COUNTERS);
        PRELOADED.store(true, Ordering::Relaxed);
    }
}

pub fn preloaded() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}

fn add(event: Event) {
    if preloaded() {
        COUNTERS.get()[event as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// Count `event` now, whatever becomes of the transaction.
pub fn count(event: Event) {
    add(event);
}

/// Count `event` when (and if) the current transaction commits.
pub fn at_commit(event: Event) {
    if preloaded() {
        PENDING.with(|p| p.borrow_mut().push((event, crate::xact::current_subid())));
    }
}

/// An error is being raised with `sqlstate`: some are counted.
pub fn count_error(sqlstate: &str) {
    match sqlstate {
        crate::errors::sqlstate::STALE_TOKEN => count(Event::FenceRejection),
        crate::errors::sqlstate::MISSING_TOKEN => count(Event::MissingToken),
        crate::errors::sqlstate::LOCK_NOT_AVAILABLE => count(Event::WaitTimeout),
        _ => {}
    }
}

pub fn at_transaction_end(committed: bool) {
    let pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if committed {
        pending.into_iter().for_each(|(e, _)| add(e));
    }
}

pub fn at_subtransaction_abort(subid: pg_sys::SubTransactionId) {
    PENDING.with(|p| p.borrow_mut().retain(|(_, s)| *s < subid));
}

/// The counters in `COLUMNS` order, or None when they are not kept.
pub fn snapshot() -> Option<[i64; 10]> {
    preloaded().then(|| {
        let c = COUNTERS.get();
        std::array::from_fn(|i| c[i].load(Ordering::Relaxed) as i64)
    })
}
