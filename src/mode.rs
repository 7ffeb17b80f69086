//! The mode of a lease (docs/design.md, "Modes"): exclusive, shared, or one
//! permit of a counting semaphore. Pure logic, no PostgreSQL needed.
//!
//! Stored as two columns, `shared` and `permits`: an exclusive lease is
//! (false, 1), a shared lease (true, 1), a permit of a semaphore of N
//! (false, N) with N >= 2. `permits => 1` is exactly today's exclusive lease.

use crate::errors::{quote_name, sqlstate, FlError};

/// The largest permit count a semaphore may have: every permit is a record
/// that each grant of the name reads, so the count stays modest.
pub const MAX_PERMITS: i32 = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseMode {
    /// One holder at a time (a semaphore of one).
    Exclusive,
    /// Any number of shared holders together, and no exclusive one.
    Shared,
    /// Up to N holders (N >= 2), each exclusive to itself.
    Permit(i32),
}

impl LeaseMode {
    /// The mode a request asks for with `shared` and `permits`, or the
    /// error for an impossible combination (22023).
    pub fn requested(function: &str, name: &str, shared: bool, permits: i32) -> Result<LeaseMode, FlError> {
        if !(1..=MAX_PERMITS).contains(&permits) {
            return Err(FlError::new(
                sqlstate::INVALID_PARAMETER_VALUE,
                format!(
                    "{function}: permits {permits} for lock {} is not between 1 and {MAX_PERMITS}",
                    quote_name(name)
                ),
            )
            .hint("Pass permits => N with N >= 1 (1, the default, is an exclusive lease)."));
        }
        match (shared, permits) {
            (true, 1) => Ok(LeaseMode::Shared),
            (true, _) => Err(FlError::new(
                sqlstate::INVALID_PARAMETER_VALUE,
                format!(
                    "{function}: a shared lease of lock {} cannot have permits {permits}",
                    quote_name(name)
                ),
            )
            .hint("A shared lease has no count: pass either shared => true or permits => N, not both.")),
            (false, 1) => Ok(LeaseMode::Exclusive),
            (false, n) => Ok(LeaseMode::Permit(n)),
        }
    }

    /// The mode of a record with these stored columns.
    pub fn stored(shared: bool, permits: i32) -> LeaseMode {
        match (shared, permits) {
            (true, _) => LeaseMode::Shared,
            (false, n) if n >= 2 => LeaseMode::Permit(n),
            _ => LeaseMode::Exclusive,
        }
    }

    /// The `shared` column.
    pub fn shared(self) -> bool {
        self == LeaseMode::Shared
    }

    /// The `permits` column (1 for exclusive and shared leases).
    pub fn permits(self) -> i32 {
        match self {
            LeaseMode::Permit(n) => n,
            _ => 1,
        }
    }

    /// How many leases of this mode may be live together; None: any number.
    pub fn capacity(self) -> Option<i32> {
        match self {
            LeaseMode::Shared => None,
            other => Some(other.permits()),
        }
    }

    /// As the views, the history and NOTIFY show it.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseMode::Exclusive => "exclusive",
            LeaseMode::Shared => "shared",
            LeaseMode::Permit(_) => "permit",
        }
    }
}

/// How a request of mode `asked` meets the live leases of a name, whose
/// mode is `live` (all live leases of a name share one mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// They may be live together (shared with shared, permits of one count
    /// while there are fewer than the count).
    Together,
    /// Not now: the request waits until the live leases end (exclusive
    /// against anything; shared against exclusive; a full semaphore).
    Wait,
    /// Never as asked: another count, or shared against a semaphore.
    Conflict,
}

/// `live_count` leases of mode `live` are live.
pub fn fit(asked: LeaseMode, live: LeaseMode, live_count: usize) -> Fit {
    use LeaseMode::*;
    match (asked, live) {
        (Shared, Shared) => Fit::Together,
        (Shared, Exclusive) | (Exclusive, Shared) | (Exclusive, Exclusive) => Fit::Wait,
        (Permit(n), Permit(m)) if n == m => {
            if live_count < n as usize {
                Fit::Together
            } else {
                Fit::Wait
            }
        }
        // The count belongs to the name while any of its leases is live.
        (Permit(_), _) | (_, Permit(_)) => Fit::Conflict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LeaseMode::*;

    #[test]
    fn permits_of_one_are_an_exclusive_lease_and_shared_has_no_count() {
        assert_eq!(LeaseMode::requested("f", "n", false, 1), Ok(Exclusive));
        assert_eq!(LeaseMode::requested("f", "n", true, 1), Ok(Shared));
        assert_eq!(LeaseMode::requested("f", "n", false, 8), Ok(Permit(8)));
        for bad in [0, -1, i32::MIN, MAX_PERMITS + 1, i32::MAX] {
            assert_eq!(LeaseMode::requested("f", "n", false, bad).unwrap_err().sqlstate, "22023", "{bad}");
        }
        assert_eq!(LeaseMode::requested("f", "n", true, 2).unwrap_err().sqlstate, "22023");
    }

    #[test]
    fn stored_columns_round_trip() {
        for m in [Exclusive, Shared, Permit(2), Permit(MAX_PERMITS)] {
            assert_eq!(LeaseMode::stored(m.shared(), m.permits()), m);
        }
    }

    #[test]
    fn an_exclusive_lease_excludes_every_shared_lease_and_the_other_way_round() {
        assert_eq!(fit(Exclusive, Shared, 1), Fit::Wait);
        assert_eq!(fit(Shared, Exclusive, 1), Fit::Wait);
        assert_eq!(fit(Exclusive, Exclusive, 1), Fit::Wait);
        assert_eq!(fit(Shared, Shared, 1000), Fit::Together);
    }

    #[test]
    fn a_semaphore_admits_up_to_its_count_and_no_other_count_or_mode() {
        assert_eq!(fit(Permit(3), Permit(3), 2), Fit::Together);
        assert_eq!(fit(Permit(3), Permit(3), 3), Fit::Wait);
        assert_eq!(fit(Permit(3), Permit(4), 1), Fit::Conflict);
        assert_eq!(fit(Permit(3), Exclusive, 1), Fit::Conflict);
        assert_eq!(fit(Exclusive, Permit(3), 1), Fit::Conflict);
        assert_eq!(fit(Shared, Permit(3), 1), Fit::Conflict);
        assert_eq!(fit(Permit(3), Shared, 1), Fit::Conflict);
    }
}
