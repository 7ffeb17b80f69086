//! Who is calling, and who may do what for whom (docs/design.md, "Security").
//! Every role check of the library is here.

use crate::errors::{quote_name, sqlstate, FlError};
use pgrx::pg_sys;
use std::ffi::CStr;

/// The role calling us (before any switch to the owner of the lease table).
pub fn current_role() -> pg_sys::Oid {
    // SAFETY: plain accessor.
    unsafe { pg_sys::GetUserId() }
}

/// A role's name, or its OID as text for a dropped role.
pub fn role_name(role: pg_sys::Oid) -> String {
    // SAFETY: noerr=true returns NULL for a dropped role.
    unsafe {
        let p = pg_sys::GetUserNameFromId(role, true);
        if p.is_null() {
            format!("{}", role.to_u32())
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// May `role` act for leases owned by `owner` (same role or a member of it)?
pub fn acts_for(role: pg_sys::Oid, owner: pg_sys::Oid) -> bool {
    // SAFETY: catalog lookup.
    unsafe { pg_sys::has_privs_of_role(role, owner) }
}

/// Is `role` an operator: a superuser, or a member of the role named in
/// `fenced_lock.operator_role` (when one is set and exists)?
pub fn is_operator(role: pg_sys::Oid) -> bool {
    // SAFETY: plain catalog lookups.
    unsafe {
        if pg_sys::superuser_arg(role) {
            return true;
        }
        match crate::settings::operator_role() {
            Some(name) if !name.as_bytes().is_empty() => {
                let op = pg_sys::get_role_oid(name.as_ptr(), true);
                op != pg_sys::InvalidOid && pg_sys::has_privs_of_role(role, op)
            }
            _ => false,
        }
    }
}

/// `role` may force release `name`, or the error saying it may not.
pub fn check_operator(function: &str, name: &str, role: pg_sys::Oid) -> Result<(), FlError> {
    if is_operator(role) {
        return Ok(());
    }
    Err(FlError::new(
        sqlstate::INSUFFICIENT_PRIVILEGE,
        format!("{function}: permission denied to force release lock {}", quote_name(name)),
    )
    .hint("Force release needs a superuser or a member of the role named in fenced_lock.operator_role."))
}

/// May the current role see token and holder of a lease owned by `owner`?
/// Its owner's members and operators may (the views' visibility rule).
pub fn may_see_role(owner: Option<pg_sys::Oid>) -> bool {
    let me = current_role();
    owner.is_some_and(|o| acts_for(me, o)) || is_operator(me)
}
