//! The extension's settings (GUCs). Both are superuser-only (`PGC_SUSET`): a
//! role that could raise its own ttl limit or name itself operator would make
//! them meaningless. PostgreSQL 15 also refuses, when the library loads, a
//! value an ordinary role set for them before it was loaded.

use crate::errors::FlError;
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use std::cell::Cell;
use std::ffi::{CStr, CString};

/// `fenced_lock.max_ttl`, in seconds: the longest ttl a lease may ask for.
pub static MAX_TTL: GucSetting<i32> = GucSetting::<i32>::new(86_400);

/// `fenced_lock.operator_role`: members of this role may force release.
pub static OPERATOR_ROLE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

const MAX_TTL_NAME: &CStr = c"fenced_lock.max_ttl";

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
    let had_startup_value = reset_source(MAX_TTL_NAME).is_some_and(|s| s != pg_sys::GucSource::PGC_S_DEFAULT);
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
    let lost_startup_value = reset_source(MAX_TTL_NAME) == Some(pg_sys::GucSource::PGC_S_DEFAULT);
    MAX_TTL_UNTRUSTED.with(|u| u.set(had_startup_value && lost_startup_value));
    // SAFETY: called from _PG_init; reserves the prefix so typos are errors.
    unsafe { pg_sys::MarkGUCPrefixReserved(c"fenced_lock".as_ptr()) };
}

/// The `reset_source` of the setting (or placeholder) called `name`.
fn reset_source(name: &CStr) -> Option<pg_sys::GucSource::Type> {
    // SAFETY: get_guc_variables returns the backend's array of
    // GetNumConfigOptions() valid entries, placeholders included.
    unsafe {
        let vars = pg_sys::get_guc_variables();
        let n = pg_sys::GetNumConfigOptions() as usize;
        (0..n).map(|i| *vars.add(i)).find_map(|v| {
            (CStr::from_ptr((*v).name).to_bytes().eq_ignore_ascii_case(name.to_bytes()))
                .then(|| (*v).reset_source)
        })
    }
}

/// `fenced_lock.max_ttl` in seconds, unless this session lost the server's value.
pub fn max_ttl_seconds(function: &str) -> Result<i64, FlError> {
    if MAX_TTL_UNTRUSTED.with(|u| u.get()) {
        return Err(FlError::max_ttl_untrusted(function));
    }
    Ok(MAX_TTL.get() as i64)
}

/// Is `role` allowed to force release: a superuser, or a member of the
/// operator role (when one is set and exists)?
pub fn is_operator(role: pg_sys::Oid) -> bool {
    // SAFETY: plain catalog lookups.
    unsafe {
        if pg_sys::superuser_arg(role) {
            return true;
        }
        match OPERATOR_ROLE.get() {
            Some(name) if !name.as_bytes().is_empty() => {
                let op = pg_sys::get_role_oid(name.as_ptr(), true);
                op != pg_sys::InvalidOid && pg_sys::has_privs_of_role(role, op)
            }
            _ => false,
        }
    }
}
