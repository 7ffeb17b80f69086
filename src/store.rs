//! Where lease state lives: the table `fenced_lock_internal.leases` and the
//! sequence `fenced_lock_internal.token_seq`, written only through here.
//!
//! The functions are not SECURITY DEFINER. Instead, the caller's role is
//! recorded first and each access to the private schema runs as the owner of
//! the lease table, in a security-restricted context, with statements that
//! name every object and operator by schema (`OPERATOR(pg_catalog.=)`), so a
//! caller's `search_path` cannot change what they mean.

use crate::errors::FlError;
use crate::spi::{Connection, Statement};
use crate::sqlfn::text_datum;
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use std::cell::Cell;

pub const SCHEMA: &std::ffi::CStr = c"fenced_lock_internal";

/// Where a record is stored (its `ctid`), as block << 16 | offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tid(pub u64);

impl Tid {
    fn from_item_pointer(p: &pg_sys::ItemPointerData) -> Tid {
        let block = ((p.ip_blkid.bi_hi as u64) << 16) | p.ip_blkid.bi_lo as u64;
        Tid((block << 16) | p.ip_posid as u64)
    }

    /// A `tid` datum (palloc'd in the current memory context).
    fn datum(self) -> Datum {
        let block = (self.0 >> 16) as u32;
        // SAFETY: palloc'd ItemPointerData, filled in full.
        unsafe {
            let p = pg_sys::palloc(std::mem::size_of::<pg_sys::ItemPointerData>())
                as *mut pg_sys::ItemPointerData;
            (*p).ip_blkid.bi_hi = (block >> 16) as u16;
            (*p).ip_blkid.bi_lo = (block & 0xFFFF) as u16;
            (*p).ip_posid = (self.0 & 0xFFFF) as u16;
            Datum::from(p)
        }
    }
}

/// A lease record as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// where this version of the record is; writes address it by `ctid`
    pub tid: Tid,
    pub token: i64,
    pub holder: Option<String>,
    pub owner: pg_sys::Oid,
    /// microseconds since 2000-01-01 (PostgreSQL's TimestampTz)
    pub expires_at: i64,
    /// the ttl it was granted with, in microseconds
    pub ttl_micros: i64,
}

impl Lease {
    /// Live: `expires_at` has not passed on the server's clock `now`.
    pub fn is_live(&self, now: i64) -> bool {
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
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// May `role` act for leases owned by `owner` (same role or a member of it)?
pub fn acts_for(role: pg_sys::Oid, owner: pg_sys::Oid) -> bool {
    // SAFETY: catalog lookup.
    unsafe { pg_sys::has_privs_of_role(role, owner) }
}

/// The extension's objects, looked up once per backend and forgotten on any
/// relcache invalidation of them (DROP/CREATE EXTENSION, ALTER ... OWNER).
#[derive(Clone, Copy)]
struct Objects {
    table: pg_sys::Oid,
    index: pg_sys::Oid,
    expiry_index: pg_sys::Oid,
    table_owner: pg_sys::Oid,
    sequence: pg_sys::Oid,
}

thread_local! {
    static OBJECTS: Cell<Option<Objects>> = const { Cell::new(None) };
}

pub fn register() {
    // SAFETY: called once from _PG_init.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(forget_objects), Datum::from(0)) };
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn forget_objects(_arg: Datum, relid: pg_sys::Oid) {
    OBJECTS.with(|o| {
        if let Some(known) = o.get() {
            if relid == pg_sys::InvalidOid
                || [known.table, known.index, known.expiry_index, known.sequence].contains(&relid)
            {
                o.set(None);
            }
        }
    });
}

fn objects() -> Result<Objects, FlError> {
    if let Some(known) = OBJECTS.with(|o| o.get()) {
        return Ok(known);
    }
    // SAFETY: syscache lookups; missing_ok so a dropped schema gives InvalidOid.
    let found = unsafe {
        let nsp = pg_sys::get_namespace_oid(SCHEMA.as_ptr(), true);
        if nsp == pg_sys::InvalidOid {
            return Err(FlError::not_installed("schema fenced_lock_internal"));
        }
        let table = pg_sys::get_relname_relid(c"leases".as_ptr(), nsp);
        let index = pg_sys::get_relname_relid(c"leases_pkey".as_ptr(), nsp);
        let expiry_index = pg_sys::get_relname_relid(c"leases_expires_at".as_ptr(), nsp);
        let sequence = pg_sys::get_relname_relid(c"token_seq".as_ptr(), nsp);
        if [table, index, expiry_index, sequence].contains(&pg_sys::InvalidOid) {
            return Err(FlError::not_installed("the lease table, its key or the token sequence"));
        }
        let rel = pg_sys::RelationIdGetRelation(table);
        if rel.is_null() {
            return Err(FlError::not_installed("the lease table"));
        }
        let table_owner = (*(*rel).rd_rel).relowner;
        pg_sys::RelationClose(rel);
        Objects { table, index, expiry_index, table_owner, sequence }
    };
    OBJECTS.with(|o| o.set(Some(found)));
    Ok(found)
}

/// The lease record of `name` in the latest committed state (and this
/// transaction's own changes), whatever the caller's isolation level.
///
/// Reads go straight through an index, without SPI or a change of user, so
/// the plan can never degrade into a sequential scan as the table grows.
///
/// They use `SnapshotSelf` (committed as of now, plus this transaction's own
/// changes), not an MVCC snapshot: they are only ever made with the name's
/// FENCE lock held (or for `validate`, which promises nothing about
/// ordering), so no transition of the name can be in progress, and "committed
/// as of now" is exactly the latest committed state. This spares taking a
/// snapshot of every backend's state on each guarded write.
pub fn read(name: &str) -> Result<Option<Lease>, FlError> {
    let objects = objects()?;
    let mut found = None;
    // ScanKeyInit compares with the C collation, the key column's own.
    let key = (1, pg_sys::BTEqualStrategyNumber, pg_sys::F_TEXTEQ, text_datum(name));
    scan(&objects, objects.index, key, 1, |lease, _| found = Some(lease));
    Ok(found)
}

/// The names of up to `limit` records that expired before `before`, oldest first.
fn expired_names(objects: &Objects, before: i64, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let key = (6, pg_sys::BTLessStrategyNumber, pg_sys::F_TIMESTAMPTZ_LT, Datum::from(before));
    scan(objects, objects.expiry_index, key, limit, |_, name| out.push(name));
    out
}

/// Scan the lease table through `index` for `(attno, strategy, operator
/// procedure, argument)` with `SnapshotSelf`, in index order, handing up to
/// `limit` records (and their names) to `each`.
fn scan(
    objects: &Objects,
    index: pg_sys::Oid,
    (attno, strategy, procedure, argument): (i16, u32, u32, Datum),
    limit: usize,
    mut each: impl FnMut(Lease, String),
) {
    // SAFETY: the table and index exist (looked up by `objects`, and any DROP
    // invalidates that cache); AccessShareLock keeps them until commit. The
    // tuple's pass-by-reference values are copied out before endscan.
    unsafe {
        let rel = pg_sys::table_open(objects.table, pg_sys::AccessShareLock as i32);
        let snapshot = &raw mut pg_sys::SnapshotSelfData;
        let mut key: pg_sys::ScanKeyData = std::mem::zeroed();
        pg_sys::ScanKeyInit(&mut key, attno, strategy as u16, pg_sys::Oid::from(procedure), argument);
        let scan = pg_sys::systable_beginscan(rel, index, true, snapshot, 1, &mut key);
        let mut seen = 0;
        while seen < limit {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            seen += 1;
            const NATTS: usize = 7;
            let mut values = [Datum::from(0); NATTS];
            let mut nulls = [false; NATTS];
            pg_sys::heap_deform_tuple(tuple, (*rel).rd_att, values.as_mut_ptr(), nulls.as_mut_ptr());
            let text = |d: Datum| <String as pgrx::FromDatum>::from_datum(d, false).unwrap_or_default();
            // columns: name, token, holder, owner, acquired_at, expires_at, ttl
            let lease = Lease {
                tid: Tid::from_item_pointer(&(*tuple).t_self),
                token: values[1].value() as i64,
                holder: (!nulls[2]).then(|| text(values[2])),
                owner: pg_sys::Oid::from(values[3].value() as u32),
                expires_at: values[5].value() as i64,
                ttl_micros: crate::sqlfn::interval_value(values[6]).total_micros().clamp(0, i64::MAX as i128)
                    as i64,
            };
            each(lease, text(values[0]));
        }
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, pg_sys::NoLock as i32);
    }
}

/// An open session on the lease state, running as the table's owner until dropped.
pub struct Store {
    spi: Connection,
    objects: Objects,
    saved_user: pg_sys::Oid,
    saved_context: i32,
}

impl Store {
    pub fn open() -> Result<Store, FlError> {
        let objects = objects()?;
        let mut saved_user = pg_sys::InvalidOid;
        let mut saved_context = 0;
        // SAFETY: save and switch the current user; restored in Drop (also
        // when an error unwinds), and by PostgreSQL's abort processing.
        unsafe {
            pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
            pg_sys::SetUserIdAndSecContext(
                objects.table_owner,
                saved_context
                    | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32
                    | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,
            );
        }
        Ok(Store { spi: Connection::open(), objects, saved_user, saved_context })
    }

    pub fn next_token(&self) -> i64 {
        crate::token::next_token(&self.spi, self.objects.sequence)
    }

    /// Record a new lease of `name`, replacing the (expired) record at
    /// `replaces` if there is one.
    #[allow(clippy::too_many_arguments)]
    pub fn grant(
        &self,
        name: &str,
        replaces: Option<Tid>,
        token: i64,
        holder: Option<&str>,
        owner: pg_sys::Oid,
        now: i64,
        ttl: Datum,
        ttl_micros: i64,
    ) -> Result<(), FlError> {
        let mut args = vec![
            Some(text_datum(name)),
            Some(Datum::from(token)),
            holder.map(text_datum),
            Some(Datum::from(owner)),
            Some(Datum::from(now)),
            Some(Datum::from(expiry(now, ttl_micros))),
            Some(ttl),
        ];
        let stmt = match replaces {
            Some(tid) => {
                args.push(Some(tid.datum()));
                &REGRANT
            }
            None => &INSERT,
        };
        expect_one(self.spi.run(stmt, &args).len(), name)
    }

    /// Move the expiry of `lease` to `now + ttl`. The ttl the lease was
    /// granted with stays recorded: `renew(name, token)` keeps using it.
    pub fn extend(&self, name: &str, lease: &Lease, now: i64, ttl_micros: i64) -> Result<(), FlError> {
        let args = [Some(lease.tid.datum()), Some(Datum::from(expiry(now, ttl_micros)))];
        expect_one(self.spi.run(&EXTEND, &args).len(), name)
    }

    /// Remove the record of `lease`.
    pub fn delete(&self, name: &str, lease: &Lease) -> Result<(), FlError> {
        expect_one(self.spi.run(&DELETE, &[Some(lease.tid.datum())]).len(), name)
    }

    /// Remove up to `limit` records that expired before `before`, skipping
    /// names whose fence lock is busy. Keeps the table from growing without
    /// bound when leases are left to expire instead of being released.
    pub fn reap(&self, before: i64, limit: usize) -> Result<usize, FlError> {
        let mut reaped = 0;
        for name in expired_names(&self.objects, before, limit) {
            if !crate::keys::Key::fence(&name).try_lock(crate::keys::Mode::Exclusive) {
                continue;
            }
            // Under the lock, re-read: the record may have been replaced.
            if let Some(lease) = read(&name)?.filter(|l| l.expires_at < before) {
                self.delete(&name, &lease)?;
                reaped += 1;
            }
        }
        Ok(reaped)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: restores what `open` saved.
        unsafe { pg_sys::SetUserIdAndSecContext(self.saved_user, self.saved_context) };
    }
}

fn expiry(now: i64, ttl_micros: i64) -> i64 {
    now.saturating_add(ttl_micros)
}

/// A write we decided on under the fence lock must hit exactly one row. If it
/// does not, the caller's snapshot rules hid the row from the statement: fail
/// as a serialization failure, which is safe to retry.
fn expect_one(n: usize, name: &str) -> Result<(), FlError> {
    if n == 1 {
        Ok(())
    } else {
        Err(FlError {
            sqlstate: "40001",
            message: format!(
                "fenced_lock: lease record of lock {} changed concurrently",
                crate::errors::quote_name(name)
            ),
            detail: None,
            hint: Some("Retry the transaction.".into()),
        })
    }
}

const T: pg_sys::Oid = pg_sys::TEXTOID;
const I8: pg_sys::Oid = pg_sys::INT8OID;
const TS: pg_sys::Oid = pg_sys::TIMESTAMPTZOID;
const IV: pg_sys::Oid = pg_sys::INTERVALOID;
const ROLE: pg_sys::Oid = pg_sys::REGROLEOID;
const TID: pg_sys::Oid = pg_sys::TIDOID;

static INSERT: Statement = Statement {
    sql:
        "INSERT INTO fenced_lock_internal.leases (name, token, holder, owner, acquired_at, expires_at, ttl) \
          VALUES ($1, $2, $3, $4, $5, $6, $7)",
    args: &[T, I8, T, ROLE, TS, TS, IV],
};

static REGRANT: Statement = Statement {
    sql: "UPDATE fenced_lock_internal.leases SET name = $1, token = $2, holder = $3, owner = $4, \
          acquired_at = $5, expires_at = $6, ttl = $7 WHERE ctid OPERATOR(pg_catalog.=) $8",
    args: &[T, I8, T, ROLE, TS, TS, IV, TID],
};

static EXTEND: Statement = Statement {
    sql: "UPDATE fenced_lock_internal.leases SET expires_at = $2 WHERE ctid OPERATOR(pg_catalog.=) $1",
    args: &[TID, TS],
};

static DELETE: Statement = Statement {
    sql: "DELETE FROM fenced_lock_internal.leases WHERE ctid OPERATOR(pg_catalog.=) $1",
    args: &[TID],
};
