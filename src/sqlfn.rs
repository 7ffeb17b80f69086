//! The SQL boundary: fmgr glue for the functions in `sql/fenced_lock.sql`.
//!
//! Each SQL-callable function runs its body inside pgrx's guard (so PostgreSQL
//! errors and Rust panics are handled as pgrx does) and gets back a
//! `Result`. Only after the guard has returned, with every Rust value of the
//! body dropped, is an `FlError` raised with its own SQLSTATE. That is what
//! lets `FL001` reach the client as `FL001`, which pgrx's `ereport!` cannot do.

use crate::args::IntervalValue;
use crate::errors::{encode_sqlstate, FlError};
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use pgrx::IntoDatum;
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
            // SAFETY: PostgreSQL calls us with a valid fcinfo on its main thread.
            let outcome: Result<::pgrx::pg_sys::Datum, $crate::errors::FlError> =
                unsafe { ::pgrx::pg_sys::panic::pgrx_extern_c_guard(|| $body(fcinfo)) };
            match outcome {
                Ok(datum) => datum,
                // SAFETY: nothing with a destructor is alive in this frame.
                Err(error) => unsafe { $crate::sqlfn::raise(error) },
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

// Built-in SQL functions called through DirectFunctionCall; pgrx's bindings
// of them are Rust wrappers, which fmgr cannot take as a function pointer.
unsafe extern "C-unwind" {
    pub fn interval_out(fcinfo: pg_sys::FunctionCallInfo) -> Datum;
    pub fn nextval_oid(fcinfo: pg_sys::FunctionCallInfo) -> Datum;
}

/// Raise `error` as a PostgreSQL ERROR with its own SQLSTATE. Does not return.
///
/// # Safety
/// Longjmps to PostgreSQL's error handler: the caller's frames must hold no
/// values with pending destructors (the `sql_function!` wrapper ensures this).
pub unsafe fn raise(error: FlError) -> ! {
    let code = encode_sqlstate(error.sqlstate);
    // Copy the texts into palloc'd memory in ErrorContext, then drop every
    // Rust allocation before jumping.
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

/// Argument `n`, or `None` when it is SQL NULL.
/// # Safety
/// `fcinfo` is the valid call info of a function declared as in `sql/fenced_lock.sql`.
pub unsafe fn arg_datum(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<Datum> {
    // SAFETY: the caller passes a valid fcinfo with at least n+1 arguments.
    unsafe { pgrx::fcinfo::pg_getarg_datum(fcinfo, n) }
}

/// # Safety
/// `fcinfo` is the valid call info of a function declared as in `sql/fenced_lock.sql`.
pub unsafe fn arg_text(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<String> {
    // SAFETY: argument n is declared as text.
    unsafe { pgrx::fcinfo::pg_getarg::<String>(fcinfo, n) }
}

/// # Safety
/// `fcinfo` is the valid call info of a function declared as in `sql/fenced_lock.sql`.
pub unsafe fn arg_i64(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<i64> {
    // SAFETY: argument n is declared as bigint.
    unsafe { arg_datum(fcinfo, n).map(|d| d.value() as i64) }
}

/// An interval argument: its fields and its datum.
/// # Safety
/// `fcinfo` is the valid call info of a function declared as in `sql/fenced_lock.sql`.
pub unsafe fn arg_interval(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<(IntervalValue, Datum)> {
    // SAFETY: argument n is declared as interval.
    unsafe { arg_datum(fcinfo, n).map(|d| (interval_value(d), d)) }
}

/// The fields of an interval datum.
///
/// # Safety
/// `d` must be a valid interval datum.
pub unsafe fn interval_value(d: Datum) -> IntervalValue {
    // SAFETY: an interval datum points at an Interval struct.
    let iv = unsafe { &*(d.cast_mut_ptr::<pg_sys::Interval>()) };
    IntervalValue { months: iv.month, days: iv.day, micros: iv.time }
}

/// An interval as PostgreSQL prints it, quoted, for messages.
///
/// # Safety
/// `d` must be a valid interval datum.
pub unsafe fn interval_text(d: Datum) -> String {
    // SAFETY: interval_out takes an interval datum and returns a cstring.
    unsafe {
        let out = pg_sys::DirectFunctionCall1Coll(Some(interval_out), pg_sys::InvalidOid, d);
        let s = std::ffi::CStr::from_ptr(out.cast_mut_ptr::<c_char>()).to_string_lossy();
        format!("'{s}'")
    }
}

pub fn text_datum(s: &str) -> Datum {
    s.into_datum().expect("text datum")
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

/// Unwrap a required argument or fail with 22004.
pub fn required<T>(v: Option<T>, function: &str, argument: &str, name: Option<&str>) -> Result<T, FlError> {
    v.ok_or_else(|| FlError::null_argument(function, argument, name))
}
