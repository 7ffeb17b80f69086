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

/// A `text` (or `varchar`, `bpchar`) datum's contents. Bytes that are not
/// UTF-8 (possible in a SQL_ASCII database) are replaced, never trusted.
///
/// # Safety
/// `d` must be a valid, non-NULL datum of a varlena text type.
pub unsafe fn text_value(d: Datum) -> String {
    // SAFETY: detoasting returns a varlena of the reported length, valid
    // until the current memory context is reset; the bytes are copied out.
    unsafe {
        let v = pg_sys::pg_detoast_datum_packed(d.cast_mut_ptr::<pg_sys::varlena>());
        let bytes = std::slice::from_raw_parts(
            pgrx::varlena::vardata_any(v) as *const u8,
            pgrx::varlena::varsize_any_exhdr(v),
        );
        String::from_utf8_lossy(bytes).into_owned()
    }
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
