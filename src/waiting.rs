//! `fenced_lock_acquire`: wait for a lock, FIFO, asleep (SPEC §6).
//!
//! 1. One attempt as `fenced_lock_try_acquire` makes it (granted if the name is
//!    free and nobody is queued, or if the same holder asks again).
//! 2. Otherwise the waiter queues on the name's QUEUE advisory lock. PostgreSQL's
//!    lock manager keeps the queue: arrival order, asleep, cancellable,
//!    deadlock-checked. Waiters never queue on the FENCE key, so they never
//!    block the holder's guarded writes or its release.
//! 3. The holder of the QUEUE lock is the head waiter. It alone watches the
//!    lease: it sleeps on its latch until the lease's expiry instant (at most
//!    `RECHECK_MS`), and a release or force release sets its latch at once
//!    (found through the lock manager: whoever holds the QUEUE lock). When it
//!    gets the lease, its QUEUE lock goes at commit and the next waiter is head.
//!
//! No shared memory of its own, so nothing needs `shared_preload_libraries`.
//! `wait` and `lock_timeout` (whichever is shorter) bound every part of the
//! wait, lock-manager waits included; cancel and `statement_timeout` end it at
//! once and, being errors, leave no lease, queue place or lock behind.

use crate::errors::FlError;
use crate::keys::{Key, Mode};
use crate::lease::{attempt_acquire, AcquireRequest, Attempt};
use crate::store::{now, Store};
use pgrx::pg_sys;
use pgrx::{PgSqlErrorCode, PgTryBuilder};

/// The head re-reads the lease at least this often, whatever happens: a
/// safety net, not the wake-up mechanism.
const RECHECK_MS: i64 = 1_000;

/// `fenced_lock_acquire`: `wait` None waits until granted or cancelled.
pub fn acquire(req: &AcquireRequest, wait_micros: Option<i64>) -> Result<i64, FlError> {
    let start = now();
    let deadline =
        effective_wait(wait_micros, session_lock_timeout_micros()).map(|w| start.saturating_add(w));
    let timed_out = || FlError::wait_timeout(req.name, (now() - start) / 1000);

    {
        let store = Store::open()?;
        let first =
            attempt_acquire(&store, req, |fence| lock_until(fence, Mode::Exclusive, deadline, &timed_out))?;
        if let Attempt::Granted(token) = first {
            return Ok(token);
        }
    }
    if deadline.is_some_and(|d| now() >= d) {
        return Err(timed_out());
    }

    lock_until(&Key::queue(req.name), Mode::Exclusive, deadline, &timed_out)?;
    loop {
        // SAFETY: MyLatch is this backend's own latch.
        unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
        let attempt = {
            let store = Store::open()?;
            attempt_acquire(&store, req, |fence| lock_until(fence, Mode::Exclusive, deadline, &timed_out))?
        };
        let expires_at = match attempt {
            Attempt::Granted(token) => return Ok(token),
            Attempt::Busy { expires_at } => expires_at,
        };
        let now = now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(timed_out());
        }
        let mut sleep_ms = RECHECK_MS;
        if let Some(e) = expires_at {
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

/// Take `key` in `mode`, waiting no later than `deadline` (which already
/// accounts for `lock_timeout`); past it, fail with `timed_out()`.
fn lock_until(
    key: &Key,
    mode: Mode,
    deadline: Option<i64>,
    timed_out: &dyn Fn() -> FlError,
) -> Result<(), FlError> {
    let Some(deadline) = deadline else {
        // No wait and no lock_timeout: wait as long as it takes.
        key.lock(mode);
        return Ok(());
    };
    if key.try_lock(mode) {
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
    lock_catching_timeout(key, mode).map_err(|()| timed_out())
}

/// Take the lock; `Err(())` if `lock_timeout` fired. The lock manager has
/// cleaned up its wait before raising the timeout, and the caller goes on to
/// raise an error of its own, so nothing runs on a half-aborted state.
fn lock_catching_timeout(key: &Key, mode: Mode) -> Result<(), ()> {
    let key = *key;
    PgTryBuilder::new(move || {
        key.lock(mode);
        Ok(())
    })
    .catch_when(PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE, |_| Err(()))
    .execute()
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
