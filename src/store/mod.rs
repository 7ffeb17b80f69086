//! Where lease state lives (docs/design.md, "Objects"): the tables
//! `fenced_lock_internal.lease_records` (one record per name) and
//! `fenced_lock_internal.lease_history` (one row per lease that has ended),
//! and the sequence `fenced_lock_internal.token_seq`.
//!
//! - `catalog`  finds the objects by name, once per backend, and forgets them on DDL
//! - `records`  reads records in the latest committed state, without SQL
//! - `history`  the history table's shape
//! - `heap`     raw heap and index access
//! - `writer`   the owner's write session (`Store`): every change goes through it
//!
//! Reads (`records`) go straight through an index with `SnapshotSelf`,
//! without SPI or a change of user. Writes (`writer`) run as the owner of the
//! lease table, in a security-restricted context.

mod catalog;
mod heap;
mod history;
mod records;
mod writer;

pub use catalog::register;

/// Lease changes need the catalog this library was built for: the
/// error to raise if it is not (reads work on 0.1.0's too).
pub fn check_catalog_writable() -> Result<(), crate::errors::FlError> {
    catalog::objects_for_writing().map(|_| ())
}

pub use history::Ending;
pub use records::{read, Lease};
#[cfg(any(test, feature = "pg_test"))]
pub use writer::history_inserted_directly;
pub use writer::{write_generation, Grant, Store};
