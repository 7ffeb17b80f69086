//! A lease transition is never less durable than `synchronous_commit = on`
//! (SPEC §7), whatever the session has set.
//!
//! Transitions mark the transaction; just before it commits, a transaction
//! callback raises `synchronous_commit` from `off` or `local` to `on` for that
//! commit only (`remote_write` and `remote_apply` already flush locally and are
//! left as they are). Doing it at pre-commit rather than inside the function
//! means a caller's function with its own `SET` clause cannot undo it.

use pgrx::pg_sys;
use std::cell::Cell;

thread_local! {
    static MUST_FLUSH: Cell<bool> = const { Cell::new(false) };
}

pub fn register() {
    // SAFETY: called once from _PG_init.
    unsafe { pg_sys::RegisterXactCallback(Some(on_xact_event), std::ptr::null_mut()) };
}

/// The current transaction changed lease state: make its commit durable.
pub fn require_durable_commit() {
    MUST_FLUSH.with(|m| m.set(true));
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_xact_event(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    match event {
        pg_sys::XactEvent::XACT_EVENT_PRE_COMMIT
            if MUST_FLUSH.with(|m| m.get())
                // SAFETY: reading a GUC variable of this backend.
                && unsafe { pg_sys::synchronous_commit }
                    < pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_REMOTE_WRITE as i32 =>
        {
            // SAFETY: inside a transaction; GUC_ACTION_LOCAL reverts at transaction end.
            unsafe {
                pg_sys::set_config_option(
                    c"synchronous_commit".as_ptr(),
                    c"on".as_ptr(),
                    pg_sys::GucContext::PGC_USERSET,
                    pg_sys::GucSource::PGC_S_SESSION,
                    pg_sys::GucAction::GUC_ACTION_LOCAL,
                    true,
                    0,
                    false,
                );
            }
        }
        pg_sys::XactEvent::XACT_EVENT_COMMIT
        | pg_sys::XactEvent::XACT_EVENT_ABORT
        | pg_sys::XactEvent::XACT_EVENT_PREPARE
        | pg_sys::XactEvent::XACT_EVENT_PARALLEL_COMMIT
        | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT => MUST_FLUSH.with(|m| m.set(false)),
        _ => {}
    }
}
