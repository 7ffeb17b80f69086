//! Raw heap and index access for the store: tuple positions, index scans
//! with `SnapshotSelf`, deformed rows, and the direct insert of a row with
//! its index entries. No SQL, no executor: callers have made sure the
//! relations are the ones they expect (`catalog.rs`).

use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use std::ffi::CString;

/// Where a tuple is stored (its `ctid`), as block << 16 | offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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

/// Scan `table` through `index` for `key` (its `attno` is the table's column;
/// systable_beginscan maps it to the index's) with `SnapshotSelf`, in index
/// order, handing up to `limit` tuples to `each`.
pub fn scan(
    table: pg_sys::Oid,
    index: pg_sys::Oid,
    key: ScanKey,
    limit: usize,
    mut each: impl FnMut(pg_sys::HeapTuple, pg_sys::TupleDesc),
) {
    // SAFETY: the table and index exist (looked up by `catalog::objects`, and
    // any DROP invalidates that cache); AccessShareLock keeps them until
    // commit. `each` copies what it keeps before the scan moves on.
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

/// Insert one row into `table` (`values[i]` into attribute `attnos[i]`,
/// `None` is NULL; columns not given are NULL), with its index entries, as
/// PostgreSQL writes its own catalogs: no executor, so no triggers and no
/// constraint checks beyond the unique indexes. The caller gives every NOT
/// NULL column and has made sure with `catalog::inserted_plainly` that
/// nothing is skipped.
pub fn insert_row(table: pg_sys::Oid, attnos: &[i16], values: &[Option<Datum>]) {
    // SAFETY: `table` exists (looked up by `catalog::objects`, which any DDL
    // on it invalidates); the arrays have one entry per attribute of its
    // descriptor, and the datums are of the columns' types (checked by name
    // and type in `catalog::objects`). RowExclusiveLock, as an INSERT takes,
    // is kept until commit.
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

/// Can `insert_row` put rows into `table` with nothing skipped? It runs
/// no executor, so: a plain table without triggers, rules, CHECK constraints
/// or row security, whose indexes (all maintained by `CatalogTupleInsert`)
/// are on plain columns, without a predicate, an exclusion constraint or a
/// deferred check. An expression index would crash it; a partial index
/// would get entries for rows outside its predicate.
pub fn inserted_plainly(table: pg_sys::Oid) -> bool {
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
