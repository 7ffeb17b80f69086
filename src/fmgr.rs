//! The fmgr boundary: how the C-language functions declared in
//! `sql/fenced_lock.sql` are entered, read their arguments and return.
//!
//! Each SQL-callable function runs its body inside pgrx's guard (so PostgreSQL
//! errors and Rust panics are handled as pgrx does) and gets back a
//! `Result`. Only after the guard has returned, with every Rust value of the
//! body dropped, is an `FlError` raised with its own SQLSTATE. That is what
//! lets `FL001` reach the client as `FL001`, which pgrx's `ereport!` cannot do.

use crate::args::IntervalValue;
use crate::datum::{interval_value, text_value};
use crate::errors::{encode_sqlstate, FlError};
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use std::ffi::{c_char, c_int, CString};

/// Define a C-language SQL function `$name` whose body is `$body(fcinfo)`.
macro_rules! sql_function {
    ($name:ident, $finfo:ident, $body:path) => {
        #[no_mangle]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
            const V1: ::pgrx::pg_sys::Pg_finfo_record = ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }

        #[no_mangle]
        #[doc(hidden)]
        pub unsafe extern "C-unwind" fn $name(
            fcinfo: ::pgrx::pg_sys::FunctionCallInfo,
        ) -> ::pgrx::pg_sys::Datum {
            let outcome: Result<::pgrx::pg_sys::Datum, $crate::errors::FlError> =
                // SAFETY: PostgreSQL calls us with a valid fcinfo on its main thread.
                unsafe { ::pgrx::pg_sys::panic::pgrx_extern_c_guard(|| $body(fcinfo)) };
            match outcome {
                Ok(datum) => datum,
                // SAFETY: nothing with a destructor is alive in this frame.
                Err(error) => unsafe { $crate::fmgr::raise(error) },
            }
        }
    };
}
pub(crate) use sql_function;

// The error-reporting entry points of elog.c. pgrx keeps them out of its
// bindings on purpose; declared here for `raise` alone.
unsafe extern "C-unwind" {
    fn errstart(elevel: c_int, domain: *const c_char) -> bool;
    fn errfinish(filename: *const c_char, lineno: c_int, funcname: *const c_char);
    fn errcode(sqlerrcode: c_int) -> c_int;
    fn errmsg(fmt: *const c_char, ...) -> c_int;
    fn errdetail(fmt: *const c_char, ...) -> c_int;
    fn errhint(fmt: *const c_char, ...) -> c_int;
}

/// Raise `error` as a PostgreSQL ERROR with its own SQLSTATE. Does not return.
///
/// # Safety
/// Longjmps to PostgreSQL's error handler: the caller's frames must hold no
/// values with pending destructors (the `sql_function!` wrapper ensures this).
pub unsafe fn raise(error: FlError) -> ! {
    crate::stats::count_error(error.sqlstate);
    let code = encode_sqlstate(error.sqlstate);
    // Copy the texts into palloc'd memory in ErrorContext, then drop every
    // Rust allocation before jumping.
    // SAFETY: ErrorContext exists in every backend; the previous context is
    // restored before the block ends.
    let (message, detail, hint) = unsafe {
        let old = pg_sys::MemoryContextSwitchTo(pg_sys::ErrorContext);
        let to_pg = |s: &str| -> *const c_char {
            let c = CString::new(s.replace('\0', "")).unwrap();
            pg_sys::pstrdup(c.as_ptr())
        };
        let m = to_pg(&error.message);
        let d = error.detail.as_deref().map(to_pg).unwrap_or(std::ptr::null());
        let h = error.hint.as_deref().map(to_pg).unwrap_or(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(old);
        (m, d, h)
    };
    drop(error);
    const PERCENT_S: &std::ffi::CStr = c"%s";
    const FILE: &std::ffi::CStr = c"fenced_lock";
    const FUNC: &std::ffi::CStr = c"fenced_lock";
    // SAFETY: the strings live in ErrorContext; errfinish at ERROR never returns.
    unsafe {
        if errstart(pgrx::PgLogLevel::ERROR as c_int, std::ptr::null()) {
            errcode(code);
            errmsg(PERCENT_S.as_ptr(), message);
            if !detail.is_null() {
                errdetail(PERCENT_S.as_ptr(), detail);
            }
            if !hint.is_null() {
                errhint(PERCENT_S.as_ptr(), hint);
            }
            errfinish(FILE.as_ptr(), 0, FUNC.as_ptr());
        }
    }
    unreachable!("errfinish returned at ERROR level")
}

/// Argument `n`, or `None` when it is SQL NULL or not passed at all. A
/// function declared by an older version of the extension's SQL may pass
/// fewer arguments than this library knows; those read as NULL.
///
/// # Safety
/// `fcinfo` is the valid call info of a function declared as in `sql/fenced_lock.sql`.
pub unsafe fn arg_datum(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<Datum> {
    // SAFETY: the caller passes a valid fcinfo; we never read past nargs.
    unsafe {
        if n >= (*fcinfo).nargs as usize {
            return None;
        }
        pgrx::fcinfo::pg_getarg_datum(fcinfo, n)
    }
}

/// # Safety
/// As for [`arg_datum`]; argument `n` is declared as text.
pub unsafe fn arg_text(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<String> {
    // SAFETY: a non-NULL text argument.
    unsafe { arg_datum(fcinfo, n).map(|d| text_value(d)) }
}

/// # Safety
/// As for [`arg_datum`]; argument `n` is declared as bigint.
pub unsafe fn arg_i64(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<i64> {
    // SAFETY: a bigint argument is passed by value.
    unsafe { arg_datum(fcinfo, n).map(|d| d.value() as i64) }
}

/// # Safety
/// As for [`arg_datum`]; argument `n` is declared as boolean.
pub unsafe fn arg_bool(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<bool> {
    // SAFETY: a boolean argument is passed by value.
    unsafe { arg_datum(fcinfo, n).map(|d| d.value() != 0) }
}

/// An interval argument: its fields and its datum.
///
/// # Safety
/// As for [`arg_datum`]; argument `n` is declared as interval.
pub unsafe fn arg_interval(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<(IntervalValue, Datum)> {
    // SAFETY: a non-NULL interval argument.
    unsafe { arg_datum(fcinfo, n).map(|d| (interval_value(d), d)) }
}

/// # Safety
/// `fcinfo` is the valid call info of a function declared as in `sql/fenced_lock.sql`.
pub unsafe fn return_null(fcinfo: pg_sys::FunctionCallInfo) -> Datum {
    // SAFETY: valid fcinfo.
    unsafe { (*fcinfo).isnull = true };
    Datum::from(0)
}

pub fn return_i64(v: i64) -> Datum {
    Datum::from(v)
}

pub fn return_bool(v: bool) -> Datum {
    Datum::from(v)
}
