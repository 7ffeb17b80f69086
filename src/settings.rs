//! The extension's settings (GUCs), all superuser-only (`PGC_SUSET`): a role
//! that could raise its own ttl limit, name itself operator, drop the history
//! or broadcast other roles' leases would make them meaningless. On 15 and
//! later PostgreSQL also refuses, when the library loads, a value an ordinary
//! role set for them before it was loaded.

use crate::errors::{sqlstate, FlError};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use std::cell::Cell;
use std::ffi::{CStr, CString};

/// `fenced_lock.max_ttl`, in seconds: the longest ttl a lease may ask for.
pub static MAX_TTL: GucSetting<i32> = GucSetting::<i32>::new(86_400);

/// `fenced_lock.operator_role`: members of this role may force release.
pub static OPERATOR_ROLE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// `fenced_lock.history_retention`, in seconds: how long ended leases stay in
/// `fenced_lock_history`; 0 keeps no history at all.
pub static HISTORY_RETENTION: GucSetting<i32> = GucSetting::<i32>::new(86_400);

/// `fenced_lock.notify`: send `NOTIFY fenced_lock` for every committed change.
pub static NOTIFY: GucSetting<bool> = GucSetting::<bool>::new(false);

const MAX_TTL_NAME: &CStr = c"fenced_lock.max_ttl";

/// Every setting the extension defines (docs/reference.md lists them all).
#[cfg(test)]
pub const NAMES: [&str; 4] = [
    "fenced_lock.max_ttl",
    "fenced_lock.operator_role",
    "fenced_lock.history_retention",
    "fenced_lock.notify",
];

thread_local! {
    /// The server's value of max_ttl was lost in this session (see `register`).
    static MAX_TTL_UNTRUSTED: Cell<bool> = const { Cell::new(false) };
}

pub fn register() {
    // When the library is loaded on first use (not preloaded), values given
    // before that are held by a placeholder and re-checked now. If the value
    // in force when the session started (from postgresql.conf, ALTER
    // SYSTEM/DATABASE/ROLE, or the client's connection options) is refused
    // because a role without the right set it, PostgreSQL falls back to the
    // built-in default, not to the administrator's lower value. Detect that and
    // refuse lease requests in this session rather than grant longer leases
    // than allowed.
    let had_startup_value =
        crate::compat::guc_reset_source(MAX_TTL_NAME).is_some_and(|s| s != pg_sys::GucSource::PGC_S_DEFAULT);
    GucRegistry::define_int_guc(
        MAX_TTL_NAME,
        c"Longest ttl a fenced_lock lease may be granted or renewed for.",
        c"A ttl above it is rejected with SQLSTATE 22023. Superuser only.",
        &MAX_TTL,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_string_guc(
        c"fenced_lock.operator_role",
        c"Role whose members may call fenced_lock_force_release.",
        c"Superusers always may. Empty: superusers only. Superuser only.",
        &OPERATOR_ROLE,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"fenced_lock.history_retention",
        c"How long ended leases stay in fenced_lock_history.",
        c"0 keeps no history. Superuser only.",
        &HISTORY_RETENTION,
        0,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_bool_guc(
        c"fenced_lock.notify",
        c"Send NOTIFY fenced_lock with a JSON payload for every committed lease change.",
        c"Superuser only.",
        &NOTIFY,
        GucContext::Suset,
        GucFlags::default(),
    );
    let lost_startup_value =
        crate::compat::guc_reset_source(MAX_TTL_NAME) == Some(pg_sys::GucSource::PGC_S_DEFAULT);
    MAX_TTL_UNTRUSTED.with(|u| u.set(had_startup_value && lost_startup_value));
    crate::compat::reserve_guc_prefix(c"fenced_lock");
}

/// `fenced_lock.max_ttl` in seconds, unless this session lost the server's value.
pub fn max_ttl_seconds(function: &str) -> Result<i64, FlError> {
    if MAX_TTL_UNTRUSTED.with(|u| u.get()) {
        return Err(FlError::new(
            sqlstate::INSUFFICIENT_PRIVILEGE,
            format!(
                "{function}: fenced_lock.max_ttl was set for this session by a role that may not set it, and the server's value was lost"
            ),
        )
        .hint("Reconnect without setting fenced_lock.max_ttl (for example in PGOPTIONS or the connection options), or add fenced_lock to shared_preload_libraries."));
    }
    Ok(MAX_TTL.get() as i64)
}

/// `fenced_lock.history_retention` in seconds.
pub fn history_retention_seconds() -> i64 {
    HISTORY_RETENTION.get() as i64
}

/// `fenced_lock.notify`.
pub fn notify() -> bool {
    NOTIFY.get()
}

/// `fenced_lock.operator_role`, if set (`roles.rs` decides what it allows).
pub fn operator_role() -> Option<CString> {
    OPERATOR_ROLE.get()
}
