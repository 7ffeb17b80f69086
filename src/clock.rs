//! The one clock every lease decision reads (docs/design.md, "Words": time).

use pgrx::pg_sys;

/// The server's clock now (`clock_timestamp()`), never the transaction
/// start: microseconds since 2000-01-01, as PostgreSQL's `TimestampTz`.
pub fn now() -> i64 {
    // SAFETY: reads the system clock.
    unsafe { pg_sys::GetCurrentTimestamp() }
}
