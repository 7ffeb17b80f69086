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

/// A one-dimensional array argument: its elements (`None` for a NULL
/// element), or `Err(dims)` for an array of `dims` dimensions (an empty
/// array has none). `elem_type` is the element type: `text` or `bigint`.
///
/// # Safety
/// As for [`arg_datum`]; argument `n` is declared as `text[]` or `bigint[]`
/// to match `elem_type`.
pub unsafe fn arg_array(
    fcinfo: pg_sys::FunctionCallInfo,
    n: usize,
    elem_type: pg_sys::Oid,
) -> Option<Result<Vec<Option<Datum>>, i32>> {
    // SAFETY: a non-NULL array argument, detoasted; deconstruct_array
    // returns palloc'd arrays of `count` entries; text elements stay
    // pointers into the detoasted array, which lives as long as the call.
    unsafe {
        let d = arg_datum(fcinfo, n)?;
        let array = pg_sys::pg_detoast_datum(d.cast_mut_ptr::<pg_sys::varlena>()) as *mut pg_sys::ArrayType;
        let dims = (*array).ndim;
        if dims != 1 {
            return Some(if dims == 0 { Ok(Vec::new()) } else { Err(dims) });
        }
        let (len, byval, align) = if elem_type == pg_sys::INT8OID {
            (8, true, pg_sys::TYPALIGN_DOUBLE)
        } else {
            (-1, false, pg_sys::TYPALIGN_INT)
        };
        let mut elems: *mut Datum = std::ptr::null_mut();
        let mut nulls: *mut bool = std::ptr::null_mut();
        let mut count: c_int = 0;
        pg_sys::deconstruct_array(
            array,
            elem_type,
            len,
            byval,
            align as c_char,
            &mut elems,
            &mut nulls,
            &mut count,
        );
        Some(Ok((0..count as usize).map(|i| (!*nulls.add(i)).then(|| *elems.add(i))).collect()))
    }
}

/// A `text[]` argument (see [`arg_array`]).
///
/// # Safety
/// As for [`arg_array`].
pub unsafe fn arg_text_array(
    fcinfo: pg_sys::FunctionCallInfo,
    n: usize,
) -> Option<Result<Vec<Option<String>>, i32>> {
    // SAFETY: text elements.
    unsafe { arg_array(fcinfo, n, pg_sys::TEXTOID) }
        .map(|r| r.map(|v| v.into_iter().map(|d| d.map(|d| unsafe { text_value(d) })).collect()))
}

/// A `bigint[]` argument (see [`arg_array`]).
///
/// # Safety
/// As for [`arg_array`].
pub unsafe fn arg_i64_array(
    fcinfo: pg_sys::FunctionCallInfo,
    n: usize,
) -> Option<Result<Vec<Option<i64>>, i32>> {
    // SAFETY: bigint elements, passed by value.
    unsafe { arg_array(fcinfo, n, pg_sys::INT8OID) }
        .map(|r| r.map(|v| v.into_iter().map(|d| d.map(|d| d.value() as i64)).collect()))
}

/// A `bigint[]` result.
pub fn return_i64_array(values: &[i64]) -> Datum {
    let mut datums: Vec<Datum> = values.iter().map(|&v| Datum::from(v)).collect();
    // SAFETY: construct_array copies the by-value bigints into a new array.
    unsafe {
        Datum::from(pg_sys::construct_array(
            datums.as_mut_ptr(),
            datums.len() as i32,
            pg_sys::INT8OID,
            8,
            true,
            pg_sys::TYPALIGN_DOUBLE as c_char,
        ))
    }
}

pub fn return_i32(v: i32) -> Datum {
    Datum::from(v)
}

/// # Safety
/// As for [`arg_datum`]; argument `n` is declared as integer.
pub unsafe fn arg_i32(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<i32> {
    // SAFETY: an integer argument is passed by value.
    unsafe { arg_datum(fcinfo, n).map(|d| d.value() as i32) }
}

/// Return `rows` (each one value per column, `None` is NULL) from a
/// function declared `RETURNS TABLE (...)` or `RETURNS SETOF record` with
/// OUT parameters, in materialize mode.
///
/// # Safety
/// `fcinfo` is the call info of such a function, called where a set is
/// allowed (PostgreSQL checks `allowedModes` below).
pub unsafe fn return_rows(fcinfo: pg_sys::FunctionCallInfo, rows: &[Vec<Option<Datum>>]) -> Datum {
    // SAFETY: the ReturnSetInfo protocol of a materializing set-returning
    // function (as in contrib's functions): the tuple store and descriptor
    // live in the per-query memory context.
    unsafe {
        let rsinfo = (*fcinfo).resultinfo as *mut pg_sys::ReturnSetInfo;
        if rsinfo.is_null()
            || (*rsinfo).type_ != pg_sys::NodeTag::T_ReturnSetInfo
            || (*rsinfo).allowedModes & pg_sys::SetFunctionReturnMode::SFRM_Materialize as i32 == 0
        {
            pgrx::error!("fenced_lock: a set-returning function called where a set is not allowed");
        }
        let old = pg_sys::MemoryContextSwitchTo((*(*rsinfo).econtext).ecxt_per_query_memory);
        let mut desc: pg_sys::TupleDesc = std::ptr::null_mut();
        if pg_sys::get_call_result_type(fcinfo, std::ptr::null_mut(), &mut desc)
            != pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE
        {
            pgrx::error!("fenced_lock: the function's result is not a row type");
        }
        let store = pg_sys::tuplestore_begin_heap(true, false, pg_sys::work_mem);
        (*rsinfo).returnMode = pg_sys::SetFunctionReturnMode::SFRM_Materialize;
        (*rsinfo).setResult = store;
        (*rsinfo).setDesc = desc;
        pg_sys::MemoryContextSwitchTo(old);
        for row in rows {
            let mut values: Vec<Datum> = row.iter().map(|v| v.unwrap_or(Datum::from(0))).collect();
            let mut nulls: Vec<bool> = row.iter().map(Option::is_none).collect();
            pg_sys::tuplestore_putvalues(store, desc, values.as_mut_ptr(), nulls.as_mut_ptr());
        }
        Datum::from(0)
    }
}
