//! The SQL API (docs/reference.md, "Functions"): argument handling for each
//! function, then a call into the module that does the work. Declared in
//! `sql/fenced_lock.sql`.

use crate::args::{check_holder, check_name, check_token, check_ttl, check_wait, required};
use crate::datum::interval_text;
use crate::errors::FlError;
use crate::fmgr::{
    arg_bool, arg_i64, arg_interval, arg_text, return_bool, return_i64, return_null, sql_function,
};
use crate::lease::{self, AcquireRequest};
use crate::roles::{check_operator, current_role};
use crate::settings::max_ttl_seconds;
use crate::xact::check_writable;
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;

/// A lease-changing call: its WAL counts as fenced_lock's own (durability.rs).
struct Change;

impl Change {
    fn begin(function: &str) -> Result<Change, FlError> {
        check_writable(function)?;
        crate::durability::enter();
        Ok(Change)
    }
}

impl Drop for Change {
    fn drop(&mut self) {
        crate::durability::leave();
    }
}

/// Read and check `name` (argument 0).
unsafe fn name_arg(fcinfo: pg_sys::FunctionCallInfo, function: &str) -> Result<String, FlError> {
    // SAFETY: argument 0 of every API function is `name text`.
    let name = required(unsafe { arg_text(fcinfo, 0) }, function, "name", None)?;
    check_name(function, &name)?;
    Ok(name)
}

/// Read and check a `token` argument.
unsafe fn token_arg(
    fcinfo: pg_sys::FunctionCallInfo,
    n: usize,
    function: &str,
    name: &str,
) -> Result<i64, FlError> {
    // SAFETY: argument n is `token bigint`.
    let token = required(unsafe { arg_i64(fcinfo, n) }, function, "token", Some(name))?;
    check_token(function, name, token)?;
    Ok(token)
}

/// Read and check a `ttl` argument, in microseconds; None if NULL.
unsafe fn ttl_arg(
    fcinfo: pg_sys::FunctionCallInfo,
    n: usize,
    function: &str,
    name: &str,
) -> Result<Option<i64>, FlError> {
    // SAFETY: argument n is `ttl interval`.
    match unsafe { arg_interval(fcinfo, n) } {
        None => Ok(None),
        Some((value, datum)) => {
            // SAFETY: an interval datum, printed only for an error message.
            let shown = || unsafe { interval_text(datum) };
            check_ttl(function, name, value, shown, max_ttl_seconds(function)?).map(Some)
        }
    }
}

/// The arguments of both acquires, checked in their order.
struct AcquireArgs {
    name: String,
    ttl_micros: i64,
    /// `fenced_lock_acquire`'s wait, in microseconds (None: no bound)
    wait_micros: Option<i64>,
    holder: Option<String>,
    session_bound: bool,
}

impl AcquireArgs {
    /// Read name (argument 0), ttl (1), wait (`wait_arg`, acquire only),
    /// holder and session_bound (the two after it).
    unsafe fn read(
        fcinfo: pg_sys::FunctionCallInfo,
        function: &'static str,
        wait_arg: Option<usize>,
    ) -> Result<Self, FlError> {
        // SAFETY: the acquires are (name text, ttl interval, [wait interval,]
        // holder text, session_bound boolean).
        unsafe {
            let name = name_arg(fcinfo, function)?;
            let ttl_micros = required(ttl_arg(fcinfo, 1, function, &name)?, function, "ttl", Some(&name))?;
            let wait_micros = match wait_arg.and_then(|n| arg_interval(fcinfo, n)) {
                None => None,
                Some((value, datum)) => Some(check_wait(function, &name, value, || interval_text(datum))?),
            };
            let holder_arg = wait_arg.map_or(2, |n| n + 1);
            let session_bound_arg = holder_arg + 1;
            let holder = arg_text(fcinfo, holder_arg);
            check_holder(function, &name, holder.as_deref())?;
            // 0.1.0's declarations pass no session_bound: read as false.
            let session_bound = if session_bound_arg < (*fcinfo).nargs as usize {
                required(arg_bool(fcinfo, session_bound_arg), function, "session_bound", Some(&name))?
            } else {
                false
            };
            Ok(AcquireArgs { name, ttl_micros, wait_micros, holder, session_bound })
        }
    }

    fn request(&self) -> AcquireRequest<'_> {
        AcquireRequest {
            name: &self.name,
            ttl_micros: self.ttl_micros,
            holder: self.holder.as_deref(),
            session_bound: self.session_bound,
            caller: current_role(),
        }
    }
}

unsafe fn try_acquire(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_try_acquire";
    // SAFETY: (name text, ttl interval, holder text, session_bound boolean)
    let args = unsafe { AcquireArgs::read(fcinfo, F, None)? };
    let _change = Change::begin(F)?;
    match lease::try_acquire(&args.request())? {
        Some(token) => Ok(return_i64(token)),
        // SAFETY: valid fcinfo.
        None => Ok(unsafe { return_null(fcinfo) }),
    }
}
sql_function!(fl_try_acquire, pg_finfo_fl_try_acquire, try_acquire);

unsafe fn acquire(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_acquire";
    // SAFETY: (name text, ttl interval, wait interval, holder text, session_bound boolean)
    let args = unsafe { AcquireArgs::read(fcinfo, F, Some(2))? };
    let _change = Change::begin(F)?;
    crate::waiting::acquire(&args.request(), args.wait_micros).map(return_i64)
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
