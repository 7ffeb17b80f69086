//! What this session knows of its own leases (docs/design.md,
//! "Session-bound leases"): which leases are bound to it, when their session
//! locks go, and which leases it was granted at all (so that an acquire
//! never waits for a lease of its own session).
//!
//! A session-bound lease: the session holds its *session lock*
//! (`LockTag::session(token)`) in exclusive mode, at session level, from the
//! grant until the lease ends or the session does. PostgreSQL's lock manager
//! releases it when the backend exits for any reason, and forgets it when
//! the server restarts after a crash; so whether the session lives is
//! answered by probing that lock, without waiting: anyone else can take it
//! in shared mode exactly when the session is gone.
//!
//! Ending the leases of a session that exits cleanly is a lease transition,
//! in `lease/` (which arms the exit hook at the first session-bound grant).
//! A backend that crashes takes the whole server through recovery, and the
//! probe finds the lock gone afterwards.

use crate::locktags::{LockTag, Mode};
use crate::store::Lease;
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

/// At most this many leases granted to this session are remembered; past
/// that the oldest are forgotten (an acquire then waits for such a lease of
/// its own until it expires, as before 0.3.0).
const REMEMBERED_GRANTS: usize = 10_000;

thread_local! {
    /// Leases bound to this session: token -> name.
    static BOUND: RefCell<BTreeMap<i64, String>> = const { RefCell::new(BTreeMap::new()) };
    /// Session locks taken in the current transaction, with the
    /// subtransaction that took them (given back if that rolls back).
    static TAKEN: RefCell<Vec<(i64, pg_sys::SubTransactionId)>> = const { RefCell::new(Vec::new()) };
    /// Leases of this session ended in the current transaction (their locks
    /// are given back at commit, unless the subtransaction rolls back).
    static ENDED: RefCell<Vec<(i64, pg_sys::SubTransactionId)>> = const { RefCell::new(Vec::new()) };
    /// Leases granted to this session, committed.
    static GRANTED: RefCell<BTreeSet<i64>> = const { RefCell::new(BTreeSet::new()) };
    /// Leases granted to this session in the current transaction.
    static GRANTING: RefCell<Vec<(i64, pg_sys::SubTransactionId)>> = const { RefCell::new(Vec::new()) };
}

/// Is the session `lease` is bound to still there? Always true for a lease
/// that is not session-bound. On a standby the primary's sessions cannot be
/// seen, so there a session-bound lease lives by its ttl alone.
pub fn alive(lease: &Lease) -> bool {
    !lease.session_bound || token_alive(lease.token)
}

/// `alive` for the session-bound lease `token`.
pub fn token_alive(token: i64) -> bool {
    // SAFETY: plain accessor.
    if unsafe { pg_sys::RecoveryInProgress() } {
        return true;
    }
    let tag = LockTag::session(token);
    tag.held_by_me(Mode::Exclusive) || tag.held_by_others(Mode::Shared)
}

/// Is `lease` bound to this very session?
pub fn bound_here(lease: &Lease) -> bool {
    lease.session_bound && LockTag::session(lease.token).held_by_me(Mode::Exclusive)
}

/// Was lease `token` granted to this very session (and not ended by it)?
pub fn granted_here(token: i64) -> bool {
    GRANTED.with(|g| g.borrow().contains(&token))
        || GRANTING.with(|g| g.borrow().iter().any(|(t, _)| *t == token))
}

/// Was lease `token` granted in the current transaction (by this session)?
pub fn granted_in_this_transaction(token: i64) -> bool {
    GRANTING.with(|g| g.borrow().iter().any(|(t, _)| *t == token))
}

/// Lease `token` is being granted to this session in this transaction.
pub fn granted(token: i64) {
    GRANTING.with(|g| g.borrow_mut().push((token, crate::xact::current_subid())));
}

/// Bind the lease `token` of `name`, being granted in this transaction, to
/// this session. The lock is taken before the grant commits, so nobody can
/// see the lease without its session lock.
pub fn bind(name: &str, token: i64) {
    LockTag::session(token).lock_for_session(Mode::Exclusive);
    TAKEN.with(|t| t.borrow_mut().push((token, crate::xact::current_subid())));
    BOUND.with(|b| b.borrow_mut().insert(token, name.to_string()));
}

/// The lease `token` ended in this transaction: if it was this session's,
/// forget it once that is committed (and give its session lock back).
pub fn ended(token: i64) {
    if BOUND.with(|b| b.borrow().contains_key(&token)) || granted_here(token) {
        ENDED.with(|e| e.borrow_mut().push((token, crate::xact::current_subid())));
    }
}

/// Subtransaction `subid` rolls back: what it (or its children) bound or
/// granted is undone now, what it ended lives on.
pub fn at_subtransaction_abort(subid: pg_sys::SubTransactionId) {
    let rolled_back = TAKEN.with(|t| {
        let mut t = t.borrow_mut();
        let (gone, kept) = t.drain(..).partition(|(_, s)| *s >= subid);
        *t = kept;
        gone
    });
    unbind(rolled_back.into_iter().map(|(token, _)| token));
    ENDED.with(|e| e.borrow_mut().retain(|(_, s)| *s < subid));
    GRANTING.with(|g| g.borrow_mut().retain(|(_, s)| *s < subid));
}

fn unbind(tokens: impl Iterator<Item = i64>) {
    for token in tokens {
        let_go(token);
        BOUND.with(|b| b.borrow_mut().remove(&token));
    }
}

/// Transaction end: on commit, remember the leases granted and forget (and
/// give back the locks of) those ended; on abort, give back the locks of
/// grants rolled back.
pub fn at_transaction_end(committed: bool) {
    let taken = TAKEN.with(|t| std::mem::take(&mut *t.borrow_mut()));
    let ended = ENDED.with(|e| std::mem::take(&mut *e.borrow_mut()));
    let granting = GRANTING.with(|g| std::mem::take(&mut *g.borrow_mut()));
    if committed {
        GRANTED.with(|g| {
            let mut g = g.borrow_mut();
            g.extend(granting.iter().map(|(t, _)| *t));
            for (t, _) in &ended {
                g.remove(t);
            }
            while g.len() > REMEMBERED_GRANTS {
                g.pop_first();
            }
        });
    }
    let gone = if committed { ended } else { taken };
    unbind(gone.into_iter().map(|(token, _)| token));
}

/// The session is ending: the leases still bound to it (token, name), which
/// are forgotten here. Their locks stay until `let_go` (or the exit).
pub fn take_bound() -> Vec<(i64, String)> {
    BOUND.with(|b| std::mem::take(&mut *b.borrow_mut()).into_iter().collect())
}

/// The leases bound to this session (token, name).
pub fn bound() -> Vec<(i64, String)> {
    BOUND.with(|b| b.borrow().iter().map(|(t, n)| (*t, n.clone())).collect())
}

/// Give back the session lock of lease `token`, if this session holds it.
pub fn let_go(token: i64) {
    let tag = LockTag::session(token);
    if tag.held_by_me(Mode::Exclusive) {
        tag.unlock_for_session(Mode::Exclusive);
    }
}
