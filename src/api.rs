//! The SQL API (SPEC §3): argument handling for each function, then a call
//! into the module that does the work. Declared in `sql/fenced_lock.sql`.

use crate::args::{check_holder, check_name, check_token, check_ttl, check_wait};
use crate::errors::FlError;
use crate::lease::{self, AcquireRequest};
use crate::settings::{is_operator, max_ttl_seconds};
use crate::sqlfn::{
    arg_datum, arg_i64, arg_interval, arg_text, interval_text, required, return_bool, return_i64,
    return_null, sql_function,
};
use crate::store::current_role;
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;

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

/// Read and check a `ttl` argument: `(datum, microseconds)`, None if NULL.
unsafe fn ttl_arg(
    fcinfo: pg_sys::FunctionCallInfo,
    n: usize,
    function: &str,
    name: &str,
) -> Result<Option<(Datum, i64)>, FlError> {
    // SAFETY: argument n is `ttl interval`.
    match unsafe { arg_interval(fcinfo, n) } {
        None => Ok(None),
        Some((value, datum)) => {
            // SAFETY: an interval datum, printed only for an error message.
            let shown = || unsafe { interval_text(datum) };
            let micros = check_ttl(function, name, value, shown, max_ttl_seconds(function)?)?;
            Ok(Some((datum, micros)))
        }
    }
}

/// The arguments shared by both acquires, checked.
struct AcquireArgs {
    name: String,
    ttl: Datum,
    ttl_micros: i64,
    holder: Option<String>,
}

impl AcquireArgs {
    /// Read name (argument 0), ttl (1) and holder (`holder_arg`).
    unsafe fn read(
        fcinfo: pg_sys::FunctionCallInfo,
        function: &str,
        holder_arg: usize,
    ) -> Result<Self, FlError> {
        // SAFETY: the acquires are (name text, ttl interval, ..., holder text).
        unsafe {
            let name = name_arg(fcinfo, function)?;
            let (ttl, ttl_micros) =
                required(ttl_arg(fcinfo, 1, function, &name)?, function, "ttl", Some(&name))?;
            let holder = arg_text(fcinfo, holder_arg);
            check_holder(function, &name, holder.as_deref())?;
            Ok(AcquireArgs { name, ttl, ttl_micros, holder })
        }
    }

    fn request(&self) -> AcquireRequest<'_> {
        AcquireRequest {
            name: &self.name,
            ttl: self.ttl,
            ttl_micros: self.ttl_micros,
            holder: self.holder.as_deref(),
            caller: current_role(),
        }
    }
}

unsafe fn try_acquire(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    // SAFETY: (name text, ttl interval, holder text)
    let args = unsafe { AcquireArgs::read(fcinfo, "fenced_lock_try_acquire", 2)? };
    match lease::try_acquire(&args.request())? {
        Some(token) => Ok(return_i64(token)),
        // SAFETY: valid fcinfo.
        None => Ok(unsafe { return_null(fcinfo) }),
    }
}
sql_function!(fl_try_acquire, pg_finfo_fl_try_acquire, try_acquire);

unsafe fn acquire(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_acquire";
    // SAFETY: (name text, ttl interval, wait interval, holder text)
    unsafe {
        let args = AcquireArgs::read(fcinfo, F, 3)?;
        let wait = match arg_interval(fcinfo, 2) {
            None => None,
            Some((value, datum)) => Some(check_wait(F, &args.name, value, || interval_text(datum))?),
        };
        crate::waiting::acquire(&args.request(), wait).map(return_i64)
    }
}
sql_function!(fl_acquire, pg_finfo_fl_acquire, acquire);

unsafe fn renew(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_renew";
    // SAFETY: (name text, token bigint, ttl interval)
    unsafe {
        let name = name_arg(fcinfo, F)?;
        let token = token_arg(fcinfo, 1, F, &name)?;
        let ttl = ttl_arg(fcinfo, 2, F, &name)?;
        let ttl_micros = ttl.map(|(_, micros)| micros);
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
    if !is_operator(current_role()) {
        return Err(FlError::not_operator(F, &name));
    }
    lease::force_release(&name).map(return_bool)
}
sql_function!(fl_force_release, pg_finfo_fl_force_release, force_release);

unsafe fn guard(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    // SAFETY: called by the trigger manager.
    unsafe { crate::guard::fire(fcinfo) }
}
sql_function!(fl_guard, pg_finfo_fl_guard, guard);

/// For the view: may the current role see token and holder of a lease owned by
/// `owner` (argument 0, regrole)? Its owner's members and operators may.
unsafe fn may_see(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    // SAFETY: (owner regrole)
    let owner = unsafe { arg_datum(fcinfo, 0) };
    let me = current_role();
    let visible = match owner {
        Some(o) => crate::store::acts_for(me, pg_sys::Oid::from(o.value() as u32)) || is_operator(me),
        None => is_operator(me),
    };
    Ok(return_bool(visible))
}
sql_function!(fl_may_see, pg_finfo_fl_may_see, may_see);
