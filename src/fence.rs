//! The fencing check shared by the guard trigger and `fenced_lock_assert`
//! (docs/design.md, "The guard").
//!
//! It takes the lease lock of the presented token in `RowShare` mode and
//! keeps it until the transaction ends, then reads that lease's record in
//! the latest committed state. Every end of a lease (release, takeover,
//! force release, reaping, session end) needs the same lock in `Exclusive`
//! mode, so it waits until every write this check accepted has committed or
//! aborted; writes under one lease, and under different leases of one name,
//! never wait for each other, and a renew (`ShareUpdateExclusive`) does not
//! wait for them either.

use crate::clock::now;
use crate::compat;
use crate::errors::{quote_name, quoted_in_full, sql_literal, sqlstate, token_text, FlError};
use crate::lease::{state_of, State};
use crate::locktags::{LockTag, Mode};
use crate::mode::LeaseMode;
use crate::store::{record, records_of, write_generation, Visibility};
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;

/// `token` is not a live lease of `name`; `all_live` are the live tokens
/// (`live`: the one, when there is exactly one).
pub fn stale_token(name: &str, token: i64, live: Option<i64>, all_live: &[i64]) -> FlError {
    let shown = if all_live.len() > 1 {
        all_live.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
    } else {
        token_text(live)
    };
    let (what, tokens) =
        if all_live.len() > 1 { ("live tokens are", "live tokens") } else { ("live token is", "live token") };
    FlError::new(
        sqlstate::STALE_TOKEN,
        format!("stale fencing token {token} for lock {}: {what} {shown}", quote_name(name)),
    )
    .detail(format!("lock: {}; presented token: {token}; {tokens}: {shown}", quote_name(name)))
    .hint("The lease was lost (expired, released or taken over). Acquire the lock again, re-read, and retry with the new token.")
}

/// The live tokens of `name` now, for an error message.
fn live_tokens(name: &str) -> Vec<i64> {
    let now = now();
    records_of(name, Visibility::Committed)
        .map(|seen| {
            seen.into_iter()
                .filter(|s| state_of(&s.lease, now) == State::Live)
                .map(|s| s.lease.token)
                .collect()
        })
        .unwrap_or_default()
}

/// A shared lease presented to a guard that accepts only exclusive leases
/// and permits.
fn shared_not_accepted(name: &str, token: i64) -> FlError {
    FlError::new(
        sqlstate::MODE_CONFLICT,
        format!("fencing token {token} for lock {} is a shared lease, which this guard does not accept", quote_name(name)),
    )
    .hint("Write with an exclusive lease or a permit, or give the guard trigger the third argument 'shared' to accept shared leases.")
}

/// Accept `token` for `name` only if it is a live lease of it right now (a
/// shared one only if `accept_shared`); its mode.
pub fn check(name: &str, token: i64, accept_shared: bool) -> Result<LeaseMode, FlError> {
    let mode = match checked_before(name, token) {
        Some(mode) => mode,
        None => {
            LockTag::lease(token).lock(Mode::RowShare);
            match record(name, token)? {
                Some(lease) if state_of(&lease, now()) == State::Live => {
                    remember_check(name, token, lease.expires_at, lease.session_bound, lease.mode);
                    lease.mode
                }
                _ => {
                    let live = live_tokens(name);
                    return Err(stale_token(name, token, (live.len() == 1).then(|| live[0]), &live));
                }
            }
        }
    };
    if mode == LeaseMode::Shared && !accept_shared {
        return Err(shared_not_accepted(name, token));
    }
    Ok(mode)
}

/// A map kept for one transaction only: it empties itself when it is used
/// in another transaction than the one that filled it (told apart by the
/// local transaction id). A pooled connection's next transaction starts
/// empty.
struct PerTransaction<K, T> {
    lxid: pg_sys::LocalTransactionId,
    entries: HashMap<K, T>,
}

impl<K, T> PerTransaction<K, T> {
    fn new() -> Self {
        PerTransaction { lxid: 0, entries: HashMap::new() }
    }

    /// The entries of the current transaction.
    fn current(&mut self) -> &mut HashMap<K, T> {
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
    expires_at: i64,
    session_bound: bool,
    mode: LeaseMode,
    write_generation: u64,
}

thread_local! {
    static CHECKED: RefCell<PerTransaction<(String, i64), CheckedLease>> = RefCell::new(PerTransaction::new());
    /// Names asserted in the current transaction, with the token asserted.
    static ASSERTED: RefCell<PerTransaction<String, i64>> = RefCell::new(PerTransaction::new());
}

/// The mode of lease `token` of `name` if this transaction checked it
/// before and it is still live: the lease lock taken then keeps it from
/// ending, and the clock and the session are looked at again. An expiry
/// that seems to have passed is read again: a renew may have moved it.
fn checked_before(name: &str, token: i64) -> Option<LeaseMode> {
    let hit = CHECKED.with(|c| {
        let mut c = c.borrow_mut();
        match c.current().get(&(name.to_string(), token)) {
            Some(l) if l.write_generation == write_generation() => {
                Some((l.expires_at, l.session_bound, l.mode))
            }
            _ => None,
        }
    });
    let (expires_at, session_bound, mode) = hit?;
    (now() < expires_at && (!session_bound || crate::session::token_alive(token))).then_some(mode)
}

fn remember_check(name: &str, token: i64, expires_at: i64, session_bound: bool, mode: LeaseMode) {
    let write_generation = write_generation();
    CHECKED.with(|c| {
        c.borrow_mut().current().insert(
            (name.to_string(), token),
            CheckedLease { expires_at, session_bound, mode, write_generation },
        )
    });
}

/// A subtransaction rolled back: it may have given back name locks that
/// remembered checks relied on.
pub fn at_subtransaction_abort() {
    CHECKED.with(|c| c.borrow_mut().entries.clear());
}

/// `fenced_lock_assert`: the check (any mode), remembered for this
/// transaction so that the guard can accept a DELETE of rows under `name`.
pub fn assert(name: &str, token: i64) -> Result<(), FlError> {
    check(name, token, true)?;
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
        let e = stale_token("inventory:1", 41, Some(42), &[42]);
        assert_eq!(e.sqlstate, "FL001");
        assert!(e.message.contains("\"inventory:1\""));
        assert!(e.message.contains("41") && e.message.contains("42"));
        assert!(stale_token("x", 7, None, &[]).message.contains("live token is none"));
        let several = stale_token("x", 7, None, &[8, 9]);
        assert!(several.message.contains("live tokens are 8, 9"), "{}", several.message);
        assert!(several.detail.unwrap().contains("live tokens: 8, 9"));
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
