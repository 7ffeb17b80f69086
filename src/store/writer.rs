//! The owner's write session: every change to the lease records, the
//! history and the token sequence goes through a `Store` (docs/design.md,
//! "Objects" and "Security").
//!
//! A `Store` runs as the owner of the lease table, in a security-restricted
//! context, with `search_path` pinned to `pg_catalog, pg_temp` under a GUC
//! nest level (the pairing `contrib/amcheck` uses), until it is dropped. Its
//! statements name every object and operator by schema, so a caller's
//! `search_path` cannot change what they mean, and address records by
//! `ctid` as found by `records::read`.

use super::catalog::{objects_for_writing, Objects};
use super::heap::{insert_row, Tid};
use super::history::{self, name_datum, Ending};
use super::records::{self, Lease};
use crate::datum::text_datum;
use crate::errors::{quote_name, sqlstate, FlError};
use crate::guc_scope::GucScope;
use crate::roles::role_name;
use crate::spi::{Connection, Statement};
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use std::cell::Cell;

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

thread_local! {
    /// Bumped every time this backend opens a write session: a check the
    /// fence remembered from before may no longer describe the records.
    static WRITES: Cell<u64> = const { Cell::new(0) };
}

/// How many write sessions this backend has opened (see `WRITES`).
pub fn write_generation() -> u64 {
    WRITES.with(|w| w.get())
}

/// An open session on the lease state, running as the table's owner with a
/// safe `search_path` until dropped.
pub struct Store {
    spi: Connection,
    objects: Objects,
    saved_user: pg_sys::Oid,
    saved_context: i32,
    settings: Option<GucScope>,
}

impl Store {
    pub fn open() -> Result<Store, FlError> {
        let objects = objects_for_writing()?;
        WRITES.with(|w| w.set(w.get() + 1));
        let mut saved_user = pg_sys::InvalidOid;
        let mut saved_context = 0;
        // SAFETY: save and switch the current user, as contrib/amcheck does
        // around its checks; restored in Drop, and by PostgreSQL's abort
        // processing on error.
        unsafe {
            pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
            pg_sys::SetUserIdAndSecContext(
                objects.table_owner,
                saved_context
                    | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32
                    | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,
            );
        }
        let settings = GucScope::enter();
        settings.set(c"search_path", c"pg_catalog, pg_temp");
        Ok(Store { spi: Connection::open(), objects, saved_user, saved_context, settings: Some(settings) })
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
        records::expired_names(&self.objects, before, limit)
    }

    /// Up to `limit` names with session-bound records, and their tokens.
    pub fn session_bound_names(&self, limit: usize) -> Vec<(String, i64)> {
        records::session_bound_names(&self.objects, limit)
    }

    /// Delete up to `limit` history rows that ended before `before`.
    pub fn prune_history(&self, before: i64, limit: usize) -> usize {
        let history = self.objects.history.expect("current catalog");
        let tids = history::ended_before(&history, before, limit);
        if !tids.is_empty() {
            self.spi.run(&HISTORY_PRUNE, &[Some(Tid::array_datum(&tids))]);
        }
        tids.len()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // The settings first, then the user: the reverse of `open`.
        drop(self.settings.take());
        // SAFETY: restores what `open` saved.
        unsafe { pg_sys::SetUserIdAndSecContext(self.saved_user, self.saved_context) };
    }
}

/// Are history rows formed and inserted directly (not by `INSERT`)?
#[cfg(any(test, feature = "pg_test"))]
pub fn history_inserted_directly() -> bool {
    super::catalog::objects().ok().and_then(|o| o.history).is_some_and(|h| h.direct.is_some())
}

fn expiry(now: i64, ttl_micros: i64) -> i64 {
    now.saturating_add(ttl_micros)
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
