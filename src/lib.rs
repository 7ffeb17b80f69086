//! fenced_lock: leased named locks with fencing tokens, and a trigger that
//! makes PostgreSQL itself reject writes from a holder that lost its lease.
//! The design, its invariants and its lock protocol: docs/design.md.
//!
//! Where things live:
//! - `lease`      the lease state machine: acquire, renew, release, expiry, session end
//! - `fence`      the one check shared by the guard and `fenced_lock_assert`
//! - `guard`      the `fenced_lock_guard()` trigger
//! - `template`   lock-name templates (`inventory:{item_id}`)
//! - `waiting`    `fenced_lock_acquire`: FIFO waiting without polling
//! - `session`    session-bound leases
//! - `store`      the private lease and history tables, accessed as their owner
//! - `locktags`   the heavyweight locks that order everything on a name
//! - `token`      the token sequence and its failover epoch
//! - `durability` how durable the commit of each lease change is
//! - `registry`   the shared waiter registry behind `fenced_lock_waiters`
//! - `stats`      counters behind `fenced_lock_stats`
//! - `notify`     `NOTIFY fenced_lock` on every committed change
//! - `xact`       transaction-end callbacks
//! - `errors`     the error type and SQLSTATEs; `args` argument checks
//! - `settings`   the `fenced_lock.*` GUCs
//! - `compat`     every difference between PostgreSQL majors
//! - `api`, `views`, `fmgr`, `datum`, `spi`: the SQL boundary
//!
//! SQL objects: `sql/fenced_lock.sql` (install) and `sql/fenced_lock--*--*.sql` (updates).

use pgrx::prelude::*;

pgrx::pg_module_magic!();

mod api;
mod args;
mod compat;
mod datum;
mod durability;
mod errors;
mod fence;
mod fmgr;
mod guard;
mod lease;
mod locktags;
mod notify;
mod registry;
mod session;
mod settings;
mod spi;
mod stats;
mod store;
mod template;
mod token;
mod views;
mod waiting;
mod xact;

extension_sql_file!("../sql/fenced_lock.sql", name = "fenced_lock_objects", bootstrap);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::register();
    stats::register();
    xact::register();
    store::register();
    guard::register();
}

#[cfg(test)]
mod docs_tests {
    /// docs/reference.md documents every function, view and setting the
    /// extension defines (the SQLSTATEs are checked in errors.rs).
    #[test]
    fn reference_documents_every_function_view_and_setting() {
        let reference = include_str!("../docs/reference.md");
        let sql = include_str!("../sql/fenced_lock.sql");
        let defined = sql.lines().filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix("CREATE FUNCTION ").or_else(|| l.strip_prefix("CREATE VIEW "))?;
            let name = rest.split(['(', ' ']).next()?;
            (!name.starts_with("fenced_lock_internal.")).then_some(name)
        });
        let mut count = 0;
        for name in defined.chain(crate::settings::NAMES) {
            count += 1;
            assert!(reference.contains(&format!("`{name}")), "docs/reference.md does not document {name}");
        }
        assert!(count >= 16, "found only {count} objects in sql/fenced_lock.sql");
    }

    /// The release files name this version, and an update path leads to it
    /// from 0.1.0 through sql/fenced_lock--A--B.sql scripts.
    #[test]
    fn release_files_agree_on_the_version_and_updates_reach_it() {
        let version = env!("CARGO_PKG_VERSION");
        assert!(include_str!("../META.json").contains(&format!("\"version\": \"{version}\"")));
        assert!(include_str!("../CHANGELOG.md").contains(&format!("## {version} ")));
        let scripts: Vec<(String, String)> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/sql"))
            .unwrap()
            .filter_map(|e| {
                let name = e.unwrap().file_name().into_string().unwrap();
                let steps = name.strip_prefix("fenced_lock--")?.strip_suffix(".sql")?.to_string();
                let (from, to) = steps.split_once("--")?;
                Some((from.to_string(), to.to_string()))
            })
            .collect();
        let mut at = "0.1.0".to_string();
        while at != version {
            let next =
                scripts.iter().find(|(from, _)| *from == at).unwrap_or_else(|| panic!("no update from {at}"));
            at = next.1.clone();
        }
    }
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
