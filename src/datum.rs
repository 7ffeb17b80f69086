//! Conversions between PostgreSQL datums and Rust values that the SQL
//! boundary and the lease store share.

use crate::args::IntervalValue;
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use pgrx::IntoDatum;
use std::ffi::c_char;

// interval_out is called through DirectFunctionCall; pgrx's binding of it is
// a Rust wrapper, which fmgr cannot take as a function pointer.
unsafe extern "C-unwind" {
    fn interval_out(fcinfo: pg_sys::FunctionCallInfo) -> Datum;
}

/// A `text` datum (palloc'd in the current memory context).
pub fn text_datum(s: &str) -> Datum {
    s.into_datum().expect("text datum")
}

/// A `text` datum's contents.
///
/// # Safety
/// `d` must be a valid, non-NULL text datum.
pub unsafe fn text_value(d: Datum) -> String {
    // SAFETY: the caller passes a text datum; detoasting copies if needed.
    unsafe { <String as pgrx::FromDatum>::from_datum(d, false).unwrap_or_default() }
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

/// An interval datum of `micros` microseconds (palloc'd).
pub fn interval_datum(micros: i64) -> Datum {
    // SAFETY: palloc'd Interval, filled in full.
    unsafe {
        let p = pg_sys::palloc(std::mem::size_of::<pg_sys::Interval>()) as *mut pg_sys::Interval;
        (*p).time = micros;
        (*p).day = 0;
        (*p).month = 0;
        Datum::from(p)
    }
}
