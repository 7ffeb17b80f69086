//! Where lease state lives: the tables `fenced_lock_internal.lease_records`
//! (one record per name) and `fenced_lock_internal.lease_history` (one row
//! per lease that has ended), and the sequence
//! `fenced_lock_internal.token_seq`, written only through here
//! (docs/design.md, "Objects").
//!
//! Reads go straight through an index with `SnapshotSelf`, without SPI or a
//! change of user. Writes run as the owner of the lease table, in a
//! security-restricted context, with `search_path` pinned to
//! `pg_catalog, pg_temp` and statements that name every object and operator
//! by schema, so a caller's `search_path` cannot change what they mean.
//!
//! Columns are found by name when the objects are looked up, never by
//! position: a table of another shape (an older or newer version of the
//! extension's SQL) is either read correctly or refused with 55000.

use crate::datum::{interval_value, text_datum, text_value};
use crate::errors::{quote_name, sqlstate, FlError};
use crate::spi::{Connection, Statement};
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString};

pub const SCHEMA: &CStr = c"fenced_lock_internal";

/// Where a record is stored (its `ctid`), as block << 16 | offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tid(pub u64);

impl Tid {
    fn from_item_pointer(p: &pg_sys::ItemPointerData) -> Tid {
        let block = ((p.ip_blkid.bi_hi as u64) << 16) | p.ip_blkid.bi_lo as u64;
        Tid((block << 16) | p.ip_posid as u64)
    }

    fn write(self, p: &mut pg_sys::ItemPointerData) {
        let block = (self.0 >> 16) as u32;
        p.ip_blkid.bi_hi = (block >> 16) as u16;
        p.ip_blkid.bi_lo = (block & 0xFFFF) as u16;
        p.ip_posid = (self.0 & 0xFFFF) as u16;
    }

    /// A `tid` datum (palloc'd in the current memory context).
    fn datum(self) -> Datum {
        // SAFETY: palloc'd ItemPointerData, filled in full.
        unsafe {
            let p = pg_sys::palloc(std::mem::size_of::<pg_sys::ItemPointerData>())
                as *mut pg_sys::ItemPointerData;
            self.write(&mut *p);
            Datum::from(p)
        }
    }

    /// A `tid[]` datum of `tids` (palloc'd).
    fn array_datum(tids: &[Tid]) -> Datum {
        let datums: Vec<Datum> = tids.iter().map(|t| t.datum()).collect();
        // SAFETY: construct_array copies the six-byte by-reference tids.
        unsafe {
            let a = pg_sys::construct_array(
                datums.as_ptr() as *mut Datum,
                datums.len() as i32,
                pg_sys::TIDOID,
                std::mem::size_of::<pg_sys::ItemPointerData>() as i32,
                false,
                pg_sys::TYPALIGN_SHORT as std::ffi::c_char,
            );
            Datum::from(a)
        }
    }
}

/// A lease record as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// where this version of the record is; writes address it by `ctid`
    pub tid: Tid,
    pub name: String,
    pub token: i64,
    pub holder: Option<String>,
    pub owner: pg_sys::Oid,
    /// microseconds since 2000-01-01 (PostgreSQL's TimestampTz)
    pub acquired_at: i64,
    pub expires_at: i64,
    /// the ttl it was granted with, in microseconds
    pub ttl_micros: i64,
    /// ends with the session that acquired it (docs/design.md, "Session-bound leases")
    pub session_bound: bool,
}

impl Lease {
    /// `expires_at` has not passed on the server's clock `now`.
    pub fn unexpired(&self, now: i64) -> bool {
        now < self.expires_at
    }
}

/// The server's clock now (`clock_timestamp()`), never the transaction start.
pub fn now() -> i64 {
    // SAFETY: reads the system clock.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// The role calling us (before any switch to the owner).
pub fn current_role() -> pg_sys::Oid {
    // SAFETY: plain accessor.
    unsafe { pg_sys::GetUserId() }
}

pub fn role_name(role: pg_sys::Oid) -> String {
    // SAFETY: noerr=true returns NULL for a dropped role.
    unsafe {
        let p = pg_sys::GetUserNameFromId(role, true);
        if p.is_null() {
            format!("{}", role.to_u32())
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// May `role` act for leases owned by `owner` (same role or a member of it)?
pub fn acts_for(role: pg_sys::Oid, owner: pg_sys::Oid) -> bool {
    // SAFETY: catalog lookup.
    unsafe { pg_sys::has_privs_of_role(role, owner) }
}

/// Attribute numbers (1-based) of the lease table's columns.
#[derive(Clone, Copy)]
struct LeaseColumns {
    name: i16,
    token: i16,
    holder: i16,
    owner: i16,
    acquired_at: i16,
    expires_at: i16,
    ttl: i16,
    /// absent in the 0.1.0 catalog
    session_bound: Option<i16>,
}

/// The history table and its index on `ended_at` (absent in the 0.1.0 catalog).
#[derive(Clone, Copy)]
struct HistoryObjects {
    table: pg_sys::Oid,
    by_ended_at: pg_sys::Oid,
    /// attnum of `ended_at`
    ended_at: i16,
    /// The attribute numbers of `HISTORY_COLUMNS`, when the table has
    /// exactly those columns and nothing `insert_row` would skip: rows are
    /// then formed and inserted directly. Otherwise (a table of another
    /// shape, or an operator's trigger or index on it) they go through an
    /// `INSERT`, which does what this library does not know.
    direct: Option<[i16; HISTORY_COLUMNS.len()]>,
}

/// The history table's columns and their types, in the order of
/// `HISTORY_INSERT`'s parameters (and of the values `record_end` builds).
const HISTORY_COLUMNS: [(&str, pg_sys::Oid); 10] = [
    ("token", I8),
    ("name", T),
    ("holder", T),
    ("owner", NAME),
    ("session_bound", B),
    ("acquired_at", TS),
    ("expires_at", TS),
    ("ended_at", TS),
    ("ended_by", T),
    ("ended_by_role", NAME),
];

/// The attribute numbers of `HISTORY_COLUMNS` in `table`, if it has exactly
/// those columns (by name and type) and no others.
fn history_columns(table: pg_sys::Oid) -> Option<[i16; HISTORY_COLUMNS.len()]> {
    let mut found = [0; HISTORY_COLUMNS.len()];
    for (attno, &(name, typ)) in found.iter_mut().zip(HISTORY_COLUMNS.iter()) {
        *attno = column(table, name, typ)?;
    }
    (live_columns(table) == HISTORY_COLUMNS.len()).then_some(found)
}

/// Can `insert_row` put rows into `table` with nothing skipped? It runs no
/// executor, so: a plain table without triggers, rules, CHECK constraints or
/// row security, whose indexes (all maintained by `CatalogTupleInsert`) are
/// on plain columns, without a predicate, an exclusion constraint or a
/// deferred check. An expression index would crash it; a partial index
/// would get entries for rows outside its predicate.
fn inserted_plainly(table: pg_sys::Oid) -> bool {
    // SAFETY: relcache lookups, each closed at once; the index list is a
    // list of OIDs (array-based in every supported major) freed here.
    unsafe {
        let rel = pg_sys::RelationIdGetRelation(table);
        if rel.is_null() {
            return false;
        }
        let class = &*(*rel).rd_rel;
        let constr = (*(*rel).rd_att).constr;
        let mut plain = class.relkind == pg_sys::RELKIND_RELATION as std::ffi::c_char
            && !class.relhastriggers
            && !class.relhasrules
            && !class.relrowsecurity
            && (constr.is_null() || (*constr).num_check == 0);
        if plain {
            let indexes = pg_sys::RelationGetIndexList(rel);
            if !indexes.is_null() {
                for cell in std::slice::from_raw_parts((*indexes).elements, (*indexes).length as usize) {
                    let index = pg_sys::RelationIdGetRelation(cell.oid_value);
                    if index.is_null() {
                        plain = false;
                        break;
                    }
                    let form = &*(*index).rd_index;
                    plain &= !form.indisexclusion
                        && form.indimmediate
                        && pg_sys::RelationGetIndexExpressions(index).is_null()
                        && pg_sys::RelationGetIndexPredicate(index).is_null();
                    pg_sys::RelationClose(index);
                }
                pg_sys::list_free(indexes);
            }
        }
        pg_sys::RelationClose(rel);
        plain
    }
}

/// How many columns `table` has that are not dropped (a dropped column's
/// type is InvalidOid).
fn live_columns(table: pg_sys::Oid) -> usize {
    // SAFETY: the relation exists (looked up by the caller); closed at once.
    let natts = unsafe {
        let rel = pg_sys::RelationIdGetRelation(table);
        if rel.is_null() {
            return 0;
        }
        let natts = (*(*rel).rd_att).natts;
        pg_sys::RelationClose(rel);
        natts
    };
    // SAFETY: syscache lookups.
    (1..=natts as i16).filter(|&a| unsafe { pg_sys::get_atttype(table, a) } != pg_sys::InvalidOid).count()
}

/// The extension's objects, looked up once per backend and forgotten on any
/// relcache invalidation of them (DROP/CREATE/ALTER EXTENSION, ALTER ... OWNER).
#[derive(Clone, Copy)]
struct Objects {
    table: pg_sys::Oid,
    by_name: pg_sys::Oid,
    by_expiry: pg_sys::Oid,
    /// partial index of the session-bound records (absent in the 0.1.0 catalog)
    by_session: Option<pg_sys::Oid>,
    table_owner: pg_sys::Oid,
    sequence: pg_sys::Oid,
    columns: LeaseColumns,
    history: Option<HistoryObjects>,
    /// VACUUM never shrinks the lease table (`vacuum_truncate = false`), so a
    /// remembered tid always names a block of it (see `read`).
    tids_stay_in_range: bool,
}

impl Objects {
    fn rels(&self) -> [pg_sys::Oid; 7] {
        let h = self.history.map(|h| [h.table, h.by_ended_at]).unwrap_or_default();
        let s = self.by_session.unwrap_or_default();
        [self.table, self.by_name, self.by_expiry, self.sequence, h[0], h[1], s]
    }

    /// The catalog is the one this library was built for (not 0.1.0's).
    fn current(&self) -> bool {
        self.history.is_some() && self.columns.session_bound.is_some() && self.by_session.is_some()
    }
}

/// At most this many names' record positions are remembered per backend.
const REMEMBERED_TIDS: usize = 4096;

thread_local! {
    static OBJECTS: RefCell<Option<Objects>> = const { RefCell::new(None) };
    /// Where each name's record was last found (see `read`).
    static TIDS: RefCell<HashMap<String, Tid>> = RefCell::new(HashMap::new());
    /// Where the reaper's walk through session-bound records goes on from.
    static SESSION_CURSOR: RefCell<String> = const { RefCell::new(String::new()) };
}

pub fn register() {
    // SAFETY: called once from _PG_init.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(forget_objects), Datum::from(0)) };
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget_objects(_arg: Datum, relid: pg_sys::Oid) {
    OBJECTS.with(|o| {
        let mut o = o.borrow_mut();
        if let Some(known) = *o {
            if relid == pg_sys::InvalidOid || known.rels().contains(&relid) {
                *o = None;
                TIDS.with(|t| t.borrow_mut().clear());
            }
        }
    });
}

fn relid(nsp: pg_sys::Oid, name: &CStr) -> pg_sys::Oid {
    // SAFETY: syscache lookup; InvalidOid when missing.
    unsafe { pg_sys::get_relname_relid(name.as_ptr(), nsp) }
}

/// The attribute number of `column` in `rel`, if it has one of type `typ`.
fn column(rel: pg_sys::Oid, column: &str, typ: pg_sys::Oid) -> Option<i16> {
    let c = CString::new(column).ok()?;
    // SAFETY: syscache lookups; InvalidAttrNumber when missing.
    unsafe {
        let attnum = pg_sys::get_attnum(rel, c.as_ptr());
        (attnum > 0 && pg_sys::get_atttype(rel, attnum) == typ).then_some(attnum)
    }
}

fn objects() -> Result<Objects, FlError> {
    if let Some(known) = OBJECTS.with(|o| *o.borrow()) {
        return Ok(known);
    }
    // SAFETY: syscache lookups; missing_ok so a dropped schema gives InvalidOid.
    let nsp = unsafe { pg_sys::get_namespace_oid(SCHEMA.as_ptr(), true) };
    if nsp == pg_sys::InvalidOid {
        return Err(FlError::not_installed("schema fenced_lock_internal"));
    }
    // 0.1.0 called the lease table `leases`; a 0.1.0 catalog is read (so the
    // guard keeps working until the update) but never written.
    let (table, by_name, by_expiry) = match relid(nsp, c"lease_records") {
        t if t != pg_sys::InvalidOid => {
            (t, relid(nsp, c"lease_records_pkey"), relid(nsp, c"lease_records_expires_at"))
        }
        _ => (relid(nsp, c"leases"), relid(nsp, c"leases_pkey"), relid(nsp, c"leases_expires_at")),
    };
    let sequence = relid(nsp, c"token_seq");
    if [table, by_name, by_expiry, sequence].contains(&pg_sys::InvalidOid) {
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
        },
        _ => return Err(catalog_mismatch("the lease table does not have the columns this library reads")),
    };
    let history_table = relid(nsp, c"lease_history");
    let history = (history_table != pg_sys::InvalidOid).then(|| HistoryObjects {
        table: history_table,
        by_ended_at: relid(nsp, c"lease_history_ended_at"),
        ended_at: column(history_table, "ended_at", pg_sys::TIMESTAMPTZOID).unwrap_or(0),
        direct: history_columns(history_table).filter(|_| inserted_plainly(history_table)),
    });
    if history.is_some_and(|h| h.by_ended_at == pg_sys::InvalidOid || h.ended_at == 0) {
        return Err(catalog_mismatch("the lease history table does not have the shape this library writes"));
    }
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
    let found = Objects {
        table,
        by_name,
        by_expiry,
        by_session: Some(relid(nsp, c"lease_records_session_bound")).filter(|r| *r != pg_sys::InvalidOid),
        table_owner,
        sequence,
        columns,
        history,
        tids_stay_in_range,
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

/// Lease changes need the current catalog; reads work on 0.1.0's too.
fn objects_for_writing() -> Result<Objects, FlError> {
    let objects = objects()?;
    if objects.current() {
        Ok(objects)
    } else {
        Err(catalog_mismatch("it is older (0.1.0), and lease changes need the updated objects"))
    }
}

/// The lease record of `name` in the latest committed state (and this
/// transaction's own changes), whatever the caller's isolation level.
///
/// Uses `SnapshotSelf` (committed as of now, plus this transaction's own
/// changes), not an MVCC snapshot: reads are only ever made with the name
/// lock held (or for `validate`, which promises nothing about ordering), so
/// no transition of the name can be in progress, and "committed as of now" is
/// exactly the latest committed state. This spares taking a snapshot of every
/// backend's state on each guarded write.
///
/// The guard reads a record per row it checks, so the common case is made
/// cheap: each backend remembers where it last found each name's record, and
/// first looks there (one buffer, no index descent). The tuple there is the
/// current record exactly when `SnapshotSelf` sees it and it carries the
/// name: a record that was replaced, deleted or moved is no longer visible at
/// its old place (and a reused slot holds another name), and then the index
/// is asked. The place is only trusted while the table cannot shrink
/// (`vacuum_truncate = false`; a rewrite gives it a new file and sends the
/// relcache invalidation that forgets every remembered place).
pub fn read(name: &str) -> Result<Option<Lease>, FlError> {
    let objects = objects()?;
    if objects.tids_stay_in_range {
        if let Some(tid) = TIDS.with(|t| t.borrow().get(name).copied()) {
            if let Some(lease) = fetch_at(&objects, tid, name) {
                return Ok(Some(lease));
            }
        }
    }
    let found = read_by_index(&objects, name);
    if objects.tids_stay_in_range {
        TIDS.with(|t| {
            let mut t = t.borrow_mut();
            match &found {
                Some(lease) => {
                    if t.len() >= REMEMBERED_TIDS {
                        t.clear();
                    }
                    t.insert(name.to_string(), lease.tid);
                }
                None => {
                    t.remove(name);
                }
            }
        });
    }
    Ok(found)
}

/// The record of `name` at `tid`, if the tuple there is that name's current record.
fn fetch_at(objects: &Objects, tid: Tid, name: &str) -> Option<Lease> {
    // SAFETY: the table exists and cannot have shrunk below `tid` (see
    // `read`); the tuple is copied out (`lease_of`) before its buffer is
    // released.
    unsafe {
        let rel = pg_sys::table_open(objects.table, pg_sys::AccessShareLock as i32);
        let mut tuple: pg_sys::HeapTupleData = std::mem::zeroed();
        tid.write(&mut tuple.t_self);
        let mut buffer: pg_sys::Buffer = 0;
        let mut found = None;
        if crate::compat::heap_fetch(rel, &raw mut pg_sys::SnapshotSelfData, &mut tuple, &mut buffer) {
            let lease = lease_of(&objects.columns, &mut tuple, (*rel).rd_att);
            if lease.name == name {
                found = Some(lease);
            }
            pg_sys::ReleaseBuffer(buffer);
        }
        pg_sys::table_close(rel, pg_sys::NoLock as i32);
        found
    }
}

fn read_by_index(objects: &Objects, name: &str) -> Option<Lease> {
    let mut found = None;
    // ScanKeyInit compares with the C collation, the key column's own.
    let key = ScanKey {
        attno: objects.columns.name,
        strategy: pg_sys::BTEqualStrategyNumber,
        procedure: pg_sys::F_TEXTEQ,
        argument: text_datum(name),
    };
    scan(objects.table, objects.by_name, key, 1, |tuple, desc| {
        found = Some(lease_of(&objects.columns, tuple, desc))
    });
    found
}

/// The names of up to `limit` records that expired before `before`, oldest first.
fn expired_names(objects: &Objects, before: i64, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let key = ScanKey {
        attno: objects.columns.expires_at,
        strategy: pg_sys::BTLessStrategyNumber,
        procedure: crate::compat::TIMESTAMPTZ_LT,
        argument: Datum::from(before),
    };
    scan(objects.table, objects.by_expiry, key, limit, |tuple, desc| {
        let row = Row::deform(tuple, desc);
        // SAFETY: `name` is a non-NULL text column.
        out.push(unsafe { text_value(row.value(objects.columns.name)) });
    });
    out
}

/// Up to `limit` session-bound records (name, token), for the reaper, read
/// through their partial index from where the previous call stopped, so that
/// every such record comes round however many there are.
fn session_bound_names(objects: &Objects, limit: usize) -> Vec<(String, i64)> {
    let Some(by_session) = objects.by_session else { return Vec::new() };
    let from = SESSION_CURSOR.with(|c| c.borrow().clone());
    let mut out = Vec::new();
    let key = ScanKey {
        attno: objects.columns.name,
        strategy: pg_sys::BTGreaterStrategyNumber,
        procedure: pg_sys::F_TEXT_GT,
        argument: text_datum(&from),
    };
    scan(objects.table, by_session, key, limit, |tuple, desc| {
        let lease = lease_of(&objects.columns, tuple, desc);
        out.push((lease.name, lease.token));
    });
    let next = if out.len() < limit {
        String::new()
    } else {
        out.last().map(|(n, _)| n.clone()).unwrap_or_default()
    };
    SESSION_CURSOR.with(|c| *c.borrow_mut() = next);
    out
}

/// History rows of ended leases whose end is before `before`, up to `limit`.
fn ended_history(history: &HistoryObjects, before: i64, limit: usize) -> Vec<Tid> {
    let mut out = Vec::new();
    let key = ScanKey {
        attno: history.ended_at,
        strategy: pg_sys::BTLessStrategyNumber,
        procedure: crate::compat::TIMESTAMPTZ_LT,
        argument: Datum::from(before),
    };
    scan(history.table, history.by_ended_at, key, limit, |tuple, _| {
        // SAFETY: a tuple handed out by the scan.
        out.push(Tid::from_item_pointer(unsafe { &(*tuple).t_self }));
    });
    out
}

struct ScanKey {
    attno: i16,
    strategy: u32,
    procedure: u32,
    argument: Datum,
}

/// Scan `table` through `index` for `key` (its `attno` is the table's column;
/// systable_beginscan maps it to the index's) with `SnapshotSelf`, in index
/// order, handing up to `limit` tuples to `each`.
fn scan(
    table: pg_sys::Oid,
    index: pg_sys::Oid,
    key: ScanKey,
    limit: usize,
    mut each: impl FnMut(pg_sys::HeapTuple, pg_sys::TupleDesc),
) {
    // SAFETY: the table and index exist (looked up by `objects`, and any DROP
    // invalidates that cache); AccessShareLock keeps them until commit. `each`
    // copies what it keeps before the scan moves on.
    unsafe {
        let rel = pg_sys::table_open(table, pg_sys::AccessShareLock as i32);
        let mut skey: pg_sys::ScanKeyData = std::mem::zeroed();
        pg_sys::ScanKeyInit(
            &mut skey,
            key.attno,
            key.strategy as u16,
            pg_sys::Oid::from(key.procedure),
            key.argument,
        );
        let scan =
            pg_sys::systable_beginscan(rel, index, true, &raw mut pg_sys::SnapshotSelfData, 1, &mut skey);
        let mut seen = 0;
        while seen < limit {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            seen += 1;
            each(tuple, (*rel).rd_att);
        }
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, pg_sys::NoLock as i32);
    }
}

/// A deformed tuple: one value and null flag per attribute of its
/// descriptor, however many that is.
struct Row {
    values: Vec<Datum>,
    nulls: Vec<bool>,
}

impl Row {
    fn deform(tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc) -> Row {
        // SAFETY: the arrays have exactly natts entries, as heap_deform_tuple
        // writes; pass-by-reference values point into the tuple, which the
        // caller keeps until it has copied them.
        unsafe {
            let natts = (*desc).natts as usize;
            let mut row = Row { values: vec![Datum::from(0); natts], nulls: vec![true; natts] };
            pg_sys::heap_deform_tuple(tuple, desc, row.values.as_mut_ptr(), row.nulls.as_mut_ptr());
            row
        }
    }

    fn is_null(&self, attno: i16) -> bool {
        self.nulls.get(attno as usize - 1).copied().unwrap_or(true)
    }

    fn value(&self, attno: i16) -> Datum {
        self.values[attno as usize - 1]
    }
}

fn lease_of(c: &LeaseColumns, tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc) -> Lease {
    let row = Row::deform(tuple, desc);
    // SAFETY: the columns were checked by name and type in `objects`; NOT
    // NULL columns are read as values, holder only when not NULL.
    unsafe {
        Lease {
            tid: Tid::from_item_pointer(&(*tuple).t_self),
            name: text_value(row.value(c.name)),
            token: row.value(c.token).value() as i64,
            holder: (!row.is_null(c.holder)).then(|| text_value(row.value(c.holder))),
            owner: pg_sys::Oid::from(row.value(c.owner).value() as u32),
            acquired_at: row.value(c.acquired_at).value() as i64,
            expires_at: row.value(c.expires_at).value() as i64,
            ttl_micros: interval_value(row.value(c.ttl)).total_micros().clamp(0, i64::MAX as i128) as i64,
            session_bound: c.session_bound.is_some_and(|a| !row.is_null(a) && row.value(a).value() != 0),
        }
    }
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

/// A new lease to record.
pub struct Grant<'a> {
    pub name: &'a str,
    pub token: i64,
    pub holder: Option<&'a str>,
    pub owner: pg_sys::Oid,
    pub now: i64,
    pub ttl_micros: i64,
    pub session_bound: bool,
}

/// An open session on the lease state, running as the table's owner with a
/// safe `search_path` until dropped.
pub struct Store {
    spi: Connection,
    objects: Objects,
    saved_user: pg_sys::Oid,
    saved_context: i32,
    guc_nest_level: i32,
}

impl Store {
    pub fn open() -> Result<Store, FlError> {
        let objects = objects_for_writing()?;
        crate::fence::forget_checks();
        let mut saved_user = pg_sys::InvalidOid;
        let mut saved_context = 0;
        // SAFETY: save and switch the current user, and push a GUC nest level
        // for search_path, as contrib/amcheck does around its checks; both are
        // restored in Drop, and by PostgreSQL's abort processing on error.
        let guc_nest_level = unsafe {
            pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
            pg_sys::SetUserIdAndSecContext(
                objects.table_owner,
                saved_context
                    | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32
                    | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,
            );
            let level = pg_sys::NewGUCNestLevel();
            pg_sys::set_config_option(
                c"search_path".as_ptr(),
                c"pg_catalog, pg_temp".as_ptr(),
                pg_sys::GucContext::PGC_USERSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
            level
        };
        Ok(Store { spi: Connection::open(), objects, saved_user, saved_context, guc_nest_level })
    }

    pub fn next_token(&self) -> Result<i64, FlError> {
        crate::token::next_token(&self.spi, self.objects.sequence)
    }

    /// Record a new lease, replacing the (ended) record at `replaces` if
    /// there is one. Live leases are not in the history table: the history
    /// view shows them from their records (docs/design.md, "Observability").
    pub fn grant(&self, g: &Grant, replaces: Option<Tid>) -> Result<(), FlError> {
        let mut args = vec![
            Some(text_datum(g.name)),
            Some(Datum::from(g.token)),
            g.holder.map(text_datum),
            Some(Datum::from(g.owner)),
            Some(Datum::from(g.now)),
            Some(Datum::from(expiry(g.now, g.ttl_micros))),
            Some(crate::datum::interval_datum(g.ttl_micros)),
            Some(Datum::from(g.session_bound)),
        ];
        let stmt = match replaces {
            Some(tid) => {
                args.push(Some(tid.datum()));
                &REGRANT
            }
            None => &INSERT,
        };
        expect_one(self.spi.run(stmt, &args), g.name)
    }

    /// Move the expiry of `lease` to `now + ttl`. The ttl the lease was
    /// granted with stays recorded: `renew(name, token)` keeps using it.
    pub fn extend(&self, name: &str, lease: &Lease, now: i64, ttl_micros: i64) -> Result<(), FlError> {
        let args = [Some(lease.tid.datum()), Some(Datum::from(expiry(now, ttl_micros)))];
        expect_one(self.spi.run(&EXTEND, &args), name)
    }

    /// Remove the record of `lease`, which ended as `ending` at `ended_at`
    /// (by `role`, for a release or force release), and write its history
    /// row.
    pub fn end(
        &self,
        name: &str,
        lease: &Lease,
        ending: Ending,
        ended_at: i64,
        role: Option<pg_sys::Oid>,
    ) -> Result<(), FlError> {
        expect_one(self.spi.run(&DELETE, &[Some(lease.tid.datum())]), name)?;
        self.record_end(lease, ending, ended_at, role);
        Ok(())
    }

    /// Write the history row of `lease`, which ended as `ending` at
    /// `ended_at` (its record is being deleted, or overwritten by a grant).
    pub fn record_end(&self, lease: &Lease, ending: Ending, ended_at: i64, role: Option<pg_sys::Oid>) {
        if !history_kept() {
            return;
        }
        // In the order of HISTORY_COLUMNS.
        let values = [
            Some(Datum::from(lease.token)),
            Some(text_datum(&lease.name)),
            lease.holder.as_deref().map(text_datum),
            Some(name_datum(&role_name(lease.owner))),
            Some(Datum::from(lease.session_bound)),
            Some(Datum::from(lease.acquired_at)),
            Some(Datum::from(lease.expires_at)),
            Some(Datum::from(ended_at)),
            Some(text_datum(ending.as_str())),
            role.map(|r| name_datum(&role_name(r))),
        ];
        let history = self.objects.history.expect("current catalog");
        match history.direct {
            Some(attnos) => insert_row(history.table, &attnos, &values),
            None => {
                self.spi.run(&HISTORY_INSERT, &values);
            }
        }
    }

    /// Up to `limit` names whose records expired before `before`.
    pub fn expired_names(&self, before: i64, limit: usize) -> Vec<String> {
        expired_names(&self.objects, before, limit)
    }

    /// Up to `limit` names with session-bound records, and their tokens.
    pub fn session_bound_names(&self, limit: usize) -> Vec<(String, i64)> {
        session_bound_names(&self.objects, limit)
    }

    /// Delete up to `limit` history rows that ended before `before`.
    pub fn prune_history(&self, before: i64, limit: usize) -> usize {
        let history = self.objects.history.expect("current catalog");
        let tids = ended_history(&history, before, limit);
        if !tids.is_empty() {
            self.spi.run(&HISTORY_PRUNE, &[Some(Tid::array_datum(&tids))]);
        }
        tids.len()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: restores what `open` saved, in reverse order.
        unsafe {
            pg_sys::AtEOXact_GUC(false, self.guc_nest_level);
            pg_sys::SetUserIdAndSecContext(self.saved_user, self.saved_context);
        }
    }
}

/// Insert one row into `table` (`values[i]` into attribute `attnos[i]`,
/// `None` is NULL; columns not given are NULL), with its index entries, as PostgreSQL
/// writes its own catalogs: no executor, so no triggers and no constraint
/// checks beyond the unique indexes. The caller gives every NOT NULL column
/// and has made sure with `inserted_plainly` that nothing is skipped.
fn insert_row(table: pg_sys::Oid, attnos: &[i16], values: &[Option<Datum>]) {
    // SAFETY: `table` exists (looked up by `objects`, which any DDL on it
    // invalidates); the arrays have one entry per attribute of its
    // descriptor, and the datums are of the columns' types (checked by name
    // and type in `objects`). RowExclusiveLock, as an INSERT takes, is kept
    // until commit.
    unsafe {
        let rel = pg_sys::table_open(table, pg_sys::RowExclusiveLock as i32);
        let desc = (*rel).rd_att;
        let natts = (*desc).natts as usize;
        let mut datums = vec![Datum::from(0); natts];
        let mut nulls = vec![true; natts];
        for (&attno, &value) in attnos.iter().zip(values) {
            if let Some(d) = value {
                datums[attno as usize - 1] = d;
                nulls[attno as usize - 1] = false;
            }
        }
        let tuple = pg_sys::heap_form_tuple(desc, datums.as_mut_ptr(), nulls.as_mut_ptr());
        pg_sys::CatalogTupleInsert(rel, tuple);
        pg_sys::heap_freetuple(tuple);
        pg_sys::table_close(rel, pg_sys::NoLock as i32);
        // Visible to the next statement and to later reads, as after SPI.
        pg_sys::CommandCounterIncrement();
    }
}

/// Are history rows formed and inserted directly (not by `INSERT`)?
#[cfg(any(test, feature = "pg_test"))]
pub(crate) fn history_inserted_directly() -> bool {
    objects().ok().and_then(|o| o.history).is_some_and(|h| h.direct.is_some())
}

/// Is the history of ended leases kept (`fenced_lock.history_retention` > 0)?
fn history_kept() -> bool {
    crate::settings::history_retention_seconds() > 0
}

fn expiry(now: i64, ttl_micros: i64) -> i64 {
    now.saturating_add(ttl_micros)
}

/// A `name` datum (palloc'd), for role names in the history.
fn name_datum(s: &str) -> Datum {
    let c = CString::new(s.replace('\0', "")).unwrap_or_default();
    // SAFETY: namein copies (and truncates to NAMEDATALEN) into a palloc'd NameData.
    unsafe { pg_sys::DirectFunctionCall1Coll(Some(namein), pg_sys::InvalidOid, Datum::from(c.as_ptr())) }
}

// namein is called through DirectFunctionCall; pgrx's binding of it is a
// Rust wrapper, which fmgr cannot take as a function pointer.
unsafe extern "C-unwind" {
    fn namein(fcinfo: pg_sys::FunctionCallInfo) -> Datum;
}

/// A write we decided on under the name lock must hit exactly one row. If it
/// does not, the caller's snapshot rules hid the row from the statement: fail
/// as a serialization failure, which is safe to retry.
fn expect_one(n: usize, name: &str) -> Result<(), FlError> {
    if n == 1 {
        Ok(())
    } else {
        Err(FlError::new(
            sqlstate::SERIALIZATION_FAILURE,
            format!("fenced_lock: lease record of lock {} changed concurrently", quote_name(name)),
        )
        .hint("Retry the transaction."))
    }
}

const T: pg_sys::Oid = pg_sys::TEXTOID;
const I8: pg_sys::Oid = pg_sys::INT8OID;
const TS: pg_sys::Oid = pg_sys::TIMESTAMPTZOID;
const IV: pg_sys::Oid = pg_sys::INTERVALOID;
const ROLE: pg_sys::Oid = pg_sys::REGROLEOID;
const TID: pg_sys::Oid = pg_sys::TIDOID;
const B: pg_sys::Oid = pg_sys::BOOLOID;
const NAME: pg_sys::Oid = pg_sys::NAMEOID;

static INSERT: Statement = Statement {
    sql: "INSERT INTO fenced_lock_internal.lease_records \
          (name, token, holder, owner, acquired_at, expires_at, ttl, session_bound) \
          VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    args: &[T, I8, T, ROLE, TS, TS, IV, B],
};

static REGRANT: Statement = Statement {
    sql: "UPDATE fenced_lock_internal.lease_records SET name = $1, token = $2, holder = $3, owner = $4, \
          acquired_at = $5, expires_at = $6, ttl = $7, session_bound = $8 WHERE ctid OPERATOR(pg_catalog.=) $9",
    args: &[T, I8, T, ROLE, TS, TS, IV, B, TID],
};

static EXTEND: Statement = Statement {
    sql: "UPDATE fenced_lock_internal.lease_records SET expires_at = $2 WHERE ctid OPERATOR(pg_catalog.=) $1",
    args: &[TID, TS],
};

static DELETE: Statement = Statement {
    sql: "DELETE FROM fenced_lock_internal.lease_records WHERE ctid OPERATOR(pg_catalog.=) $1",
    args: &[TID],
};

static HISTORY_INSERT: Statement = Statement {
    sql: "INSERT INTO fenced_lock_internal.lease_history \
          (token, name, holder, owner, session_bound, acquired_at, expires_at, ended_at, ended_by, ended_by_role) \
          VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    args: &[I8, T, T, NAME, B, TS, TS, TS, T, NAME], // HISTORY_COLUMNS' types
};

static HISTORY_PRUNE: Statement = Statement {
    sql: "DELETE FROM fenced_lock_internal.lease_history WHERE ctid OPERATOR(pg_catalog.=) ANY ($1)",
    args: &[pg_sys::TIDARRAYOID],
};
