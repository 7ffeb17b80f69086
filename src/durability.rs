//! How durable the commit of a lease change is (docs/design.md, "Durability").
//!
//! - A grant or renewal is never less durable than `synchronous_commit = on`,
//!   whatever the session has set: just before such a transaction commits,
//!   `off` and `local` are raised to `on` for that commit only
//!   (`remote_write` and `remote_apply` already flush locally and are kept).
//! - A release (or forced release, or the end of a session's leases) may be
//!   acknowledged before it is flushed, but only when the transaction wrote
//!   nothing but fenced_lock's own records: then its commit runs with
//!   `synchronous_commit = off`. Whether anything else was written is told
//!   by the backend's WAL position (`XactLastRecEnd`): it must be where our
//!   last lease-changing call left it, and must not have moved between our
//!   calls (or before the first one). Everything inside our calls counts as
//!   ours: their reads may prune a page and write WAL too.
//!
//! Doing this at pre-commit rather than inside the functions means a caller's
//! function with its own `SET` clause cannot undo it.

use pgrx::pg_sys;
use std::cell::Cell;

#[derive(Clone, Copy, Default)]
struct Marks {
    /// a grant or renewal: flush before acknowledging
    flush: bool,
    /// a release: may be acknowledged before the flush
    released: bool,
    /// WAL written in this transaction by something other than us
    foreign: bool,
    /// the WAL position when our last call returned, 0 before the first
    ours_end: u64,
}

thread_local! {
    static MARKS: Cell<Marks> = Cell::new(Marks::default());
    /// The `synchronous_commit` value an asynchronous commit replaced, put
    /// back at transaction end.
    static REPLACED: Cell<Option<i32>> = const { Cell::new(None) };
}

fn update(f: impl FnOnce(&mut Marks)) {
    MARKS.with(|m| {
        let mut marks = m.get();
        f(&mut marks);
        m.set(marks);
    });
}

fn wal_end() -> u64 {
    // SAFETY: a backend-local variable, 0 until this transaction writes WAL.
    unsafe { pg_sys::XactLastRecEnd }
}

/// Entering a lease-changing call: has anything else written WAL since the
/// last one (or, for the first, since the transaction began)?
pub fn enter() {
    let end = wal_end();
    // SAFETY: plain accessor.
    let xid_assigned = unsafe { pg_sys::GetTopTransactionIdIfAny() } != pg_sys::InvalidTransactionId;
    update(|m| {
        let moved = if m.ours_end == 0 { end != 0 || xid_assigned } else { end != m.ours_end };
        m.foreign |= moved;
    });
}

/// Leaving a lease-changing call (also when it fails: the error aborts).
pub fn leave() {
    let end = wal_end();
    update(|m| m.ours_end = end);
}

/// The current transaction granted or renewed a lease.
pub fn must_flush() {
    update(|m| m.flush = true);
}

/// The current transaction released a lease.
pub fn released() {
    update(|m| m.released = true);
}

/// What the commit about to happen should do, given the marks and where
/// the WAL is now.
#[derive(Debug, PartialEq, Eq)]
enum Commit {
    /// raise `synchronous_commit` to `on`
    Flush,
    /// lower it to `off`: only our release is in this commit
    Async,
    /// leave the session's setting alone
    AsAsked,
}

fn decide(m: Marks, wal_end_now: u64) -> Commit {
    if m.flush {
        Commit::Flush
    } else if m.released && !m.foreign && m.ours_end != 0 && wal_end_now == m.ours_end {
        Commit::Async
    } else {
        Commit::AsAsked
    }
}

/// Pre-commit: set this commit's durability.
pub fn at_pre_commit() {
    let marks = MARKS.with(|m| m.get());
    match decide(marks, wal_end()) {
        Commit::Flush => {
            // SAFETY: reading a GUC variable of this backend.
            let level = unsafe { pg_sys::synchronous_commit };
            if level < pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_REMOTE_WRITE as i32 {
                crate::guc_scope::set_for_transaction(c"synchronous_commit", c"on");
            }
        }
        // Lowering it is done on the variable itself, put back at
        // transaction end, rather than by a `SET LOCAL`: that would push a
        // GUC nest level for this one commit, which costs every lone
        // release some 7k instructions (bench table 8). Lowering needs
        // nothing the GUC machinery does: below `local`, the commit neither
        // flushes nor waits for a standby, whatever the wait mode the
        // setting's assign hook chose (`RecordTransactionCommit`,
        // `SyncRepRequested`). Raising it (above) keeps `set_config_option`,
        // because a standby wait needs that hook's wait mode.
        Commit::Async => {
            // SAFETY: this backend's GUC variable, read by the commit about
            // to happen; restored in `at_transaction_end`, which runs on
            // commit and on abort, before AtEOXact_GUC.
            unsafe {
                REPLACED.with(|r| r.set(Some(pg_sys::synchronous_commit)));
                pg_sys::synchronous_commit = pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_OFF as i32;
            }
        }
        Commit::AsAsked => {}
    }
}

/// Commit or abort: forget the marks, and give `synchronous_commit` back
/// its value if this commit lowered it.
pub fn at_transaction_end() {
    MARKS.with(|m| m.set(Marks::default()));
    if let Some(level) = REPLACED.with(|r| r.take()) {
        // SAFETY: this backend's GUC variable, set back to the value the
        // GUC machinery holds for it.
        unsafe { pg_sys::synchronous_commit = level };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks(flush: bool, released: bool, foreign: bool, ours_end: u64) -> Marks {
        Marks { flush, released, foreign, ours_end }
    }

    #[test]
    fn a_grant_or_renewal_is_always_flushed() {
        assert_eq!(decide(marks(true, false, false, 10), 10), Commit::Flush);
        assert_eq!(decide(marks(true, true, false, 10), 10), Commit::Flush);
        assert_eq!(decide(marks(true, true, true, 10), 99), Commit::Flush);
    }

    #[test]
    fn a_release_alone_is_acknowledged_before_the_flush() {
        assert_eq!(decide(marks(false, true, false, 10), 10), Commit::Async);
    }

    #[test]
    fn a_release_beside_other_writes_keeps_the_sessions_durability() {
        // something else wrote before our first write
        assert_eq!(decide(marks(false, true, true, 10), 10), Commit::AsAsked);
        // something else wrote after our last write
        assert_eq!(decide(marks(false, true, false, 10), 20), Commit::AsAsked);
    }

    #[test]
    fn a_transaction_without_lease_changes_is_left_alone() {
        assert_eq!(decide(Marks::default(), 0), Commit::AsAsked);
        assert_eq!(decide(Marks::default(), 50), Commit::AsAsked);
    }
}
