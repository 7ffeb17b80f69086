//! The write session: every change to the lease records, the history and
//! the token sequence goes through a `Store` (docs/design.md, "Objects" and
//! "Security").
//!
//! Records and history rows are written directly, heap and index, as
//! PostgreSQL writes its catalogs: no executor, no SQL, no change of user,
//! so nothing of the caller's can run and nothing needs to be planned. That
//! is only right for the tables as installed (`catalog::Objects::direct`,
//! `HistoryObjects::direct`). A table an operator gave a trigger, a rule, row
//! security, a CHECK constraint or another kind of index is written through
//! SQL statements instead, which honour them: as the owner of the table, in
//! a security-restricted context, with `search_path` pinned to
//! `pg_catalog, pg_temp` under a GUC nest level (the pairing
//! `contrib/amcheck` uses), naming every object and operator by schema and
//! addressing rows by `ctid`.

use super::catalog::{objects_for_writing, Objects};
use super::heap::{delete_row, insert_row, insert_with_indexes, update_columns, Tid};
use super::history::{self, name_datum, Ending};
use super::records::{self, remember, Lease};
use crate::datum::text_datum;
use crate::errors::{quote_name, sqlstate, FlError};
use crate::guc_scope::GucScope;
use crate::locktags::{LockTag, Mode};
use crate::mode::LeaseMode;
use crate::roles::role_name;
use crate::spi::{Connection, Statement};
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use std::cell::{Cell, RefCell};

/// A new lease to record.
pub struct Grant<'a> {
    pub name: &'a str,
    pub token: i64,
    pub holder: Option<&'a str>,
    pub owner: pg_sys::Oid,
    pub now: i64,
    pub ttl_micros: i64,
    pub session_bound: bool,
    pub mode: LeaseMode,
    /// the backend of a session-bound lease
    pub pid: Option<i32>,
}

thread_local! {
    /// Bumped every time this backend opens a write session: a check the
    /// fence remembered from before may no longer describe the records.
    static WRITES: Cell<u64> = const { Cell::new(0) };
}

/// How many write sessions this backend has opened (see `WRITES`).
pub fn write_generation() -> u64 {
    WRITES.with(|w| w.get())
}

/// Running as the table's owner, for the SQL statements of tables that are
/// not as installed, until dropped.
struct OwnerSession {
    spi: Option<Connection>,
    saved_user: pg_sys::Oid,
    saved_context: i32,
    settings: Option<GucScope>,
}

impl OwnerSession {
    fn open(owner: pg_sys::Oid, with_sql: bool) -> OwnerSession {
        let mut saved_user = pg_sys::InvalidOid;
        let mut saved_context = 0;
        // SAFETY: save and switch the current user, as contrib/amcheck does
        // around its checks; restored in Drop, and by PostgreSQL's abort
        // processing on error.
        unsafe {
            pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
            pg_sys::SetUserIdAndSecContext(
                owner,
                saved_context
                    | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32
                    | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,
            );
        }
        let settings = GucScope::enter();
        settings.set(c"search_path", c"pg_catalog, pg_temp");
        OwnerSession {
            spi: with_sql.then(Connection::open),
            saved_user,
            saved_context,
            settings: Some(settings),
        }
    }
}

impl Drop for OwnerSession {
    fn drop(&mut self) {
        // In the reverse order of `open`: SQL, settings, then the user.
        drop(self.spi.take());
        drop(self.settings.take());
        // SAFETY: restores what `open` saved.
        unsafe { pg_sys::SetUserIdAndSecContext(self.saved_user, self.saved_context) };
    }
}

/// An open session on the lease state.
pub struct Store {
    objects: Objects,
    sql: RefCell<Option<OwnerSession>>,
}

impl Store {
    pub fn open() -> Result<Store, FlError> {
        let objects = objects_for_writing()?;
        WRITES.with(|w| w.set(w.get() + 1));
        Ok(Store { objects, sql: RefCell::new(None) })
    }

    /// Run `stmt` as the table owner; how many rows it touched.
    fn run(&self, stmt: &'static Statement, args: &[Option<Datum>]) -> usize {
        let mut sql = self.sql.borrow_mut();
        let session = sql.get_or_insert_with(|| OwnerSession::open(self.objects.table_owner, true));
        session.spi.as_ref().expect("opened with SQL").run(stmt, args)
    }

    pub fn next_token(&self) -> Result<i64, FlError> {
        let owner = self.objects.table_owner;
        crate::token::next_token(self.objects.sequence, |f| {
            let _as_owner = OwnerSession::open(owner, false);
            f();
        })
    }

    /// Which indexes a record with these values has entries in: the two
    /// partial indexes' predicates (`WHERE session_bound`, `WHERE holder IS
    /// NOT NULL`) applied here.
    fn indexed(&self, session_bound: bool, has_holder: bool) -> impl Fn(pg_sys::Oid) -> bool {
        let (by_session, by_holder) = (self.objects.by_session, self.objects.by_holder);
        move |index| {
            if Some(index) == by_session {
                session_bound
            } else if Some(index) == by_holder {
                has_holder
            } else {
                true
            }
        }
    }

    /// Record a new lease. Live leases are not in the history table: the
    /// history view shows them from their records (docs/design.md, "Observability").
    pub fn grant(&self, g: &Grant) -> Result<(), FlError> {
        let c = &self.objects.columns;
        let attnos = [
            c.name,
            c.token,
            c.holder,
            c.owner,
            c.acquired_at,
            c.expires_at,
            c.ttl,
            c.session_bound.expect("current catalog"),
            c.shared.expect("current catalog"),
            c.permits.expect("current catalog"),
            c.pid.expect("current catalog"),
        ];
        let values = [
            Some(text_datum(g.name)),
            Some(Datum::from(g.token)),
            g.holder.map(text_datum),
            Some(Datum::from(g.owner)),
            Some(Datum::from(g.now)),
            Some(Datum::from(expiry(g.now, g.ttl_micros))),
            Some(crate::datum::interval_datum(g.ttl_micros)),
            Some(Datum::from(g.session_bound)),
            Some(Datum::from(g.mode.shared())),
            Some(Datum::from(g.mode.permits())),
            g.pid.map(Datum::from),
        ];
        if self.objects.direct {
            let tid = insert_with_indexes(
                self.objects.table,
                &attnos,
                &values,
                self.indexed(g.session_bound, g.holder.is_some()),
            );
            remember(g.token, Some(tid));
            Ok(())
        } else {
            expect_one(self.run(&INSERT, &values), g.name)
        }
    }

    /// Move the expiry of `lease` to `now + ttl`. The ttl the lease was
    /// granted with stays recorded: `renew(name, token)` keeps using it.
    pub fn extend(&self, name: &str, lease: &Lease, now: i64, ttl_micros: i64) -> Result<(), FlError> {
        let expires_at = Datum::from(expiry(now, ttl_micros));
        moving_a_record(name, || {
            if self.objects.direct {
                let replace = [(self.objects.columns.expires_at, Some(expires_at))];
                self.update(lease, &replace);
                Ok(())
            } else {
                expect_one(self.run(&EXTEND, &[Some(lease.tid.datum()), Some(expires_at)]), name)
            }
        })
    }

    /// Publish `value` with `lease` (`fenced_lock_proclaim`).
    pub fn set_value(&self, name: &str, lease: &Lease, value: &str) -> Result<(), FlError> {
        let value = Some(text_datum(value));
        moving_a_record(name, || {
            if self.objects.direct {
                let replace = [(self.objects.columns.value.expect("current catalog"), value)];
                self.update(lease, &replace);
                Ok(())
            } else {
                expect_one(self.run(&SET_VALUE, &[Some(lease.tid.datum()), value]), name)
            }
        })
    }

    fn update(&self, lease: &Lease, replace: &[(i16, Option<Datum>)]) {
        let indexed = self.indexed(lease.session_bound, lease.holder.is_some());
        let moved = update_columns(self.objects.table, lease.tid, replace, indexed);
        remember(lease.token, Some(moved));
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
        if self.objects.direct {
            delete_row(self.objects.table, lease.tid);
        } else {
            expect_one(self.run(&DELETE, &[Some(lease.tid.datum())]), name)?;
        }
        remember(lease.token, None);
        self.record_end(lease, ending, ended_at, role);
        Ok(())
    }

    /// Write the history row of `lease`, which ended as `ending` at
    /// `ended_at`.
    pub fn record_end(&self, lease: &Lease, ending: Ending, ended_at: i64, role: Option<pg_sys::Oid>) {
        if !history::kept() {
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
            Some(text_datum(lease.mode.as_str())),
            lease.mode.capacity().map(Datum::from),
        ];
        let history = self.objects.history.expect("current catalog");
        match history.direct {
            Some(attnos) => insert_row(history.table, &attnos, &values),
            None => {
                self.run(&HISTORY_INSERT, &values);
            }
        }
    }

    /// The names and tokens of up to `limit` records that expired before `before`.
    pub fn expired(&self, before: i64, limit: usize) -> Vec<(String, i64)> {
        records::expired(&self.objects, before, limit)
    }

    /// Up to `limit` session-bound records (name, token).
    pub fn session_bound(&self, limit: usize) -> Vec<(String, i64)> {
        records::session_bound(&self.objects, limit)
    }

    /// Every committed record whose holder is `holder`.
    pub fn with_holder(&self, holder: &str) -> Vec<Lease> {
        records::with_holder(&self.objects, holder)
    }

    /// Delete up to `limit` history rows that ended before `before`.
    pub fn prune_history(&self, before: i64, limit: usize) -> usize {
        let history = self.objects.history.expect("current catalog");
        let tids = history::ended_before(&history, before, limit);
        if history.direct.is_some() {
            for &tid in &tids {
                delete_row(history.table, tid);
            }
        } else if !tids.is_empty() {
            self.run(&HISTORY_PRUNE, &[Some(Tid::array_datum(&tids))]);
        }
        tids.len()
    }
}

/// Are records and history rows written directly (not through SQL)?
#[cfg(any(test, feature = "pg_test"))]
pub fn written_directly() -> (bool, bool) {
    super::catalog::objects()
        .ok()
        .map(|o| (o.direct, o.history.is_some_and(|h| h.direct.is_some())))
        .unwrap_or_default()
}

/// Update a record of `name` under the name lock in `RowExclusive` mode
/// (docs/design.md, "Lock protocol", L4). An update writes a new version of
/// the record, often with new index entries, and the old version dies when
/// it commits: a scan running beside it could read the index before the new
/// entry is there and the old version after it died, and so miss a live
/// lease. Grants read under the name lock in `Exclusive` mode, so none reads
/// while an update is under way; a read that finds nothing waits in `Share`
/// mode and reads again (`records::record`). Updates of different leases of
/// a name (`RowExclusive` with itself) never wait for each other, and the
/// lock is given back as soon as the new version and its index entries are
/// in: any scan after that finds the new version, committed or not.
fn moving_a_record<T>(name: &str, update: impl FnOnce() -> Result<T, FlError>) -> Result<T, FlError> {
    let lock = LockTag::name(name);
    lock.lock(Mode::RowExclusive);
    let updated = update()?;
    lock.unlock(Mode::RowExclusive);
    Ok(updated)
}

fn expiry(now: i64, ttl_micros: i64) -> i64 {
    now.saturating_add(ttl_micros)
}

/// A statement for a write we decided on under the lease's lock must hit
/// exactly one row. If it does not, the caller's snapshot rules hid the row
/// from the statement: fail as a serialization failure, which is safe to
/// retry.
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
const I4: pg_sys::Oid = pg_sys::INT4OID;
const TS: pg_sys::Oid = pg_sys::TIMESTAMPTZOID;
const IV: pg_sys::Oid = pg_sys::INTERVALOID;
const ROLE: pg_sys::Oid = pg_sys::REGROLEOID;
const TID: pg_sys::Oid = pg_sys::TIDOID;
const B: pg_sys::Oid = pg_sys::BOOLOID;
const NAME: pg_sys::Oid = pg_sys::NAMEOID;

static INSERT: Statement = Statement {
    sql: "INSERT INTO fenced_lock_internal.granted_leases \
          (name, token, holder, owner, acquired_at, expires_at, ttl, session_bound, shared, permits, pid) \
          VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    args: &[T, I8, T, ROLE, TS, TS, IV, B, B, I4, I4],
};

static EXTEND: Statement = Statement {
    sql:
        "UPDATE fenced_lock_internal.granted_leases SET expires_at = $2 WHERE ctid OPERATOR(pg_catalog.=) $1",
    args: &[TID, TS],
};

static SET_VALUE: Statement = Statement {
    sql: "UPDATE fenced_lock_internal.granted_leases SET value = $2 WHERE ctid OPERATOR(pg_catalog.=) $1",
    args: &[TID, T],
};

static DELETE: Statement = Statement {
    sql: "DELETE FROM fenced_lock_internal.granted_leases WHERE ctid OPERATOR(pg_catalog.=) $1",
    args: &[TID],
};

static HISTORY_INSERT: Statement = Statement {
    sql: "INSERT INTO fenced_lock_internal.lease_history \
          (token, name, holder, owner, session_bound, acquired_at, expires_at, ended_at, ended_by, ended_by_role, \
           mode, permits) \
          VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    args: &[I8, T, T, NAME, B, TS, TS, TS, T, NAME, T, I4], // HISTORY_COLUMNS' types
};

static HISTORY_PRUNE: Statement = Statement {
    sql: "DELETE FROM fenced_lock_internal.lease_history WHERE ctid OPERATOR(pg_catalog.=) ANY ($1)",
    args: &[pg_sys::TIDARRAYOID],
};
