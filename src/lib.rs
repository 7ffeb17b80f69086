//! fenced_lock: leased named locks with fencing tokens, and a trigger that
//! makes PostgreSQL itself reject writes from a holder that lost its lease.
//!
//! Where things live:
//! - `lease`      the lease state machine (acquire, renew, release, expiry)
//! - `fence`      the one check shared by the guard and `fenced_lock_assert`
//! - `guard`      the `fenced_lock_guard()` trigger
//! - `template`   lock-name templates (`inventory:{item_id}`)
//! - `waiting`    `fenced_lock_acquire`: FIFO waiting without polling
//! - `store`      the private lease table, accessed as its owner
//! - `keys`       the advisory locks that order everything on a name
//! - `token`      the token sequence and its failover epoch
//! - `durability` forcing a durable commit for lease transitions
//! - `errors`     every SQLSTATE and message
//! - `args`       argument validation
//! - `settings`   `fenced_lock.max_ttl`, `fenced_lock.operator_role`
//! - `api`, `sqlfn`, `spi`: the SQL boundary
//!
//! SQL objects: `sql/fenced_lock.sql`.

use pgrx::prelude::*;

pgrx::pg_module_magic!();

pub mod api;
pub mod args;
pub mod durability;
pub mod errors;
pub mod fence;
pub mod guard;
pub mod keys;
pub mod lease;
pub mod settings;
pub mod spi;
#[macro_use]
pub mod sqlfn;
pub mod store;
pub mod template;
pub mod token;
pub mod waiting;

extension_sql_file!("../sql/fenced_lock.sql", name = "fenced_lock_objects", bootstrap);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::register();
    durability::register();
    store::register();
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    include!("pg_tests.rs");
}

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
