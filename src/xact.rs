//! Transaction boundaries: one callback that tells each module a
//! transaction (or subtransaction) is ending, and a way to run work in a
//! transaction of our own when the session itself is ending.

use crate::{durability, registry, session, stats};
use pgrx::pg_sys;
use pgrx::PgTryBuilder;

pub fn register() {
    // SAFETY: called once from _PG_init.
    unsafe {
        pg_sys::RegisterXactCallback(Some(on_xact_event), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(on_subxact_event), std::ptr::null_mut());
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_xact_event(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    match event {
        pg_sys::XactEvent::XACT_EVENT_PRE_COMMIT => durability::at_pre_commit(),
        pg_sys::XactEvent::XACT_EVENT_COMMIT | pg_sys::XactEvent::XACT_EVENT_PREPARE => {
            durability::at_transaction_end();
            session::at_transaction_end(true);
            stats::at_transaction_end(true);
        }
        pg_sys::XactEvent::XACT_EVENT_ABORT => {
            durability::at_transaction_end();
            session::at_transaction_end(false);
            stats::at_transaction_end(false);
            registry::leave();
        }
        pg_sys::XactEvent::XACT_EVENT_PARALLEL_COMMIT | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT => {
            durability::at_transaction_end();
        }
        _ => {}
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_subxact_event(
    event: pg_sys::SubXactEvent::Type,
    my_subid: pg_sys::SubTransactionId,
    _parent_subid: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        crate::fence::forget_checks();
        session::at_subtransaction_abort(my_subid);
        stats::at_subtransaction_abort(my_subid);
        registry::leave();
    }
}

/// The id of the current subtransaction (1 at top level).
pub fn current_subid() -> pg_sys::SubTransactionId {
    // SAFETY: plain accessor.
    unsafe { pg_sys::GetCurrentSubTransactionId() }
}

/// Run `work` in a transaction of its own while the backend exits, as
/// PostgreSQL's own temp-table cleanup does: end whatever transaction the
/// session was in, start one, commit it. An error rolls that transaction back
/// and is logged; the session is ending, so nothing else can be done.
pub fn in_own_transaction(work: impl FnOnce() -> Result<(), crate::errors::FlError>) {
    // SAFETY: called from a before_shmem_exit callback of a backend, while
    // it is still connected to its database.
    unsafe {
        pg_sys::AbortOutOfAnyTransaction();
        pg_sys::StartTransactionCommand();
    }
    let work = std::panic::AssertUnwindSafe(work);
    let outcome = PgTryBuilder::new(move || {
        let work = work;
        (work.0)().map_err(|e| e.to_string())
    })
    .catch_others(|e| Err(format!("{e:?}")))
    .execute();
    match outcome {
        // SAFETY: the transaction started above.
        Ok(()) => unsafe { pg_sys::CommitTransactionCommand() },
        Err(problem) => {
            pgrx::log!("fenced_lock: could not end the leases of an ending session: {problem}");
            // SAFETY: as above; rolls back what `work` did.
            unsafe { pg_sys::AbortCurrentTransaction() };
        }
    }
}
