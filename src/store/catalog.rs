//! Binding the extension's SQL objects: the schema `fenced_lock_internal`,
//! the lease table, its indexes, the history and the token sequence, looked
//! up once per backend by name and forgotten on any relcache invalidation of
//! them (DROP/CREATE/ALTER EXTENSION, ALTER ... OWNER, CREATE INDEX ...).
//!
//! Columns are found by name and type, never by position: a table of another
//! shape (an older or newer version of the extension's SQL) is either read
//! correctly or refused with 55000. The catalogs of 0.1.0 (`leases`) and
//! 0.2.0 (`lease_records`: one record per name) are read, so that the guard,
//! `validate` and `assert` keep working until `ALTER EXTENSION ... UPDATE`,
//! but never written.

use super::heap::{column, index_is_plain, table_is_plain};
use super::history::{history_columns, HistoryObjects};
use crate::errors::{sqlstate, FlError};
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};
use std::ffi::CStr;

pub const SCHEMA: &CStr = c"fenced_lock_internal";

/// Attribute numbers (1-based) of the lease table's columns.
#[derive(Clone, Copy)]
pub struct LeaseColumns {
    pub name: i16,
    pub token: i16,
    pub holder: i16,
    pub owner: i16,
    pub acquired_at: i16,
    pub expires_at: i16,
    pub ttl: i16,
    /// absent in the 0.1.0 catalog
    pub session_bound: Option<i16>,
    /// these four are absent before 0.3.0
    pub shared: Option<i16>,
    pub permits: Option<i16>,
    pub pid: Option<i16>,
    pub value: Option<i16>,
}

/// The extension's objects as this backend found them.
#[derive(Clone, Copy)]
pub struct Objects {
    pub table: pg_sys::Oid,
    /// the primary key: (name, token) from 0.3.0 on, (name) before
    pub by_name: pg_sys::Oid,
    /// the index on expires_at of the 0.1.0 and 0.2.0 tables; 0.3.0's has
    /// none (InvalidOid): it holds only records not yet cleaned up, so the
    /// reaper's rare scan reads the table, and no grant pays for an index
    /// entry the lease path never reads
    pub by_expiry: pg_sys::Oid,
    /// partial index of the session-bound records, on token (0.3.0)
    pub by_session: Option<pg_sys::Oid>,
    /// partial index of the records with a holder, on holder (0.3.0)
    pub by_holder: Option<pg_sys::Oid>,
    pub table_owner: pg_sys::Oid,
    pub sequence: pg_sys::Oid,
    pub columns: LeaseColumns,
    pub history: Option<HistoryObjects>,
    /// VACUUM never shrinks the lease table (`vacuum_truncate = false`), so a
    /// remembered tid always names a block of it (`records::record`).
    pub tids_stay_in_range: bool,
    /// The lease table is as installed (no trigger, rule, row security, CHECK
    /// constraint, or index but its own and plain ones): records are written
    /// directly, heap and index, with the two partial indexes' predicates
    /// applied here. Otherwise they go through SQL statements, which do what
    /// this library does not know.
    pub direct: bool,
    /// The catalog this library was built for (0.3.0's).
    pub current: bool,
}

impl Objects {
    fn rels(&self) -> [pg_sys::Oid; 8] {
        let h = self.history.map(|h| [h.table, h.by_ended_at]).unwrap_or_default();
        [
            self.table,
            self.by_name,
            self.by_expiry,
            self.sequence,
            h[0],
            h[1],
            self.by_session.unwrap_or_default(),
            self.by_holder.unwrap_or_default(),
        ]
    }
}

thread_local! {
    static OBJECTS: RefCell<Option<Objects>> = const { RefCell::new(None) };
    /// Bumped each time the objects are forgotten: what other modules remember
    /// about the tables' contents (tuple positions) is only good for one binding.
    static BINDING: Cell<u64> = const { Cell::new(0) };
}

/// From `_PG_init`.
pub fn register() {
    crate::relcache::on_invalidation(forget);
}

fn forget(relid: pg_sys::Oid) {
    OBJECTS.with(|o| {
        let mut o = o.borrow_mut();
        if let Some(known) = *o {
            // An index created on the lease table invalidates the table.
            if relid == pg_sys::InvalidOid || known.rels().contains(&relid) {
                *o = None;
                BINDING.with(|b| b.set(b.get() + 1));
            }
        }
    });
}

/// Which binding of the objects is current (see `BINDING`).
pub fn binding() -> u64 {
    BINDING.with(|b| b.get())
}

fn relid(nsp: pg_sys::Oid, name: &CStr) -> pg_sys::Oid {
    // SAFETY: syscache lookup; InvalidOid when missing.
    unsafe { pg_sys::get_relname_relid(name.as_ptr(), nsp) }
}

fn some(oid: pg_sys::Oid) -> Option<pg_sys::Oid> {
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// The objects, looked up on first use in this backend (or after they were
/// forgotten). Reads work on the 0.1.0 and 0.2.0 catalogs too.
pub fn objects() -> Result<Objects, FlError> {
    if let Some(known) = OBJECTS.with(|o| *o.borrow()) {
        return Ok(known);
    }
    // SAFETY: syscache lookups; missing_ok so a dropped schema gives InvalidOid.
    let nsp = unsafe { pg_sys::get_namespace_oid(SCHEMA.as_ptr(), true) };
    if nsp == pg_sys::InvalidOid {
        return Err(FlError::not_installed("schema fenced_lock_internal"));
    }
    // The lease table was `leases` in 0.1.0 and `lease_records` (one record
    // per name) in 0.2.0; both are read, never written.
    let (table, by_name, by_expiry, current) = match relid(nsp, c"granted_leases") {
        t if t != pg_sys::InvalidOid => (t, relid(nsp, c"granted_leases_pkey"), pg_sys::InvalidOid, true),
        _ => match relid(nsp, c"lease_records") {
            t if t != pg_sys::InvalidOid => {
                (t, relid(nsp, c"lease_records_pkey"), relid(nsp, c"lease_records_expires_at"), false)
            }
            _ => (relid(nsp, c"leases"), relid(nsp, c"leases_pkey"), relid(nsp, c"leases_expires_at"), false),
        },
    };
    let sequence = relid(nsp, c"token_seq");
    if [table, by_name, sequence].contains(&pg_sys::InvalidOid)
        || (!current && by_expiry == pg_sys::InvalidOid)
    {
        return Err(FlError::not_installed("the lease table, its indexes or the token sequence"));
    }
    let col = |name: &str, typ| column(table, name, typ);
    let columns = match (
        col("name", pg_sys::TEXTOID),
        col("token", pg_sys::INT8OID),
        col("holder", pg_sys::TEXTOID),
        col("owner", pg_sys::REGROLEOID),
        col("acquired_at", pg_sys::TIMESTAMPTZOID),
        col("expires_at", pg_sys::TIMESTAMPTZOID),
        col("ttl", pg_sys::INTERVALOID),
    ) {
        (
            Some(name),
            Some(token),
            Some(holder),
            Some(owner),
            Some(acquired_at),
            Some(expires_at),
            Some(ttl),
        ) => LeaseColumns {
            name,
            token,
            holder,
            owner,
            acquired_at,
            expires_at,
            ttl,
            session_bound: col("session_bound", pg_sys::BOOLOID),
            shared: col("shared", pg_sys::BOOLOID),
            permits: col("permits", pg_sys::INT4OID),
            pid: col("pid", pg_sys::INT4OID),
            value: col("value", pg_sys::TEXTOID),
        },
        _ => return Err(catalog_mismatch("the lease table does not have the columns this library reads")),
    };
    let history_table = relid(nsp, c"lease_history");
    let history = some(history_table).map(|table| HistoryObjects {
        table,
        by_ended_at: relid(nsp, c"lease_history_ended_at"),
        ended_at: column(table, "ended_at", pg_sys::TIMESTAMPTZOID).unwrap_or(0),
        direct: history_columns(table).filter(|_| table_is_plain(table, &[])),
    });
    if history.is_some_and(|h| h.by_ended_at == pg_sys::InvalidOid || h.ended_at == 0) {
        return Err(catalog_mismatch("the lease history table does not have the shape this library writes"));
    }
    let by_session = some(relid(nsp, c"granted_leases_session_bound"));
    let by_holder = some(relid(nsp, c"granted_leases_holder"));
    // SAFETY: the relation exists (looked up above); closed at once.
    let (table_owner, tids_stay_in_range) = unsafe {
        let rel = pg_sys::RelationIdGetRelation(table);
        if rel.is_null() {
            return Err(FlError::not_installed("the lease table"));
        }
        let found = ((*(*rel).rd_rel).relowner, crate::compat::vacuum_truncate_disabled(rel));
        pg_sys::RelationClose(rel);
        found
    };
    let own_partial: Vec<pg_sys::Oid> = by_session.into_iter().chain(by_holder).collect();
    let current = current
        && history.is_some()
        && by_session.is_some()
        && by_holder.is_some()
        && columns.session_bound.is_some()
        && columns.shared.is_some()
        && columns.permits.is_some()
        && columns.pid.is_some()
        && columns.value.is_some();
    let found = Objects {
        table,
        by_name,
        by_expiry,
        by_session,
        by_holder,
        table_owner,
        sequence,
        columns,
        history,
        tids_stay_in_range,
        direct: current
            && table_is_plain(table, &own_partial)
            && own_partial.iter().all(|&i| index_is_plain(i, true)),
        current,
    };
    OBJECTS.with(|o| *o.borrow_mut() = Some(found));
    Ok(found)
}

/// The installed SQL objects are not the ones this library was built for.
fn catalog_mismatch(what: &str) -> FlError {
    FlError::new(
        sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "fenced_lock: the extension's SQL objects do not match this library (version {}): {what}",
            env!("CARGO_PKG_VERSION")
        ),
    )
    .hint("Run ALTER EXTENSION fenced_lock UPDATE in this database.")
}

/// Lease changes need the current catalog; reads work on older ones too.
pub fn objects_for_writing() -> Result<Objects, FlError> {
    let objects = objects()?;
    if objects.current {
        Ok(objects)
    } else {
        Err(catalog_mismatch("it is older, and lease changes need the updated objects"))
    }
}
