//! The lease state machine: acquire, renew, release, force release, expiry
//! and session end, in every mode (docs/design.md, "Transitions" and
//! "Modes"). Every change of a lease record happens here (`grant.rs`: the
//! grants; `owner.rs`: what a holder or an operator does to a live lease;
//! `session_end.rs`: the end of a session), and every change leaves
//! through one exit (`after`): session bookkeeping, durability, counters,
//! NOTIFY and the wake-up.
//!
//! The locks (docs/design.md, "Lock protocol"): a grant decides under the
//! name lock, reading what is committed and what is in flight, and gives the
//! lock back as soon as its record is written; everything else is ordered by
//! the lease lock of the one lease it touches, kept until commit.

mod decide;
mod grant;
mod owner;
mod session_end;

pub use decide::{Busy, Conflict, State};
pub use grant::{attempt_acquire, try_acquire, try_acquire_all, AcquireRequest, Attempt};
pub use owner::{force_release, leader, proclaim, release, release_all, renew, renew_all, validate};

use crate::errors::{quote_name, sqlstate, FlError};
use crate::locktags::LockTag;
use crate::mode::LeaseMode;
use crate::stats::Event;
use crate::store::{record, Ending, Lease};
use crate::{durability, notify, session, stats};

/// The state of `lease` at `now`; probes its session only when that matters.
pub fn state_of(lease: &Lease, now: i64) -> State {
    decide::decide_state(lease, now, || session::alive(lease))
}

/// The committed record of lease `token` of `name`, with its state at `now`.
fn current(name: &str, token: i64, now: i64) -> Result<Option<(Lease, State)>, FlError> {
    Ok(record(name, token)?.map(|l| {
        let s = state_of(&l, now);
        (l, s)
    }))
}

// ---- the one exit ----------------------------------------------------------

/// A change this transaction made to a lease, for `after`.
enum Change<'a> {
    /// A new lease.
    Granted { name: &'a str, token: i64, mode: LeaseMode, session_bound: bool },
    /// The same holder or session asked again: same token, later expiry.
    Extended { mode: LeaseMode },
    /// `fenced_lock_renew`; `shortened`: the expiry moved earlier.
    Renewed { name: &'a str, mode: LeaseMode, shortened: bool },
    /// `fenced_lock_proclaim`: the leader published a value.
    Proclaimed { name: &'a str, token: i64 },
    /// The lease ended. `taken_over`: by a grant of the name in this very
    /// transaction, which is the next holder: there is nobody to wake.
    Ended { lease: &'a Lease, ending: Ending, taken_over: bool },
}

/// How each ending is counted.
fn counted(ending: Ending) -> Event {
    match ending {
        Ending::Release => Event::Release,
        Ending::Expiry => Event::Expiry,
        Ending::ForceRelease => Event::ForceRelease,
        Ending::SessionEnd => Event::SessionEnd,
    }
}

/// Everything that follows a change, in one place. Counters and NOTIFY take
/// effect only if the transaction commits; the wake-up is at once (the head
/// waiter then waits for this transaction to end).
fn after(change: Change) {
    match change {
        Change::Granted { name, token, mode, session_bound } => {
            session::granted(token);
            if session_bound {
                session::bind(name, token);
                session_end::arm();
            }
            durability::must_flush();
            stats::at_commit(Event::Grant, Some(mode));
            notify::event(name, "grant", token, mode);
        }
        Change::Extended { mode } => {
            durability::must_flush();
            stats::at_commit(Event::Renewal, Some(mode));
        }
        Change::Renewed { name, mode, shortened } => {
            durability::must_flush();
            stats::at_commit(Event::Renewal, Some(mode));
            if shortened {
                LockTag::queue(name).wake_holders();
            }
        }
        Change::Proclaimed { name, token } => {
            durability::must_flush();
            notify::event(name, "proclaim", token, LeaseMode::Exclusive);
        }
        Change::Ended { lease, ending, taken_over } => {
            session::ended(lease.token);
            // Alone in its transaction, an end may be acknowledged before the
            // flush; beside a grant, the grant's flush wins (durability.rs).
            durability::released();
            stats::at_commit(counted(ending), Some(lease.mode));
            notify::event(&lease.name, ending.as_str(), lease.token, lease.mode);
            if !taken_over {
                LockTag::queue(&lease.name).wake_holders();
            }
        }
    }
}

// ---- errors ------------------------------------------------------------------

/// `FL003`: the request can never be granted as asked.
pub fn conflict_error(function: &str, name: &str, asked: LeaseMode, conflict: Conflict) -> FlError {
    let lock = quote_name(name);
    let asked = describe(asked);
    let (message, hint) = match conflict {
        Conflict::Mode { live } => (
            format!("{function}: lock {lock} is held as {}; {asked} cannot be granted", describe(live)),
            "The permit count and the mode belong to a name while any of its leases is live: ask for the same, or wait until they have all ended.".to_string(),
        ),
        Conflict::OwnOtherMode { token, live } => (
            format!(
                "{function}: the same holder or session already holds lease {token} of lock {lock} as {}; {asked} is not granted on top of it",
                describe(live)
            ),
            "Upgrading a shared lease to an exclusive one would wait for itself. Release the lease first; to change its mode atomically, release it and acquire the new mode in one transaction.".to_string(),
        ),
        Conflict::OwnLease { token } => (
            format!(
                "{function}: lock {lock} could only be granted after lease {token}, which this very session holds, has ended"
            ),
            format!("Release lease {token} first, or pass the holder it was acquired with to get the same token back."),
        ),
    };
    FlError::new(sqlstate::MODE_CONFLICT, message).hint(hint)
}

fn describe(mode: LeaseMode) -> String {
    match mode {
        LeaseMode::Exclusive => "an exclusive lease".to_string(),
        LeaseMode::Shared => "a shared lease".to_string(),
        LeaseMode::Permit(n) => format!("a permit of {n}"),
    }
}
