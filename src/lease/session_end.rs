//! The end of a session as a lease transition (docs/design.md,
//! "Session-bound leases"): when a backend that holds session-bound leases
//! exits cleanly (the client disconnects or is killed, `pg_terminate_backend`,
//! `idle_session_timeout`), it ends them in one last transaction of its own,
//! as PostgreSQL's temporary-table cleanup does, so their names are free at
//! once rather than at the next probe.

use super::decide::State;
use super::{after, current, Change};
use crate::clock::now;
use crate::locktags::{LockTag, Mode};
use crate::store::{Ending, Store};
use crate::{session, xact};
use pgrx::pg_sys;
use std::cell::Cell;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

/// At the first session-bound grant of this backend: make sure the session's
/// leases are ended when it exits.
pub fn arm() {
    if !ARMED.with(|a| a.replace(true)) {
        // SAFETY: registered from a backend after InitPostgres, so it runs
        // before ShutdownPostgres releases our locks and ends the transaction.
        unsafe { pg_sys::before_shmem_exit(Some(at_session_end), pg_sys::Datum::from(0)) };
    }
}

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
/// transaction of its own, never waiting for a lock (a lease whose lock is
/// busy is left to the next acquirer's probe).
fn end_session_leases(bound: &[(i64, String)]) {
    xact::in_own_transaction(|| {
        let mut store = None;
        for (token, name) in bound {
            let lock = LockTag::lease(*token);
            if !lock.try_lock(Mode::Exclusive) {
                continue;
            }
            let now = now();
            match current(name, *token, now)? {
                // Its session lock may be gone already (DISCARD ALL): it ends
                // now all the same, unless it expired first.
                Some((lease, state)) if lease.session_bound => {
                    let (ending, ended_at) = match state {
                        State::Expired => (Ending::Expiry, lease.expires_at),
                        _ => (Ending::SessionEnd, now),
                    };
                    if store.is_none() {
                        store = Some(Store::open()?);
                    }
                    let store = store.as_ref().expect("opened above");
                    store.end(name, &lease, ending, ended_at, None)?;
                    after(Change::Ended { lease: &lease, ending, taken_over: false });
                }
                _ => lock.unlock(Mode::Exclusive),
            }
        }
        Ok(())
    });
}
