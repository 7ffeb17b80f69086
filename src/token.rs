//! Fencing tokens: one sequence, with the timeline as an epoch in the high
//! bits (docs/design.md, "Tokens").
//!
//! Format: `token = epoch << 47 | counter`, where `epoch` is at least the
//! server's current timeline ID minus one. On timeline 1 (a server that was
//! never promoted) tokens are plain sequence values 1, 2, 3, ...
//!
//! Why: after an asynchronous failover the promoted standby's sequence may be
//! behind what the old primary handed out. A promotion always moves to a higher
//! timeline, so the first grant after it jumps the sequence to the new epoch,
//! past every token the old primary could have issued on its timeline (fewer
//! than 2^47 per timeline). The sequence itself is WAL-logged and dumped, so
//! tokens also keep growing across crashes, `pg_dump`/restore and `pg_upgrade`
//! (which keep the sequence even where they reset the timeline).

use crate::errors::FlError;
use crate::locktags::{LockTag, Mode};
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;

pub const EPOCH_SHIFT: u32 = 47;

/// The epoch a token belongs to.
pub fn epoch_of(token: i64) -> i64 {
    token >> EPOCH_SHIFT
}

/// The lowest token of an epoch's range, minus one (the value to `setval` to).
pub fn epoch_floor(epoch: i64) -> i64 {
    epoch << EPOCH_SHIFT
}

/// The epoch tokens must be in on `timeline`.
pub fn epoch_for_timeline(timeline: u32) -> i64 {
    (timeline as i64 - 1).max(0)
}

// Called directly or through DirectFunctionCall; pgrx's bindings of these
// are missing or Rust wrappers, which fmgr cannot take as function pointers.
unsafe extern "C-unwind" {
    fn nextval_internal(relid: pg_sys::Oid, check_permissions: bool) -> i64;
    fn setval_oid(fcinfo: pg_sys::FunctionCallInfo) -> Datum;
}

fn nextval(seq: pg_sys::Oid) -> i64 {
    // SAFETY: the sequence exists (looked up by the caller). The library
    // calls this only for a grant its caller may make; the sequence's own
    // privileges (nobody but its owner has any) keep everyone else away.
    unsafe { nextval_internal(seq, false) }
}

/// A new token, greater than every token handed out before, even across a
/// failover (docs/design.md, "Tokens"). Callers have checked
/// `xact::check_writable`. `as_owner` runs its argument as the sequence's
/// owner: the rare jump to a new epoch goes through `setval`, which checks
/// privileges.
pub fn next_token(seq: pg_sys::Oid, as_owner: impl FnOnce(&dyn Fn())) -> Result<i64, FlError> {
    crate::xact::check_writable("fenced_lock")?;
    let epoch = epoch_for_timeline(crate::compat::insert_timeline());
    let token = nextval(seq);
    if epoch_of(token) >= epoch {
        return Ok(token);
    }
    // First grant on a new timeline: jump the sequence once. The epoch lock
    // keeps two backends from both setting it (the second would move it
    // back); setval is not transactional, so the lock can go right after.
    let epoch_lock = LockTag::epoch();
    epoch_lock.lock(Mode::Exclusive);
    let mut token = nextval(seq);
    if epoch_of(token) < epoch {
        as_owner(&|| {
            // SAFETY: setval(regclass, bigint) of our sequence, run as its owner.
            unsafe {
                pg_sys::DirectFunctionCall2Coll(
                    Some(setval_oid),
                    pg_sys::InvalidOid,
                    Datum::from(seq),
                    Datum::from(epoch_floor(epoch)),
                );
            }
        });
        token = nextval(seq);
    }
    epoch_lock.unlock(Mode::Exclusive);
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_one_tokens_are_plain_counters() {
        assert_eq!(epoch_for_timeline(1), 0);
        assert_eq!(epoch_of(1), 0);
        assert_eq!(epoch_of((1 << 47) - 1), 0);
    }

    #[test]
    fn every_token_of_a_later_epoch_exceeds_every_token_of_an_earlier_one() {
        for tl in 1..100u32 {
            let e = epoch_for_timeline(tl);
            let last_of_this = epoch_floor(e + 1) - 1;
            let first_of_next = epoch_floor(epoch_for_timeline(tl + 1)) + 1;
            assert!(first_of_next > last_of_this);
            assert_eq!(epoch_of(first_of_next), e + 1);
        }
    }

    #[test]
    fn the_largest_timeline_still_fits_in_a_positive_bigint() {
        let e = epoch_for_timeline(65_536);
        assert!(epoch_floor(e) + ((1 << 47) - 1) > 0);
    }
}
