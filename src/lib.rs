//! fenced_lock: leased named locks with fencing tokens, and a trigger that
//! makes PostgreSQL itself reject writes from a holder that lost its lease.
//! The design, its invariants and its lock protocol: docs/design.md.
//!
//! The house, top floor first. A module imports only from floors below its
//! own, never from its own floor or above, so nothing calls back up (and
//! `docs/design.md`, "The code", keeps the same map):
//!
//! 9. `lib` (this file: `_PG_init`, the transaction-end dispatch) and `api`
//!    (the SQL functions: one name, several names, elections, guards).
//! 8. `guard`: the `fenced_lock_guard()` trigger, what is wrong with a
//!    guard (the view, the event trigger), `fenced_lock_protect`.
//! 7. `waiting` (`fenced_lock_acquire` and `_all`: FIFO waiting without
//!    polling) and `fence` (the one check shared by the guard and
//!    `fenced_lock_assert`).
//! 6. `lease` (the state machine: every transition and its one exit, session
//!    end included; `lease/decide.rs` the pure decisions) and `views` (what
//!    the views call).
//! 5. `session`: the leases bound to this session and their session locks.
//! 4. `store` (the private tables: `catalog`, `records`, `history`, `heap`,
//!    and `writer`, the owner's write session) and `fmgr` (entering and
//!    leaving a C function, raising our SQLSTATEs).
//! 3. `token` (the token sequence and its failover epoch), `stats`
//!    (counters), `notify` (`NOTIFY fenced_lock`), `registry` (the shared
//!    waiter registry), `roles` (who may do what), `datum` (datums).
//! 2. `durability` (how durable a commit is), `settings` (the
//!    `fenced_lock.*` GUCs), `locktags` (the heavyweight locks), `mode`
//!    (lease modes and what fits beside what), `xact` (transaction
//!    helpers), `args` (argument checks).
//! 1. `errors` (the error type and SQLSTATEs), `template` (lock-name
//!    templates), `compat` (every difference between majors), `spi`,
//!    `guc_scope` (PostgreSQL settings for a scope), `relcache` (the one
//!    relcache callback), `clock`.
//!
//! SQL objects: `sql/fenced_lock.sql` (install) and `sql/fenced_lock--*--*.sql` (updates).

use pgrx::pg_sys;
use pgrx::prelude::*;

pgrx::pg_module_magic!();

mod api;
mod args;
mod clock;
mod compat;
mod datum;
mod durability;
mod errors;
mod fence;
mod fmgr;
mod guard;
mod guc_scope;
mod lease;
mod locktags;
mod mode;
mod notify;
mod registry;
mod relcache;
mod roles;
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
    store::register();
    guard::register();
    // SAFETY: called once, from _PG_init.
    unsafe {
        pg_sys::RegisterXactCallback(Some(on_xact_event), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(on_subxact_event), std::ptr::null_mut());
    }
}

/// Transaction end, for every module that keeps something per transaction.
///
/// The order matters, as in PostgreSQL's own `CommitTransaction`:
/// 1. `durability` first, at pre-commit, while settings can still change
///    how this very commit is flushed; at the end it forgets its marks
///    before anything else can start a new lease change.
/// 2. `session` next: on commit it gives back the session locks of leases
///    that ended, on abort those of grants rolled back, so that the lock
///    table agrees with the records before anyone counts or looks.
/// 3. `stats` adds what committed (a rolled-back grant never happened).
/// 4. `registry` last, on abort only: a waiter whose wait ended in an error
///    leaves the waiter view (a granted waiter left it already).
#[pg_guard]
unsafe extern "C-unwind" fn on_xact_event(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    match event {
        pg_sys::XactEvent::XACT_EVENT_PRE_COMMIT => durability::at_pre_commit(),
        pg_sys::XactEvent::XACT_EVENT_COMMIT | pg_sys::XactEvent::XACT_EVENT_PREPARE => {
            durability::at_transaction_end();
            session::at_transaction_end(true);
            stats::at_transaction_end(true);
        }
        pg_sys::XactEvent::XACT_EVENT_ABORT => {
            durability::at_transaction_end();
            session::at_transaction_end(false);
            stats::at_transaction_end(false);
            registry::leave();
        }
        pg_sys::XactEvent::XACT_EVENT_PARALLEL_COMMIT | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT => {
            durability::at_transaction_end();
        }
        _ => {}
    }
}

/// Subtransaction abort: what it did is undone, so each module drops what it
/// noted inside it, in the same order as at transaction end (the fence's
/// remembered checks first: the name locks they relied on may be gone).
#[pg_guard]
unsafe extern "C-unwind" fn on_subxact_event(
    event: pg_sys::SubXactEvent::Type,
    my_subid: pg_sys::SubTransactionId,
    _parent_subid: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        fence::at_subtransaction_abort();
        session::at_subtransaction_abort(my_subid);
        stats::at_subtransaction_abort(my_subid);
        registry::leave();
    }
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

    /// Each client library's version follows the extension's (clients/README.md).
    #[test]
    fn client_libraries_carry_the_extension_version() {
        let version = env!("CARGO_PKG_VERSION");
        for (file, text, line) in [
            (
                "clients/python/pyproject.toml",
                include_str!("../clients/python/pyproject.toml"),
                format!("version = \"{version}\""),
            ),
            (
                "clients/rust/Cargo.toml",
                include_str!("../clients/rust/Cargo.toml"),
                format!("version = \"{version}\""),
            ),
            ("clients/java/build.sh", include_str!("../clients/java/build.sh"), format!("VERSION={version}")),
            (
                "clients/go/locker.go",
                include_str!("../clients/go/locker.go"),
                format!("const Version = \"{version}\""),
            ),
            (
                "clients/node/package.json",
                include_str!("../clients/node/package.json"),
                format!("\"version\": \"{version}\""),
            ),
        ] {
            assert!(
                text.lines().any(|l| l.trim() == line || l.trim() == format!("{line},")),
                "{file} does not say {line}"
            );
        }
    }
}

#[cfg(any(test, feature = "pg_test"))]
mod pg_tests;

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
