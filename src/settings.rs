//! The extension's settings (GUCs). Both are superuser-only (`PGC_SUSET`): a
//! role that could raise its own ttl limit or name itself operator would make
//! them meaningless. PostgreSQL 15 also refuses, when the library loads, a
//! value an ordinary role set for them before it was loaded.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use std::ffi::CString;

/// `fenced_lock.max_ttl`, in seconds: the longest ttl a lease may ask for.
pub static MAX_TTL: GucSetting<i32> = GucSetting::<i32>::new(86_400);

/// `fenced_lock.operator_role`: members of this role may force release.
pub static OPERATOR_ROLE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

pub fn register() {
    GucRegistry::define_int_guc(
        c"fenced_lock.max_ttl",
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
    // SAFETY: called from _PG_init; reserves the prefix so typos are errors.
    unsafe { pg_sys::MarkGUCPrefixReserved(c"fenced_lock".as_ptr()) };
}

pub fn max_ttl_seconds() -> i64 {
    MAX_TTL.get() as i64
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
