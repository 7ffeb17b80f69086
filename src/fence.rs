//! The fencing check shared by the guard trigger and `fenced_lock_assert`
//! (docs/design.md, "The guard").
//!
//! It takes the name lock in shared mode and keeps it until the transaction
//! ends, then compares the token with the latest committed lease. A takeover
//! needs the same lock in exclusive mode, so it waits until every write this
//! check accepted has committed or aborted; writes of one holder share the
//! lock and never wait for each other.

use crate::clock::now;
use crate::compat;
use crate::errors::{quote_name, quoted_in_full, sql_literal, sqlstate, token_text, FlError};
use crate::lease::{live_token, state_of};
use crate::locktags::{LockTag, Mode};
use crate::store::{read, write_generation};
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;

/// `token` is not the live lease of `name`; `live` is the live token, if any.
pub fn stale_token(name: &str, token: i64, live: Option<i64>) -> FlError {
    FlError::new(
        sqlstate::STALE_TOKEN,
        format!("stale fencing token {token} for lock {}: live token is {}", quote_name(name), token_text(live)),
    )
    .detail(format!("lock: {}; presented token: {token}; live token: {}", quote_name(name), token_text(live)))
    .hint("The lease was lost (expired, released or taken over). Acquire the lock again, re-read, and retry with the new token.")
}

/// Accept `token` for `name` only if it is the live lease right now.
pub fn check(name: &str, token: i64) -> Result<(), FlError> {
    if checked_before(name, token) {
        return Ok(());
    }
    LockTag::name(name).lock(Mode::Shared);
    let lease = read(name)?;
    let live = lease.as_ref().and_then(|l| live_token(Some((l, state_of(l, now())))));
    if live == Some(token) {
        let lease = lease.expect("a live token has a record");
        remember_check(name, token, lease.expires_at, lease.session_bound);
        Ok(())
    } else {
        Err(stale_token(name, token, live))
    }
}

/// A map kept for one transaction only: it empties itself when it is used
/// in another transaction than the one that filled it (told apart by the
/// local transaction id). A pooled connection's next transaction starts
/// empty.
struct PerTransaction<T> {
    lxid: pg_sys::LocalTransactionId,
    entries: HashMap<String, T>,
}

impl<T> PerTransaction<T> {
    fn new() -> Self {
        PerTransaction { lxid: 0, entries: HashMap::new() }
    }

    /// The entries of the current transaction.
    fn current(&mut self) -> &mut HashMap<String, T> {
        let lxid = compat::current_lxid();
        if self.lxid != lxid {
            self.lxid = lxid;
            self.entries.clear();
        }
        &mut self.entries
    }
}

/// A lease this transaction has checked, so that a statement writing many
/// rows under one lock reads its record once. Such an entry stays right for
/// as long as the transaction keeps the name lock it took for the check: no
/// other backend can change the record meanwhile. It is not trusted once
/// this backend has opened a write session itself (`write_generation`
/// moved), and it is forgotten when a subtransaction rolls back (which may
/// give the lock back) and when the transaction ends. The clock and the
/// session are still looked at every time.
struct CheckedLease {
    token: i64,
    expires_at: i64,
    session_bound: bool,
    write_generation: u64,
}

thread_local! {
    static CHECKED: RefCell<PerTransaction<CheckedLease>> = RefCell::new(PerTransaction::new());
    /// Names asserted in the current transaction, with the token asserted.
    static ASSERTED: RefCell<PerTransaction<i64>> = RefCell::new(PerTransaction::new());
}

fn checked_before(name: &str, token: i64) -> bool {
    let hit = CHECKED.with(|c| {
        let mut c = c.borrow_mut();
        match c.current().get(name) {
            Some(l) if l.token == token && l.write_generation == write_generation() => {
                Some((l.expires_at, l.session_bound))
            }
            _ => None,
        }
    });
    match hit {
        Some((expires_at, session_bound)) => {
            now() < expires_at && (!session_bound || crate::session::token_alive(token))
        }
        None => false,
    }
}

fn remember_check(name: &str, token: i64, expires_at: i64, session_bound: bool) {
    let write_generation = write_generation();
    CHECKED.with(|c| {
        c.borrow_mut()
            .current()
            .insert(name.to_string(), CheckedLease { token, expires_at, session_bound, write_generation })
    });
}

/// A subtransaction rolled back: it may have given back name locks that
/// remembered checks relied on.
pub fn at_subtransaction_abort() {
    CHECKED.with(|c| c.borrow_mut().entries.clear());
}

/// `fenced_lock_assert`: the check, remembered for this transaction so that
/// the guard can accept a DELETE of rows under `name`.
pub fn assert(name: &str, token: i64) -> Result<(), FlError> {
    check(name, token)?;
    remember_assert(name, token);
    Ok(())
}

/// A DELETE, TRUNCATE, or UPDATE moving a row to another lock (`what` says
/// which), with no `fenced_lock_assert` of `name` in this transaction.
pub fn delete_without_assert(name: &str, what: &str) -> FlError {
    // A cut name would be another lock's: show the call only for names shown whole.
    let call = if quoted_in_full(name) {
        format!("fenced_lock_assert({}, <token>)", sql_literal(name))
    } else {
        format!("fenced_lock_assert(<the lock name, {} bytes>, <token>)", name.len())
    };
    FlError::new(
        sqlstate::MISSING_TOKEN,
        format!("guarded {what} lock {} without a fencing token", quote_name(name)),
    )
    .hint(format!("Call {call} in the same transaction first."))
}

fn remember_assert(name: &str, token: i64) {
    ASSERTED.with(|a| a.borrow_mut().current().insert(name.to_string(), token));
}

/// The token this transaction asserted for `name`, if it did.
pub fn asserted_token(name: &str) -> Option<i64> {
    ASSERTED.with(|a| a.borrow_mut().current().get(name).copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_token_message_names_lock_and_both_tokens() {
        let e = stale_token("inventory:1", 41, Some(42));
        assert_eq!(e.sqlstate, "FL001");
        assert!(e.message.contains("\"inventory:1\""));
        assert!(e.message.contains("41") && e.message.contains("42"));
        assert!(stale_token("x", 7, None).message.contains("live token is none"));
    }

    #[test]
    fn the_hint_for_a_long_name_never_quotes_a_cut_name_as_a_lock() {
        let long = format!("{}:tail", "x".repeat(100));
        let e = delete_without_assert(&long, "delete under");
        let hint = e.hint.unwrap();
        assert!(!hint.contains(&"x".repeat(80)), "{hint}");
        assert!(hint.contains(&format!("{} bytes", long.len())), "{hint}");
        let short = delete_without_assert("it's:1", "delete under");
        assert!(short.hint.unwrap().contains("fenced_lock_assert('it''s:1', <token>)"));
    }
}
