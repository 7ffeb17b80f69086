//! Several names at once, and keeping many leases alive in one call
//! (docs/reference.md, "Several names at once").

use super::{ttl_arg, AcquireArgs, Change};
use crate::args::{check_holder, check_names, check_tokens, required};
use crate::errors::FlError;
use crate::fmgr::{
    arg_i64_array, arg_text, arg_text_array, return_i32, return_i64_array, return_null, sql_function,
};
use crate::lease;
use crate::roles::current_role;
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;

/// Read and check `names text[]` (argument 0).
unsafe fn names_arg(fcinfo: pg_sys::FunctionCallInfo, function: &str) -> Result<Vec<String>, FlError> {
    // SAFETY: argument 0 is `names text[]`.
    let names = required(unsafe { arg_text_array(fcinfo, 0) }, function, "names", None)?;
    check_names(function, names)
}

unsafe fn try_acquire_all(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_try_acquire_all";
    // SAFETY: (names text[], ttl interval, holder text, session_bound boolean)
    let (names, args) = unsafe {
        let names = names_arg(fcinfo, F)?;
        let args = AcquireArgs::read(fcinfo, F, &names[0], None, false)?;
        (names, args)
    };
    let _change = Change::begin(F)?;
    match lease::try_acquire_all(F, &names, &args.request(""))? {
        Some(tokens) => Ok(return_i64_array(&tokens)),
        // SAFETY: valid fcinfo.
        None => Ok(unsafe { return_null(fcinfo) }),
    }
}
sql_function!(fl_try_acquire_all, pg_finfo_fl_try_acquire_all, try_acquire_all);

unsafe fn acquire_all(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_acquire_all";
    // SAFETY: (names text[], ttl interval, wait interval, holder text, session_bound boolean)
    let (names, args) = unsafe {
        let names = names_arg(fcinfo, F)?;
        let args = AcquireArgs::read(fcinfo, F, &names[0], Some(2), false)?;
        (names, args)
    };
    let _change = Change::begin(F)?;
    crate::waiting::acquire_all(F, &names, &args.request(""), args.wait_micros).map(|t| return_i64_array(&t))
}
sql_function!(fl_acquire_all, pg_finfo_fl_acquire_all, acquire_all);

unsafe fn release_all(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_release_all";
    // SAFETY: (names text[], tokens bigint[])
    let pairs = unsafe {
        let names = names_arg(fcinfo, F)?;
        let tokens = required(arg_i64_array(fcinfo, 1), F, "tokens", None)?;
        let tokens = check_tokens(F, &names, tokens)?;
        names.into_iter().zip(tokens).collect::<Vec<_>>()
    };
    let _change = Change::begin(F)?;
    lease::release_all(F, &pairs, current_role()).map(return_i32)
}
sql_function!(fl_release_all, pg_finfo_fl_release_all, release_all);

unsafe fn renew_all(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_renew_all";
    // SAFETY: (holder text, ttl interval)
    let (holder, ttl_micros) = unsafe {
        let holder = arg_text(fcinfo, 0);
        let shown = holder.clone().unwrap_or_else(|| "this session's".to_string());
        check_holder(F, &shown, holder.as_deref())?;
        let ttl_micros = ttl_arg(fcinfo, 1, F, &format!("holder {shown}"))?;
        (holder, ttl_micros)
    };
    let _change = Change::begin(F)?;
    lease::renew_all(F, holder.as_deref(), ttl_micros, current_role()).map(return_i32)
}
sql_function!(fl_renew_all, pg_finfo_fl_renew_all, renew_all);
