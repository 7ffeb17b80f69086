//! Reading lease records (`fenced_lock_internal.lease_records`, one per
//! name), in the latest committed state, without SQL (docs/design.md,
//! "Objects").

use super::catalog::{objects, LeaseColumns, Objects};
use super::heap::{fetch, scan, Row, ScanKey, Tid};
use crate::datum::{interval_value, text_datum, text_value};
use crate::errors::FlError;
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use std::cell::RefCell;
use std::collections::HashMap;

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

/// At most this many names' record positions are remembered per backend.
const REMEMBERED_TIDS: usize = 4096;

/// Where each name's record was last found, for one binding of the objects.
struct Positions {
    binding: u64,
    tids: HashMap<String, Tid>,
}

thread_local! {
    static POSITIONS: RefCell<Positions> = RefCell::new(Positions { binding: 0, tids: HashMap::new() });
    /// Where the reaper's walk through session-bound records goes on from.
    static SESSION_CURSOR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn remembered(name: &str) -> Option<Tid> {
    let binding = super::catalog::binding();
    POSITIONS.with(|p| {
        let mut p = p.borrow_mut();
        if p.binding != binding {
            p.binding = binding;
            p.tids.clear();
        }
        p.tids.get(name).copied()
    })
}

fn remember(name: &str, found: Option<Tid>) {
    POSITIONS.with(|p| {
        let mut p = p.borrow_mut();
        match found {
            Some(tid) => {
                if p.tids.len() >= REMEMBERED_TIDS {
                    p.tids.clear();
                }
                p.tids.insert(name.to_string(), tid);
            }
            None => {
                p.tids.remove(name);
            }
        }
    });
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
        if let Some(tid) = remembered(name) {
            if let Some(lease) = fetch_at(&objects, tid, name) {
                return Ok(Some(lease));
            }
        }
    }
    let found = read_by_index(&objects, name);
    if objects.tids_stay_in_range {
        remember(name, found.as_ref().map(|l| l.tid));
    }
    Ok(found)
}

/// The record of `name` at `tid`, if the tuple there is that name's current record.
fn fetch_at(objects: &Objects, tid: Tid, name: &str) -> Option<Lease> {
    // SAFETY: the table cannot have shrunk below `tid` (see `read`); the
    // tuple is copied out (`lease_of`) before its buffer is released.
    unsafe { fetch(objects.table, tid, |tuple, desc| lease_of(&objects.columns, tuple, desc)) }
        .filter(|lease| lease.name == name)
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
pub fn expired_names(objects: &Objects, before: i64, limit: usize) -> Vec<String> {
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
pub fn session_bound_names(objects: &Objects, limit: usize) -> Vec<(String, i64)> {
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

fn lease_of(c: &LeaseColumns, tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc) -> Lease {
    let row = Row::deform(tuple, desc);
    // SAFETY: the columns were checked by name and type in `catalog::objects`;
    // NOT NULL columns are read as values, holder only when not NULL.
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
