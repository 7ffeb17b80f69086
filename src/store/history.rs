//! The lease history (`fenced_lock_internal.lease_history`): one row per
//! lease that has ended, written by the transaction that ends it
//! (docs/design.md, "Observability"). This file knows the table's shape;
//! the writer (`writer.rs`) builds and puts in its rows.

use super::heap::{column, live_columns, scan, ScanKey, Tid, Visibility};
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use std::ffi::CString;

/// The history table and its index on `ended_at` (absent in the 0.1.0 catalog).
#[derive(Clone, Copy)]
pub struct HistoryObjects {
    pub table: pg_sys::Oid,
    pub by_ended_at: pg_sys::Oid,
    /// attnum of `ended_at`
    pub ended_at: i16,
    /// The attribute numbers of `HISTORY_COLUMNS`, when the table has
    /// exactly those columns and nothing `heap::insert_row` would skip: rows
    /// are then formed and inserted directly. Otherwise (a table of another
    /// shape, or an operator's trigger or index on it) they go through an
    /// `INSERT`, which does what this library does not know.
    pub direct: Option<[i16; HISTORY_COLUMNS.len()]>,
}

/// How a lease ended, as `lease_history.ended_by` records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Release,
    Expiry,
    ForceRelease,
    SessionEnd,
}

impl Ending {
    pub fn as_str(self) -> &'static str {
        match self {
            Ending::Release => "release",
            Ending::Expiry => "expiry",
            Ending::ForceRelease => "force_release",
            Ending::SessionEnd => "session_end",
        }
    }
}

/// The history table's columns and their types, in the order of the
/// writer's `HISTORY_INSERT` parameters and of the values it builds.
pub const HISTORY_COLUMNS: [(&str, pg_sys::Oid); 12] = [
    ("token", pg_sys::INT8OID),
    ("name", pg_sys::TEXTOID),
    ("holder", pg_sys::TEXTOID),
    ("owner", pg_sys::NAMEOID),
    ("session_bound", pg_sys::BOOLOID),
    ("acquired_at", pg_sys::TIMESTAMPTZOID),
    ("expires_at", pg_sys::TIMESTAMPTZOID),
    ("ended_at", pg_sys::TIMESTAMPTZOID),
    ("ended_by", pg_sys::TEXTOID),
    ("ended_by_role", pg_sys::NAMEOID),
    ("mode", pg_sys::TEXTOID),
    ("permits", pg_sys::INT4OID),
];

/// The attribute numbers of `HISTORY_COLUMNS` in `table`, if it has exactly
/// those columns (by name and type) and no others.
pub fn history_columns(table: pg_sys::Oid) -> Option<[i16; HISTORY_COLUMNS.len()]> {
    let mut found = [0; HISTORY_COLUMNS.len()];
    for (attno, &(name, typ)) in found.iter_mut().zip(HISTORY_COLUMNS.iter()) {
        *attno = column(table, name, typ)?;
    }
    (live_columns(table) == HISTORY_COLUMNS.len()).then_some(found)
}

/// Is the history of ended leases kept (`fenced_lock.history_retention` > 0)?
pub fn kept() -> bool {
    crate::settings::history_retention_seconds() > 0
}

/// History rows of ended leases whose end is before `before`, up to `limit`.
pub fn ended_before(history: &HistoryObjects, before: i64, limit: usize) -> Vec<Tid> {
    let mut out = Vec::new();
    let key = ScanKey {
        attno: history.ended_at,
        strategy: pg_sys::BTLessStrategyNumber,
        procedure: crate::compat::TIMESTAMPTZ_LT,
        argument: Datum::from(before),
    };
    scan(history.table, history.by_ended_at, &[key], limit, Visibility::Committed, |tuple, _, _| {
        // SAFETY: a tuple handed out by the scan.
        out.push(Tid::from_item_pointer(unsafe { &(*tuple).t_self }));
    });
    out
}

/// A `name` datum (palloc'd), for role names in the history.
pub fn name_datum(s: &str) -> Datum {
    let c = CString::new(s.replace('\0', "")).unwrap_or_default();
    // SAFETY: namein copies (and truncates to NAMEDATALEN) into a palloc'd NameData.
    unsafe { pg_sys::DirectFunctionCall1Coll(Some(namein), pg_sys::InvalidOid, Datum::from(c.as_ptr())) }
}

// namein is called through DirectFunctionCall; pgrx's binding of it is a
// Rust wrapper, which fmgr cannot take as a function pointer.
unsafe extern "C-unwind" {
    fn namein(fcinfo: pg_sys::FunctionCallInfo) -> Datum;
}
