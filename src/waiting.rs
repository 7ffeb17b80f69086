//! `fenced_lock_acquire`: wait for a lock, FIFO, asleep (docs/design.md,
//! "Waiting").
//!
//! 1. One attempt as `fenced_lock_try_acquire` makes it, never waiting
//!    (granted if the name is free and nobody is queued, or if the same
//!    holder or session asks again).
//! 2. Otherwise the waiter queues on the name's queue lock, whatever mode it
//!    asks for. PostgreSQL's lock manager keeps the queue: arrival order,
//!    asleep, cancellable, deadlock-checked. Waiters never queue on a lock a
//!    holder needs, so they never block its guarded writes or its release.
//! 3. The holder of the queue lock is the head waiter. It alone watches the
//!    name. What stands in the way decides how it waits: an ended lease
//!    with a guarded write in flight, on that lease's lock (this is where a
//!    takeover waits for the write); an uncommitted grant or end, on that
//!    transaction; live leases, asleep on its latch until the first of them
//!    expires (at most `RECHECK_MS`). A release, force release, shortening
//!    renew or the end of a holder's session sets its latch at once (found
//!    through the lock manager: whoever holds the queue lock). When it is
//!    granted, its queue lock goes at commit and the next waiter is head:
//!    a semaphore's waiters are served one after the other as permits free,
//!    shared waiters one after the other while shared leases are live, and a
//!    queued exclusive request keeps later shared ones behind it.
//! 4. An acquire that could only be granted once a lease of its own session
//!    ends fails at once (`FL003`) instead of waiting for itself.
//!
//! `wait` and `lock_timeout` (whichever is shorter) bound every part of the
//! wait, lock-manager waits included; cancel and `statement_timeout` end it at
//! once and, being errors, leave no lease, queue place or lock behind. A
//! waiter whose client has gone away leaves the line instead of being served
//! (`compat::client_gone`).

use crate::clock::now;
use crate::errors::{quote_name, sqlstate, FlError};
use crate::lease::{attempt_acquire, conflict_error, AcquireRequest, Attempt, Conflict};
use crate::locktags::{LockTag, Mode};
use crate::stats::Event;
use crate::{compat, registry, stats};
use pgrx::pg_sys;
use pgrx::{PgSqlErrorCode, PgTryBuilder};

/// The head re-reads the lease, and checks its client, at least this often.
const RECHECK_MS: i64 = 500;

fn wait_timeout(function: &str, name: &str, waited_ms: i64) -> FlError {
    FlError::new(
        sqlstate::LOCK_NOT_AVAILABLE,
        format!("{function}: lock {} not granted within {waited_ms} ms", quote_name(name)),
    )
    .hint("Another holder has the lease; retry later, pass a longer wait, or use fenced_lock_try_acquire.")
}

/// `fenced_lock_acquire`: `wait` None waits until granted or cancelled.
pub fn acquire(function: &str, req: &AcquireRequest, wait_micros: Option<i64>) -> Result<i64, FlError> {
    let start = now();
    acquire_until(function, req, start, deadline(start, wait_micros))
}

/// `fenced_lock_acquire_all`: every name of `names` (distinct), waiting for
/// each in its own line, in byte order of the names (so two callers never
/// wait for each other in a circle), all within one `wait`. The tokens come
/// back in the order given. Nothing is granted unless everything is: any
/// error, a timeout included, rolls the whole call back with its statement.
pub fn acquire_all(
    function: &str,
    names: &[String],
    template: &AcquireRequest,
    wait_micros: Option<i64>,
) -> Result<Vec<i64>, FlError> {
    let start = now();
    let deadline = deadline(start, wait_micros);
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by(|&a, &b| names[a].as_bytes().cmp(names[b].as_bytes()));
    let mut tokens = vec![0; names.len()];
    for i in order {
        tokens[i] =
            acquire_until(function, &AcquireRequest { name: &names[i], ..*template }, start, deadline)?;
    }
    Ok(tokens)
}

/// The instant a wait that started at `start` must end: `wait` and
/// `lock_timeout`, whichever is shorter; None for no bound.
fn deadline(start: i64, wait_micros: Option<i64>) -> Option<i64> {
    effective_wait(wait_micros, session_lock_timeout_micros()).map(|w| start.saturating_add(w))
}

fn acquire_until(
    function: &str,
    req: &AcquireRequest,
    start: i64,
    deadline: Option<i64>,
) -> Result<i64, FlError> {
    let timed_out = || {
        stats::count(Event::WaitTimeout, Some(req.mode));
        wait_timeout(function, req.name, (now() - start) / 1000)
    };
    let own_lease = |token| conflict_error(function, req.name, req.mode, Conflict::OwnLease { token });

    match attempt_acquire(function, req)? {
        Attempt::Granted(token) => return Ok(token),
        Attempt::Busy { busy, .. } => {
            if let Some(token) = busy.own {
                return Err(own_lease(token));
            }
        }
    }
    if deadline.is_some_and(|d| now() >= d) {
        return Err(timed_out());
    }

    stats::count(Event::Wait, Some(req.mode));
    registry::enter(req.name, req.holder, req.caller, start, req.mode);
    lock_until(&LockTag::queue(req.name), Mode::Exclusive, deadline, &timed_out)?;
    registry::at_head();
    loop {
        // SAFETY: MyLatch is this backend's own latch.
        unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
        if compat::client_gone() {
            compat::leave_because_client_gone();
        }
        let (busy, ended_in_use) = match attempt_acquire(function, req)? {
            Attempt::Granted(token) => {
                registry::leave();
                return Ok(token);
            }
            Attempt::Busy { busy, ended_in_use } => (busy, ended_in_use),
        };
        if let Some(token) = busy.own {
            return Err(own_lease(token));
        }
        // A lease that ended still has a guarded write in flight: this is
        // where a takeover waits for it. Its lock, once ours, stays ours
        // until commit, so the next attempt can end it.
        if let Some(token) = ended_in_use {
            lock_until(&LockTag::lease(token), Mode::Exclusive, deadline, &timed_out)?;
            continue;
        }
        // Only an uncommitted grant or end is in the way: wait for its transaction.
        if let Some(xid) = busy.in_flight {
            let tx = LockTag::transaction(xid);
            lock_until(&tx, Mode::Shared, deadline, &timed_out)?;
            tx.unlock(Mode::Shared);
            continue;
        }
        let now = now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(timed_out());
        }
        let mut sleep_ms = RECHECK_MS;
        if let Some(e) = busy.expires_at {
            // wake just after the expiry instant
            sleep_ms = sleep_ms.min((e - now) / 1000 + 1);
        }
        if let Some(d) = deadline {
            sleep_ms = sleep_ms.min((d - now + 999) / 1000);
        }
        // SAFETY: waiting on our own latch; WL_EXIT_ON_PM_DEATH ends the
        // backend if the postmaster dies.
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                sleep_ms.max(1) as std::ffi::c_long,
                pg_sys::PG_WAIT_EXTENSION,
            );
        }
        pgrx::check_for_interrupts!();
    }
}

/// The session's `lock_timeout` in microseconds, None when it is 0 (off).
fn session_lock_timeout_micros() -> Option<i64> {
    // SAFETY: reading the lock_timeout GUC's variable (milliseconds).
    let ms = unsafe { pg_sys::LockTimeout };
    (ms > 0).then(|| ms as i64 * 1000)
}

/// How long the whole wait may last: the shorter of `wait` and `lock_timeout`.
pub fn effective_wait(wait_micros: Option<i64>, lock_timeout_micros: Option<i64>) -> Option<i64> {
    match (wait_micros, lock_timeout_micros) {
        (Some(w), Some(l)) => Some(w.min(l)),
        (w, l) => w.or(l),
    }
}

/// Restores `lock_timeout`'s variable when dropped (also on error unwind).
struct LockTimeoutOverride {
    saved: i32,
}

impl Drop for LockTimeoutOverride {
    fn drop(&mut self) {
        // SAFETY: restoring the value we saved.
        unsafe { pg_sys::LockTimeout = self.saved };
    }
}

/// Take `lock` in `mode`, waiting no later than `deadline` (which already
/// accounts for `lock_timeout`); past it, fail with `timed_out()`.
fn lock_until(
    lock: &LockTag,
    mode: Mode,
    deadline: Option<i64>,
    timed_out: &dyn Fn() -> FlError,
) -> Result<(), FlError> {
    let Some(deadline) = deadline else {
        // No wait and no lock_timeout: wait as long as it takes.
        lock.lock(mode);
        return Ok(());
    };
    if lock.try_lock(mode) {
        return Ok(());
    }
    let left_ms = (deadline - now()) / 1000;
    if left_ms <= 0 {
        return Err(timed_out());
    }
    // SAFETY: LockTimeout is the lock_timeout GUC's variable (milliseconds,
    // 0 = none); the override is undone when `_restore` drops.
    let _restore = unsafe {
        let saved = pg_sys::LockTimeout;
        pg_sys::LockTimeout = left_ms.clamp(1, i32::MAX as i64) as i32;
        LockTimeoutOverride { saved }
    };
    lock_in_subtransaction(lock, mode).map_err(|()| timed_out())
}

/// Take the lock; `Err(())` if `lock_timeout` fired. The wait runs in a
/// subtransaction, as a PL/pgSQL exception block would, so that a timeout is
/// rolled back properly before we raise an error of our own, and any other
/// error leaves no subtransaction behind.
///
/// Once granted, the lock belongs to the subtransaction's parent resource
/// owner, not to the caller's (a portal's, in a plain SELECT), under which
/// `LockTag::unlock` gives locks back. So it is taken once more under the
/// caller's owner (at once: it is held) and the subtransaction's hold is given
/// back, leaving exactly what a plain `lock` would have left.
fn lock_in_subtransaction(lock: &LockTag, mode: Mode) -> Result<(), ()> {
    let lock = *lock;
    // SAFETY: the standard internal-subtransaction dance (see PL/pgSQL's
    // exec_stmt_block): remember the memory context and resource owner, and
    // restore both whichever way the subtransaction ends.
    unsafe {
        let context = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(context);
        let restore = move || {
            pg_sys::MemoryContextSwitchTo(context);
            pg_sys::CurrentResourceOwner = owner;
        };
        PgTryBuilder::new(move || {
            lock.lock(mode);
            pg_sys::ReleaseCurrentSubTransaction();
            restore();
            // Hand the hold over to the caller's resource owner.
            lock.lock(mode);
            pg_sys::CurrentResourceOwner = pg_sys::CurTransactionResourceOwner;
            lock.unlock(mode);
            restore();
            Ok(())
        })
        .catch_when(PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE, move |_| {
            restore();
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
            restore();
            Err(())
        })
        // Anything else (cancel, statement_timeout, a deadlock) ends the
        // wait too: roll the subtransaction back, then let the error abort
        // the caller's transaction as it would have without us.
        .catch_others(move |error| {
            restore();
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
            restore();
            error.rethrow()
        })
        .execute()
    }
}

#[cfg(test)]
mod tests {
    use super::effective_wait;

    #[test]
    fn lock_timeout_bounds_the_whole_wait_when_shorter() {
        assert_eq!(effective_wait(None, None), None);
        assert_eq!(effective_wait(Some(5), None), Some(5));
        assert_eq!(effective_wait(None, Some(3)), Some(3));
        assert_eq!(effective_wait(Some(5), Some(3)), Some(3));
        assert_eq!(effective_wait(Some(2), Some(3)), Some(2));
        assert_eq!(effective_wait(Some(0), Some(3)), Some(0));
    }
}
