//! Where lease state lives (docs/design.md, "Objects"): the tables
//! `fenced_lock_internal.granted_leases` (one record per lease granted and
//! not yet cleaned up, keyed by (name, token)) and
//! `fenced_lock_internal.lease_history` (one row per lease that has ended),
//! and the sequence `fenced_lock_internal.token_seq`.
//!
//! - `catalog`  finds the objects by name, once per backend, and forgets them on DDL
//! - `records`  reads records, without SQL
//! - `history`  the history table's shape
//! - `heap`     raw heap and index access
//! - `writer`   the write session (`Store`): every change goes through it

mod catalog;
mod heap;
mod history;
mod records;
mod writer;

pub use catalog::register;
pub use heap::{InProgress, Visibility};
pub use history::Ending;
pub use records::{record, Lease, Seen};
#[cfg(any(test, feature = "pg_test"))]
pub use writer::written_directly;
pub use writer::{write_generation, Grant, Store};

use crate::errors::FlError;

/// Lease changes need the catalog this library was built for: the error to
/// raise if it is not (reads work on older ones too).
pub fn check_catalog_writable() -> Result<(), FlError> {
    catalog::objects_for_writing().map(|_| ())
}

/// Every record of `name`, seen as `visibility` says (reads work on older
/// catalogs too), read under the name lock in `Share` mode, so that no
/// update of one of them runs beside the scan (`Store::extend`: it could
/// hide a live lease from it).
pub fn records_of(name: &str, visibility: Visibility) -> Result<Vec<Seen>, FlError> {
    let lock = crate::locktags::LockTag::name(name);
    lock.lock(crate::locktags::Mode::Shared);
    let seen = records_of_under_name_lock(name, visibility);
    lock.unlock(crate::locktags::Mode::Shared);
    seen
}

/// `records_of` for a caller that holds the name lock in `Exclusive` mode
/// (a grant deciding).
pub fn records_of_under_name_lock(name: &str, visibility: Visibility) -> Result<Vec<Seen>, FlError> {
    Ok(records::records_of(&catalog::objects()?, name, visibility))
}
