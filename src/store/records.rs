//! Reading lease records (`fenced_lock_internal.granted_leases`: one per
//! lease granted and not yet cleaned up, keyed by (name, token)), without
//! SQL (docs/design.md, "Objects").
//!
//! Two ways to look, and the lock protocol says which each caller needs:
//! - `Visibility::Committed` (`SnapshotSelf`): the latest committed state
//!   plus this transaction's own changes, whatever the caller's isolation
//!   level. The guard, renew and release read a lease this way while they
//!   hold its lease lock, so no change of it can be in flight.
//! - `Visibility::WithInProgress` (`SnapshotDirty`): that, plus what other
//!   transactions are granting or ending right now. A grant reads a name's
//!   records this way under the name lock: an uncommitted grant or end of
//!   another transaction counts as held, since it may yet commit.

use super::catalog::{objects, LeaseColumns, Objects};
use super::heap::{fetch, scan, InProgress, Row, ScanKey, Tid, Visibility};
use crate::datum::{interval_value, text_datum, text_value};
use crate::errors::FlError;
use crate::locktags::{LockTag, Mode};
use crate::mode::LeaseMode;
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
    pub mode: LeaseMode,
    /// what the holder published with `fenced_lock_proclaim`
    pub value: Option<String>,
}

impl Lease {
    /// `expires_at` has not passed on the server's clock `now`.
    pub fn unexpired(&self, now: i64) -> bool {
        now < self.expires_at
    }
}

/// A record as a grant sees it: with what other transactions are doing to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub lease: Lease,
    pub in_progress: InProgress,
}

/// At most this many records' positions are remembered per backend.
const REMEMBERED_TIDS: usize = 4096;

/// Where each lease's record (by token) was last found, for one binding of
/// the objects.
struct Positions {
    binding: u64,
    tids: HashMap<i64, Tid>,
}

thread_local! {
    static POSITIONS: RefCell<Positions> = RefCell::new(Positions { binding: 0, tids: HashMap::new() });
    /// Where the reaper's walk through session-bound records goes on from.
    static SESSION_CURSOR: std::cell::Cell<i64> = const { std::cell::Cell::new(0) };
}

fn remembered(token: i64) -> Option<Tid> {
    let binding = super::catalog::binding();
    POSITIONS.with(|p| {
        let mut p = p.borrow_mut();
        if p.binding != binding {
            p.binding = binding;
            p.tids.clear();
        }
        p.tids.get(&token).copied()
    })
}

/// Remember (or forget) where the record of lease `token` is.
pub fn remember(token: i64, found: Option<Tid>) {
    POSITIONS.with(|p| {
        let mut p = p.borrow_mut();
        match found {
            Some(tid) => {
                if p.tids.len() >= REMEMBERED_TIDS {
                    p.tids.clear();
                }
                p.tids.insert(token, tid);
            }
            None => {
                p.tids.remove(&token);
            }
        }
    });
}

fn name_key(objects: &Objects, name: &str) -> ScanKey {
    // ScanKeyInit compares with the C collation, the key column's own.
    ScanKey {
        attno: objects.columns.name,
        strategy: pg_sys::BTEqualStrategyNumber,
        procedure: pg_sys::F_TEXTEQ,
        argument: text_datum(name),
    }
}

/// Every record of `name`, seen as `visibility` says.
pub fn records_of(objects: &Objects, name: &str, visibility: Visibility) -> Vec<Seen> {
    let mut out = Vec::new();
    scan(objects.table, objects.by_name, &[name_key(objects, name)], usize::MAX, visibility, |t, d, p| {
        out.push(Seen { lease: lease_of(&objects.columns, t, d), in_progress: p })
    });
    out
}

/// The record of lease `token` of `name` in the latest committed state (and
/// this transaction's own changes), if there is one.
///
/// The guard reads a record per row it checks, so the common case is made
/// cheap: each backend remembers where it last found each lease's record,
/// and first looks there (one buffer, no index descent). The tuple there is
/// the current record exactly when `SnapshotSelf` sees it and it carries the
/// name and token: a record that was replaced, deleted or moved is no longer
/// visible at its old place (and a reused slot holds another lease), and
/// then the index is asked. The place is only trusted while the table cannot
/// shrink (`vacuum_truncate = false`; a rewrite gives it a new file and sends
/// the relcache invalidation that forgets every remembered place).
pub fn record(name: &str, token: i64) -> Result<Option<Lease>, FlError> {
    let objects = objects()?;
    if objects.tids_stay_in_range {
        if let Some(tid) = remembered(token) {
            // SAFETY: the table cannot have shrunk below `tid`; the tuple is
            // copied out (`lease_of`) before its buffer is released.
            let at = unsafe { fetch(objects.table, tid, |t, d| lease_of(&objects.columns, t, d)) };
            if let Some(lease) = at.filter(|l| l.name == name && l.token == token) {
                return Ok(Some(lease));
            }
        }
    }
    let mut found = scan_for(&objects, name, token);
    if found.is_none() && objects.current {
        // Nothing found may mean an update of this record ran beside the
        // scan (`Store::extend`): wait until none is under way, and look
        // again. Only a lease that is not live pays for this.
        let lock = LockTag::name(name);
        lock.lock(Mode::Shared);
        found = scan_for(&objects, name, token);
        lock.unlock(Mode::Shared);
    }
    if objects.tids_stay_in_range {
        remember(token, found.as_ref().map(|l| l.tid));
    }
    Ok(found)
}

/// The record of (`name`, `token`) that SnapshotSelf sees, through the index.
fn scan_for(objects: &Objects, name: &str, token: i64) -> Option<Lease> {
    let mut keys = vec![name_key(objects, name)];
    if objects.current {
        keys.push(ScanKey {
            attno: objects.columns.token,
            strategy: pg_sys::BTEqualStrategyNumber,
            procedure: pg_sys::F_INT8EQ,
            argument: Datum::from(token),
        });
    }
    let mut found = None;
    scan(objects.table, objects.by_name, &keys, usize::MAX, Visibility::Committed, |t, d, _| {
        let lease = lease_of(&objects.columns, t, d);
        if lease.token == token {
            found = Some(lease);
        }
    });
    found
}

/// The names and tokens of up to `limit` records that expired before `before`.
pub fn expired(objects: &Objects, before: i64, limit: usize) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    let key = ScanKey {
        attno: objects.columns.expires_at,
        strategy: pg_sys::BTLessStrategyNumber,
        procedure: crate::compat::TIMESTAMPTZ_LT,
        argument: Datum::from(before),
    };
    scan(objects.table, objects.by_expiry, &[key], limit, Visibility::Committed, |t, d, _| {
        let row = Row::deform(t, d);
        // SAFETY: `name` is a non-NULL text column, `token` a bigint.
        let name = unsafe { text_value(row.value(objects.columns.name)) };
        out.push((name, row.value(objects.columns.token).value() as i64));
    });
    out
}

/// Up to `limit` session-bound records (name, token), for the reaper, read
/// through their partial index from where the previous call stopped, so that
/// every such record comes round however many there are.
pub fn session_bound(objects: &Objects, limit: usize) -> Vec<(String, i64)> {
    let Some(by_session) = objects.by_session else { return Vec::new() };
    let from = SESSION_CURSOR.with(|c| c.get());
    let key = ScanKey {
        attno: objects.columns.token,
        strategy: pg_sys::BTGreaterStrategyNumber,
        procedure: pg_sys::F_INT8GT,
        argument: Datum::from(from),
    };
    let mut out = Vec::new();
    scan(objects.table, by_session, &[key], limit, Visibility::Committed, |t, d, _| {
        let lease = lease_of(&objects.columns, t, d);
        out.push((lease.name, lease.token));
    });
    let next = if out.len() < limit { 0 } else { out.last().map(|(_, t)| *t).unwrap_or(0) };
    SESSION_CURSOR.with(|c| c.set(next));
    out
}

/// Every committed record whose holder is `holder`.
pub fn with_holder(objects: &Objects, holder: &str) -> Vec<Lease> {
    let Some(by_holder) = objects.by_holder else { return Vec::new() };
    let key = ScanKey {
        attno: objects.columns.holder,
        strategy: pg_sys::BTEqualStrategyNumber,
        procedure: pg_sys::F_TEXTEQ,
        argument: text_datum(holder),
    };
    let mut out = Vec::new();
    scan(objects.table, by_holder, &[key], usize::MAX, Visibility::Committed, |t, d, _| {
        out.push(lease_of(&objects.columns, t, d))
    });
    out
}

fn lease_of(c: &LeaseColumns, tuple: pg_sys::HeapTuple, desc: pg_sys::TupleDesc) -> Lease {
    let row = Row::deform(tuple, desc);
    let flag = |a: Option<i16>| a.is_some_and(|a| !row.is_null(a) && row.value(a).value() != 0);
    let permits = c.permits.filter(|&a| !row.is_null(a)).map_or(1, |a| row.value(a).value() as i32);
    // SAFETY: the columns were checked by name and type in `catalog::objects`;
    // NOT NULL columns are read as values, the others only when not NULL.
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
            session_bound: flag(c.session_bound),
            mode: LeaseMode::stored(flag(c.shared), permits),
            value: c.value.filter(|&a| !row.is_null(a)).map(|a| text_value(row.value(a))),
        }
    }
}
