//! Raw heap and index access for the store: tuple positions, index scans,
//! deformed rows, and writing rows with their index entries the way
//! PostgreSQL writes its own catalogs. No SQL, no executor, no permission
//! checks: callers have made sure the relations are the ones they expect
//! (`catalog.rs`), and that nothing the executor would do is skipped
//! (`table_is_plain`).

use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use std::ffi::CString;

/// Where a tuple is stored (its `ctid`), as block << 16 | offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Tid(pub u64);

impl Tid {
    pub fn from_item_pointer(p: &pg_sys::ItemPointerData) -> Tid {
        let block = ((p.ip_blkid.bi_hi as u64) << 16) | p.ip_blkid.bi_lo as u64;
        Tid((block << 16) | p.ip_posid as u64)
    }

    pub fn write(self, p: &mut pg_sys::ItemPointerData) {
        let block = (self.0 >> 16) as u32;
        p.ip_blkid.bi_hi = (block >> 16) as u16;
        p.ip_blkid.bi_lo = (block & 0xFFFF) as u16;
        p.ip_posid = (self.0 & 0xFFFF) as u16;
    }

    /// A `tid` datum (palloc'd in the current memory context).
    pub fn datum(self) -> Datum {
        // SAFETY: palloc'd ItemPointerData, filled in full.
        unsafe {
            let p = pg_sys::palloc(std::mem::size_of::<pg_sys::ItemPointerData>())
                as *mut pg_sys::ItemPointerData;
            self.write(&mut *p);
            Datum::from(p)
        }
    }

    /// A `tid[]` datum of `tids` (palloc'd).
    pub fn array_datum(tids: &[Tid]) -> Datum {
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

/// One index scan key: the table's column `attno` compared with `argument`.
pub struct ScanKey {
    pub attno: i16,
    pub strategy: u32,
    pub procedure: u32,
    pub argument: Datum,
}

/// Which tuples a scan sees.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Visibility {
    /// What is committed now, plus this transaction's own changes (`SnapshotSelf`).
    Committed,
    /// That, plus what other transactions are inserting or deleting right now
    /// (`SnapshotDirty`), each tuple told with the transactions in progress.
    WithInProgress,
}

/// Other transactions at work on a tuple seen `WithInProgress`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InProgress {
    /// it is being inserted by this transaction, not yet committed
    pub inserting: Option<pg_sys::TransactionId>,
    /// it is being deleted (or updated) by this transaction
    pub deleting: Option<pg_sys::TransactionId>,
}

fn valid(xid: pg_sys::TransactionId) -> Option<pg_sys::TransactionId> {
    (xid != pg_sys::InvalidTransactionId).then_some(xid)
}

/// Scan `table` through `index` for `keys` (their `attno`s are the table's
/// columns; systable_beginscan maps them to the index's), in index order,
/// handing up to `limit` tuples to `each`.
pub fn scan(
    table: pg_sys::Oid,
    index: pg_sys::Oid,
    keys: &[ScanKey],
    limit: usize,
    visibility: Visibility,
    mut each: impl FnMut(pg_sys::HeapTuple, pg_sys::TupleDesc, InProgress),
) {
    // SAFETY: the table and index exist (looked up by `catalog::objects`, and
    // any DROP invalidates that cache); AccessShareLock keeps them until
    // commit. `each` copies what it keeps before the scan moves on. A dirty
    // snapshot is a plain struct the scan fills in for each tuple.
    unsafe {
        let rel = pg_sys::table_open(table, pg_sys::AccessShareLock as i32);
        let mut skeys: Vec<pg_sys::ScanKeyData> = keys
            .iter()
            .map(|k| {
                let mut skey: pg_sys::ScanKeyData = std::mem::zeroed();
                pg_sys::ScanKeyInit(
                    &mut skey,
                    k.attno,
                    k.strategy as u16,
                    pg_sys::Oid::from(k.procedure),
                    k.argument,
                );
                skey
            })
            .collect();
        let mut dirty = pg_sys::SnapshotData {
            snapshot_type: pg_sys::SnapshotType::SNAPSHOT_DIRTY,
            ..Default::default()
        };
        let snapshot: pg_sys::Snapshot = match visibility {
            Visibility::Committed => &raw mut pg_sys::SnapshotSelfData,
            Visibility::WithInProgress => &mut dirty,
        };
        // Without an index (InvalidOid) systable_beginscan reads the heap,
        // testing the keys on each tuple.
        let by_index = index != pg_sys::InvalidOid;
        let scan = pg_sys::systable_beginscan(
            rel,
            index,
            by_index,
            snapshot,
            skeys.len() as i32,
            skeys.as_mut_ptr(),
        );
        let mut seen = 0;
        while seen < limit {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            seen += 1;
            let in_progress = match visibility {
                Visibility::Committed => InProgress::default(),
                Visibility::WithInProgress => {
                    InProgress { inserting: valid((*snapshot).xmin), deleting: valid((*snapshot).xmax) }
                }
            };
            each(tuple, (*rel).rd_att, in_progress);
        }
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, pg_sys::NoLock as i32);
    }
}

/// The tuple of `table` at `tid`, handed to `each`, if `SnapshotSelf` sees it.
///
/// # Safety
/// `table` cannot have shrunk below `tid` (the caller knows it never shrinks).
pub unsafe fn fetch<T>(
    table: pg_sys::Oid,
    tid: Tid,
    each: impl FnOnce(pg_sys::HeapTuple, pg_sys::TupleDesc) -> T,
) -> Option<T> {
    // SAFETY: as the caller promises; the buffer stays pinned while `each`
    // copies what it keeps, and is released after.
    unsafe {
        let rel = pg_sys::table_open(table, pg_sys::AccessShareLock as i32);
        let mut tuple: pg_sys::HeapTupleData = std::mem::zeroed();
        tid.write(&mut tuple.t_self);
        let mut buffer: pg_sys::Buffer = 0;
        let mut found = None;
        if crate::compat::heap_fetch(rel, &raw mut pg_sys::SnapshotSelfData, &mut tuple, &mut buffer) {
            found = Some(each(&mut tuple, (*rel).rd_att));
            pg_sys::ReleaseBuffer(buffer);
        }
        pg_sys::table_close(rel, pg_sys::NoLock as i32);
        found
    }
}

/// A deformed tuple: one value and null flag per attribute of its
/// descriptor, however many that is.
pub struct Row {
    values: Vec<Datum>,
    nulls: Vec<bool>,
}

impl Row {
    pub fn deform(tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc) -> Row {
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

    pub fn is_null(&self, attno: i16) -> bool {
        self.nulls.get(attno as usize - 1).copied().unwrap_or(true)
    }

    pub fn value(&self, attno: i16) -> Datum {
        self.values[attno as usize - 1]
    }
}

/// Values for the columns of `table`'s descriptor: `given[i]` (`None` is
/// NULL) goes into attribute `attnos[i]`; columns not given are NULL.
unsafe fn full_row(
    desc: pg_sys::TupleDesc,
    attnos: &[i16],
    given: &[Option<Datum>],
) -> (Vec<Datum>, Vec<bool>) {
    // SAFETY: a valid descriptor.
    let natts = unsafe { (*desc).natts } as usize;
    let mut datums = vec![Datum::from(0); natts];
    let mut nulls = vec![true; natts];
    for (&attno, &value) in attnos.iter().zip(given) {
        if let Some(d) = value {
            datums[attno as usize - 1] = d;
            nulls[attno as usize - 1] = false;
        }
    }
    (datums, nulls)
}

/// Insert one row into `table` with its index entries, as PostgreSQL writes
/// its own catalogs (`CatalogTupleInsert`). The caller gives every NOT NULL
/// column and has made sure with `table_is_plain(table, &[])` that nothing
/// is skipped.
pub fn insert_row(table: pg_sys::Oid, attnos: &[i16], values: &[Option<Datum>]) {
    // SAFETY: `table` exists (looked up by `catalog::objects`, which any DDL
    // on it invalidates); the arrays have one entry per attribute of its
    // descriptor, and the datums are of the columns' types (checked by name
    // and type in `catalog::objects`). RowExclusiveLock, as an INSERT takes,
    // is kept until commit.
    unsafe {
        let rel = pg_sys::table_open(table, pg_sys::RowExclusiveLock as i32);
        let (mut datums, mut nulls) = full_row((*rel).rd_att, attnos, values);
        let tuple = pg_sys::heap_form_tuple((*rel).rd_att, datums.as_mut_ptr(), nulls.as_mut_ptr());
        pg_sys::CatalogTupleInsert(rel, tuple);
        pg_sys::heap_freetuple(tuple);
        pg_sys::table_close(rel, pg_sys::NoLock as i32);
        // Visible to the next statement and to later reads, as after SPI.
        pg_sys::CommandCounterIncrement();
    }
}

/// Insert one row into `table` and its entries into the indexes for which
/// `indexed(index)` says so (partial indexes: the caller applies their
/// predicates). Returns where the row went.
pub fn insert_with_indexes(
    table: pg_sys::Oid,
    attnos: &[i16],
    values: &[Option<Datum>],
    indexed: impl Fn(pg_sys::Oid) -> bool,
) -> Tid {
    // SAFETY: as in `insert_row`; the caller checked `table_is_plain` with
    // the partial indexes `indexed` decides for.
    unsafe {
        let rel = pg_sys::table_open(table, pg_sys::RowExclusiveLock as i32);
        let (mut datums, mut nulls) = full_row((*rel).rd_att, attnos, values);
        let tuple = pg_sys::heap_form_tuple((*rel).rd_att, datums.as_mut_ptr(), nulls.as_mut_ptr());
        pg_sys::simple_heap_insert(rel, tuple);
        index_entries(rel, tuple, &datums, &nulls, &indexed);
        let tid = Tid::from_item_pointer(&(*tuple).t_self);
        pg_sys::heap_freetuple(tuple);
        pg_sys::table_close(rel, pg_sys::NoLock as i32);
        pg_sys::CommandCounterIncrement();
        tid
    }
}

/// Replace columns of the row at `tid` (`(attno, value)`, `None` is NULL),
/// adding index entries for the new version unless the update was HOT.
/// Returns where the new version is. The caller holds what keeps anyone
/// else from changing this row (its lease lock).
pub fn update_columns(
    table: pg_sys::Oid,
    tid: Tid,
    replace: &[(i16, Option<Datum>)],
    indexed: impl Fn(pg_sys::Oid) -> bool,
) -> Tid {
    // SAFETY: `tid` was found by a scan of this transaction and nobody else
    // may change the row (the caller's lock); the arrays have one entry per
    // attribute; simple_heap_update raises an error rather than overwrite a
    // concurrent change.
    unsafe {
        let rel = pg_sys::table_open(table, pg_sys::RowExclusiveLock as i32);
        let desc = (*rel).rd_att;
        let natts = (*desc).natts as usize;
        let mut old: pg_sys::HeapTupleData = std::mem::zeroed();
        tid.write(&mut old.t_self);
        let mut buffer: pg_sys::Buffer = 0;
        if !crate::compat::heap_fetch(rel, &raw mut pg_sys::SnapshotSelfData, &mut old, &mut buffer) {
            pgrx::error!("fenced_lock: lease record at {:?} vanished under its lock", tid);
        }
        let mut values = vec![Datum::from(0); natts];
        let mut nulls = vec![false; natts];
        let mut replaces = vec![false; natts];
        for &(attno, value) in replace {
            let i = attno as usize - 1;
            replaces[i] = true;
            match value {
                Some(d) => values[i] = d,
                None => nulls[i] = true,
            }
        }
        let new = pg_sys::heap_modify_tuple(
            &mut old,
            desc,
            values.as_mut_ptr(),
            nulls.as_mut_ptr(),
            replaces.as_mut_ptr(),
        );
        pg_sys::ReleaseBuffer(buffer);
        let mut otid = old.t_self;
        if crate::compat::simple_heap_update(rel, &mut otid, new) {
            let (mut datums, mut isnull) = (vec![Datum::from(0); natts], vec![true; natts]);
            pg_sys::heap_deform_tuple(new, desc, datums.as_mut_ptr(), isnull.as_mut_ptr());
            index_entries(rel, new, &datums, &isnull, &indexed);
        }
        let moved = Tid::from_item_pointer(&(*new).t_self);
        pg_sys::heap_freetuple(new);
        pg_sys::table_close(rel, pg_sys::NoLock as i32);
        pg_sys::CommandCounterIncrement();
        moved
    }
}

/// Delete the row at `tid`. The caller holds what keeps anyone else from
/// changing this row.
pub fn delete_row(table: pg_sys::Oid, tid: Tid) {
    // SAFETY: as in `update_columns`; simple_heap_delete raises an error
    // rather than delete a row someone else changed.
    unsafe {
        let rel = pg_sys::table_open(table, pg_sys::RowExclusiveLock as i32);
        let mut t: pg_sys::ItemPointerData = std::mem::zeroed();
        tid.write(&mut t);
        pg_sys::simple_heap_delete(rel, &mut t);
        pg_sys::table_close(rel, pg_sys::NoLock as i32);
        pg_sys::CommandCounterIncrement();
    }
}

/// Index entries for `tuple` (whose deformed values are `datums`/`nulls`)
/// in every index of `rel` that `indexed` accepts.
///
/// # Safety
/// `rel` is open with RowExclusiveLock; its indexes are plain (no
/// expressions), as `table_is_plain` checked.
unsafe fn index_entries(
    rel: pg_sys::Relation,
    tuple: pg_sys::HeapTuple,
    datums: &[Datum],
    nulls: &[bool],
    indexed: &dyn Fn(pg_sys::Oid) -> bool,
) {
    // SAFETY: as the caller promises; each index is opened and closed here,
    // its key columns read from its IndexInfo.
    unsafe {
        let list = pg_sys::RelationGetIndexList(rel);
        if list.is_null() {
            return;
        }
        for cell in std::slice::from_raw_parts((*list).elements, (*list).length as usize) {
            let oid = cell.oid_value;
            if !indexed(oid) {
                continue;
            }
            let index = pg_sys::index_open(oid, pg_sys::RowExclusiveLock as i32);
            let info = pg_sys::BuildIndexInfo(index);
            let n = (*info).ii_NumIndexAttrs as usize;
            let mut values = vec![Datum::from(0); n];
            let mut isnull = vec![true; n];
            for k in 0..n {
                let attno = (*info).ii_IndexAttrNumbers[k] as usize;
                values[k] = datums[attno - 1];
                isnull[k] = nulls[attno - 1];
            }
            let unique = if (*(*index).rd_index).indisunique {
                pg_sys::IndexUniqueCheck::UNIQUE_CHECK_YES
            } else {
                pg_sys::IndexUniqueCheck::UNIQUE_CHECK_NO
            };
            crate::compat::index_insert(
                index,
                values.as_mut_ptr(),
                isnull.as_mut_ptr(),
                &mut (*tuple).t_self,
                rel,
                unique,
                info,
            );
            pg_sys::index_close(index, pg_sys::NoLock as i32);
        }
        pg_sys::list_free(list);
    }
}

/// The attribute number of `column` in `rel`, if it has one of type `typ`.
pub fn column(rel: pg_sys::Oid, column: &str, typ: pg_sys::Oid) -> Option<i16> {
    let c = CString::new(column).ok()?;
    // SAFETY: syscache lookups; InvalidAttrNumber when missing.
    unsafe {
        let attnum = pg_sys::get_attnum(rel, c.as_ptr());
        (attnum > 0 && pg_sys::get_atttype(rel, attnum) == typ).then_some(attnum)
    }
}

/// How many columns `table` has that are not dropped (a dropped column's
/// type is InvalidOid).
pub fn live_columns(table: pg_sys::Oid) -> usize {
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

/// Can rows of `table` be written here with nothing skipped? No executor
/// runs, so: a plain table without triggers, rules, CHECK constraints or
/// row security, whose indexes are on plain columns, without an exclusion
/// constraint or a deferred check, and without a predicate unless they are
/// among `own_partial` (whose predicates the caller applies). An expression
/// index would crash a direct insert; a partial index would get entries for
/// rows outside its predicate.
pub fn table_is_plain(table: pg_sys::Oid, own_partial: &[pg_sys::Oid]) -> bool {
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
                    plain &= index_is_plain(cell.oid_value, own_partial.contains(&cell.oid_value));
                }
                pg_sys::list_free(indexes);
            }
        }
        pg_sys::RelationClose(rel);
        plain
    }
}

/// A btree on plain columns, immediate, no exclusion constraint, and
/// without a predicate unless `predicate_ok`. (Other access methods may
/// want entries on updates a btree does not: `compat::simple_heap_update`.)
pub fn index_is_plain(index: pg_sys::Oid, predicate_ok: bool) -> bool {
    // SAFETY: a relcache lookup, closed at once.
    unsafe {
        let rel = pg_sys::RelationIdGetRelation(index);
        if rel.is_null() {
            return false;
        }
        let form = &*(*rel).rd_index;
        let plain = (*(*rel).rd_rel).relam == pg_sys::BTREE_AM_OID
            && !form.indisexclusion
            && form.indimmediate
            && pg_sys::RelationGetIndexExpressions(rel).is_null()
            && (predicate_ok || pg_sys::RelationGetIndexPredicate(rel).is_null());
        pg_sys::RelationClose(rel);
        plain
    }
}
