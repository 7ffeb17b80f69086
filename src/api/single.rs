//! The functions of one lock name (docs/reference.md, "Functions").

use super::{name_arg, token_arg, ttl_arg, AcquireArgs, Change};
use crate::errors::FlError;
use crate::fmgr::{return_bool, return_i64, return_null, sql_function};
use crate::lease;
use crate::roles::{check_operator, current_role};
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;

unsafe fn try_acquire(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_try_acquire";
    // SAFETY: (name text, ttl interval, holder text, session_bound boolean,
    // shared boolean, permits integer)
    let (name, args) = unsafe {
        let name = name_arg(fcinfo, F)?;
        let args = AcquireArgs::read(fcinfo, F, &name, None, true)?;
        (name, args)
    };
    let _change = Change::begin(F)?;
    match lease::try_acquire(F, &args.request(&name))? {
        Some(token) => Ok(return_i64(token)),
        // SAFETY: valid fcinfo.
        None => Ok(unsafe { return_null(fcinfo) }),
    }
}
sql_function!(fl_try_acquire, pg_finfo_fl_try_acquire, try_acquire);

unsafe fn acquire(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_acquire";
    // SAFETY: (name text, ttl interval, wait interval, holder text,
    // session_bound boolean, shared boolean, permits integer)
    let (name, args) = unsafe {
        let name = name_arg(fcinfo, F)?;
        let args = AcquireArgs::read(fcinfo, F, &name, Some(2), true)?;
        (name, args)
    };
    let _change = Change::begin(F)?;
    crate::waiting::acquire(F, &args.request(&name), args.wait_micros).map(return_i64)
}
sql_function!(fl_acquire, pg_finfo_fl_acquire, acquire);

unsafe fn renew(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_renew";
    // SAFETY: (name text, token bigint, ttl interval)
    unsafe {
        let name = name_arg(fcinfo, F)?;
        let token = token_arg(fcinfo, 1, F, &name)?;
        let ttl_micros = ttl_arg(fcinfo, 2, F, &name)?;
        let _change = Change::begin(F)?;
        lease::renew(F, &name, token, ttl_micros, current_role()).map(return_bool)
    }
}
sql_function!(fl_renew, pg_finfo_fl_renew, renew);

unsafe fn release(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_release";
    // SAFETY: (name text, token bigint)
    unsafe {
        let name = name_arg(fcinfo, F)?;
        let token = token_arg(fcinfo, 1, F, &name)?;
        let _change = Change::begin(F)?;
        lease::release(F, &name, token, current_role()).map(return_bool)
    }
}
sql_function!(fl_release, pg_finfo_fl_release, release);

unsafe fn validate(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_validate";
    // SAFETY: (name text, token bigint)
    unsafe {
        let name = name_arg(fcinfo, F)?;
        let token = token_arg(fcinfo, 1, F, &name)?;
        lease::validate(&name, token).map(return_bool)
    }
}
sql_function!(fl_validate, pg_finfo_fl_validate, validate);

unsafe fn assert(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_assert";
    // SAFETY: (name text, token bigint)
    unsafe {
        let name = name_arg(fcinfo, F)?;
        let token = token_arg(fcinfo, 1, F, &name)?;
        crate::fence::assert(&name, token)?;
        Ok(return_null(fcinfo))
    }
}
sql_function!(fl_assert, pg_finfo_fl_assert, assert);

unsafe fn force_release(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_force_release";
    // SAFETY: (name text)
    let name = unsafe { name_arg(fcinfo, F)? };
    check_operator(F, &name, current_role())?;
    let _change = Change::begin(F)?;
    lease::force_release(&name, current_role()).map(return_bool)
}
sql_function!(fl_force_release, pg_finfo_fl_force_release, force_release);

unsafe fn guard(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    // SAFETY: called by the trigger manager.
    unsafe { crate::guard::fire(fcinfo) }
}
sql_function!(fl_guard, pg_finfo_fl_guard, guard);
