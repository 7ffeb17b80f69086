//! The SQL API (docs/reference.md, "Functions"): argument handling for each
//! function, then a call into the module that does the work. Declared in
//! `sql/fenced_lock.sql`.
//!
//! - `single`  the functions of one lock name
//! - `many`    several names at once, and keeping many leases alive
//! - `leader`  elections that others can watch
//! - `guards`  protecting a table, the view of its guards, the event trigger
//!
//! Every argument is checked before anything else happens, in the order of
//! the declaration, so a call reports its first bad argument; then a call
//! that changes lease state is entered as a `Change`.

mod guards;
mod leader;
mod many;
mod single;

use crate::args::{check_holder, check_name, check_token, check_ttl, check_wait, required};
use crate::datum::interval_text;
use crate::errors::FlError;
use crate::fmgr::{arg_bool, arg_i32, arg_i64, arg_interval, arg_text};
use crate::lease::AcquireRequest;
use crate::mode::LeaseMode;
use crate::roles::current_role;
use crate::settings::max_ttl_seconds;
use crate::xact::check_writable;
use pgrx::pg_sys;

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
    // SAFETY: argument 0 of every single-name function is `name text`.
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

/// What every acquire takes after its name or names: ttl, the wait of the
/// waiting ones, holder, session_bound, and for the single-name acquires the
/// mode (shared, permits).
struct AcquireArgs {
    ttl_micros: i64,
    /// the wait of the waiting acquires, in microseconds (None: no bound)
    wait_micros: Option<i64>,
    holder: Option<String>,
    session_bound: bool,
    mode: LeaseMode,
}

impl AcquireArgs {
    /// Read ttl (argument 1), wait (`wait_arg`, the waiting acquires only),
    /// holder and session_bound (the two after it), then shared and permits
    /// (the two after those) when `with_mode`. `name` is the lock the
    /// messages name.
    unsafe fn read(
        fcinfo: pg_sys::FunctionCallInfo,
        function: &'static str,
        name: &str,
        wait_arg: Option<usize>,
        with_mode: bool,
    ) -> Result<Self, FlError> {
        // SAFETY: the acquires are (name(s), ttl interval, [wait interval,]
        // holder text, session_bound boolean[, shared boolean, permits integer]).
        unsafe {
            let ttl_micros = required(ttl_arg(fcinfo, 1, function, name)?, function, "ttl", Some(name))?;
            let wait_micros = match wait_arg.and_then(|n| arg_interval(fcinfo, n)) {
                None => None,
                Some((value, datum)) => Some(check_wait(function, name, value, || interval_text(datum))?),
            };
            let holder_arg = wait_arg.map_or(2, |n| n + 1);
            let holder = arg_text(fcinfo, holder_arg);
            check_holder(function, name, holder.as_deref())?;
            // Older declarations pass fewer arguments: those read as their defaults.
            let passed = |n: usize| n < (*fcinfo).nargs as usize;
            let flag = |n: usize, argument: &str| -> Result<bool, FlError> {
                if passed(n) {
                    required(arg_bool(fcinfo, n), function, argument, Some(name))
                } else {
                    Ok(false)
                }
            };
            let session_bound = flag(holder_arg + 1, "session_bound")?;
            let mode = if with_mode {
                let shared = flag(holder_arg + 2, "shared")?;
                let permits = if passed(holder_arg + 3) {
                    required(arg_i32(fcinfo, holder_arg + 3), function, "permits", Some(name))?
                } else {
                    1
                };
                LeaseMode::requested(function, name, shared, permits)?
            } else {
                LeaseMode::Exclusive
            };
            Ok(AcquireArgs { ttl_micros, wait_micros, holder, session_bound, mode })
        }
    }

    fn request<'a>(&'a self, name: &'a str) -> AcquireRequest<'a> {
        AcquireRequest {
            name,
            ttl_micros: self.ttl_micros,
            holder: self.holder.as_deref(),
            session_bound: self.session_bound,
            mode: self.mode,
            caller: current_role(),
        }
    }
}
