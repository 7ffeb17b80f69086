//! The fencing check shared by the guard trigger and `fenced_lock_assert`.
//!
//! It takes the name's FENCE lock in shared mode and keeps it until the
//! transaction ends, then compares the token with the latest committed lease.
//! A takeover needs the same lock in exclusive mode, so it waits until every
//! write this check accepted has committed or aborted (SPEC §4, Ordering);
//! writes of one holder share the lock and never wait for each other.

use crate::errors::FlError;
use crate::keys::{Key, Mode};
use crate::lease::live_token;
use crate::store::{now, read};
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;

/// Accept `token` for `name` only if it is the live lease right now.
pub fn check(name: &str, token: i64) -> Result<(), FlError> {
    Key::fence(name).lock(Mode::Shared);
    let live = live_token(read(name)?.as_ref(), now());
    if live == Some(token) {
        Ok(())
    } else {
        Err(FlError::stale_token(name, token, live))
    }
}

/// `fenced_lock_assert`: the check, remembered for this transaction so that
/// the guard can accept a DELETE of rows under `name`.
pub fn assert(name: &str, token: i64) -> Result<(), FlError> {
    check(name, token)?;
    remember_assert(name, token);
    Ok(())
}

/// Names asserted in the current transaction (by local transaction id), with
/// the token asserted. Only transaction-scoped: a pooled connection's next
/// transaction starts empty.
struct Asserted {
    lxid: pg_sys::LocalTransactionId,
    names: HashMap<String, i64>,
}

thread_local! {
    static ASSERTED: RefCell<Asserted> = RefCell::new(Asserted { lxid: 0, names: HashMap::new() });
}

fn current_lxid() -> pg_sys::LocalTransactionId {
    // SAFETY: MyProc is set for the life of a backend.
    unsafe { (*pg_sys::MyProc).lxid }
}

fn remember_assert(name: &str, token: i64) {
    let lxid = current_lxid();
    ASSERTED.with(|a| {
        let mut a = a.borrow_mut();
        if a.lxid != lxid {
            a.lxid = lxid;
            a.names.clear();
        }
        a.names.insert(name.to_string(), token);
    });
}

/// The token this transaction asserted for `name`, if it did.
pub fn asserted_token(name: &str) -> Option<i64> {
    let lxid = current_lxid();
    ASSERTED.with(|a| {
        let a = a.borrow();
        if a.lxid != lxid {
            return None;
        }
        a.names.get(name).copied()
    })
}
