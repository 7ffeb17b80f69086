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

pub const SCHEMA: &std::ffi::CStr = c"fenced_lock_internal";

/// A lease record as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
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

struct Objects {
    table_owner: pg_sys::Oid,
    sequence: pg_sys::Oid,
}

fn objects() -> Result<Objects, FlError> {
    // SAFETY: syscache lookups; missing_ok so a dropped schema gives InvalidOid.
    unsafe {
        let nsp = pg_sys::get_namespace_oid(SCHEMA.as_ptr(), true);
        if nsp == pg_sys::InvalidOid {
            return Err(FlError::not_installed("schema fenced_lock_internal"));
        }
        let table = pg_sys::get_relname_relid(c"leases".as_ptr(), nsp);
        let sequence = pg_sys::get_relname_relid(c"token_seq".as_ptr(), nsp);
        if table == pg_sys::InvalidOid || sequence == pg_sys::InvalidOid {
            return Err(FlError::not_installed("the lease table or token sequence"));
        }
        let rel = pg_sys::RelationIdGetRelation(table);
        if rel.is_null() {
            return Err(FlError::not_installed("the lease table"));
        }
        let table_owner = (*(*rel).rd_rel).relowner;
        pg_sys::RelationClose(rel);
        Ok(Objects {
            table_owner,
            sequence,
        })
    }
}

/// An open session on the lease state, running as the table's owner until dropped.
pub struct Store {
    spi: Connection,
    sequence: pg_sys::Oid,
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
        Ok(Store {
            spi: Connection::open(),
            sequence: objects.sequence,
            saved_user,
            saved_context,
        })
    }

    pub fn spi(&self) -> &Connection {
        &self.spi
    }

    pub fn read(&self, name: &str) -> Option<Lease> {
        let rows = self.spi.run(&READ, &[Some(text_datum(name))]);
        if rows.is_empty() {
            return None;
        }
        Some(Lease {
            token: rows.i64(0, 1).expect("token is NOT NULL"),
            holder: rows.text(0, 2),
            owner: rows.oid(0, 3).expect("owner is NOT NULL"),
            expires_at: rows.i64(0, 4).expect("expires_at is NOT NULL"),
            ttl_micros: rows
                .interval(0, 5)
                .map(|iv| iv.total_micros().clamp(0, i64::MAX as i128) as i64)
                .expect("ttl is NOT NULL"),
        })
    }

    pub fn next_token(&self) -> i64 {
        crate::token::next_token(&self.spi, self.sequence)
    }

    /// Record a new lease of `name`, replacing an expired record if there is one.
    #[allow(clippy::too_many_arguments)]
    pub fn grant(
        &self,
        name: &str,
        replaces: bool,
        token: i64,
        holder: Option<&str>,
        owner: pg_sys::Oid,
        now: i64,
        ttl: Datum,
        ttl_micros: i64,
    ) -> Result<(), FlError> {
        let args = [
            Some(text_datum(name)),
            Some(Datum::from(token)),
            holder.map(text_datum),
            Some(Datum::from(owner)),
            Some(Datum::from(now)),
            Some(Datum::from(expiry(now, ttl_micros))),
            Some(ttl),
        ];
        let stmt = if replaces { &REGRANT } else { &INSERT };
        let rows = self.spi.run(stmt, &args);
        expect_one(rows.len(), name)
    }

    /// Move the expiry of lease `token` to `now + ttl`. The ttl the lease was
    /// granted with stays recorded: `renew(name, token)` keeps using it.
    pub fn extend(&self, name: &str, token: i64, now: i64, ttl_micros: i64) -> Result<(), FlError> {
        let args = [
            Some(text_datum(name)),
            Some(Datum::from(token)),
            Some(Datum::from(expiry(now, ttl_micros))),
        ];
        let rows = self.spi.run(&EXTEND, &args);
        expect_one(rows.len(), name)
    }

    /// Remove the record of lease `token`.
    pub fn delete(&self, name: &str, token: i64) -> Result<(), FlError> {
        let rows = self
            .spi
            .run(&DELETE, &[Some(text_datum(name)), Some(Datum::from(token))]);
        expect_one(rows.len(), name)
    }

    /// Remove up to `limit` records that expired before `before`, skipping
    /// names whose fence lock is busy. Keeps the table from growing without
    /// bound when leases are left to expire instead of being released.
    pub fn reap(&self, before: i64, limit: i64) -> usize {
        let rows = self.spi.run(
            &EXPIRED,
            &[Some(Datum::from(before)), Some(Datum::from(limit))],
        );
        let names: Vec<String> = (0..rows.len()).filter_map(|i| rows.text(i, 1)).collect();
        let mut reaped = 0;
        for name in names {
            let key = crate::keys::Key::fence(&name);
            if key.try_lock(crate::keys::Mode::Exclusive) {
                let r = self.spi.run(
                    &DELETE_EXPIRED,
                    &[Some(text_datum(&name)), Some(Datum::from(before))],
                );
                reaped += r.len();
            }
        }
        reaped
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

static READ: Statement = Statement {
    sql: "SELECT token, holder, owner, expires_at, ttl FROM fenced_lock_internal.leases \
          WHERE name OPERATOR(pg_catalog.=) $1",
    args: &[T],
    read_only: true,
};

static INSERT: Statement = Statement {
    sql: "INSERT INTO fenced_lock_internal.leases (name, token, holder, owner, acquired_at, expires_at, ttl) \
          VALUES ($1, $2, $3, $4, $5, $6, $7)",
    args: &[T, I8, T, ROLE, TS, TS, IV],
    read_only: false,
};

static REGRANT: Statement = Statement {
    sql: "UPDATE fenced_lock_internal.leases SET token = $2, holder = $3, owner = $4, \
          acquired_at = $5, expires_at = $6, ttl = $7 WHERE name OPERATOR(pg_catalog.=) $1",
    args: &[T, I8, T, ROLE, TS, TS, IV],
    read_only: false,
};

static EXTEND: Statement = Statement {
    sql: "UPDATE fenced_lock_internal.leases SET expires_at = $3 \
          WHERE name OPERATOR(pg_catalog.=) $1 AND token OPERATOR(pg_catalog.=) $2",
    args: &[T, I8, TS],
    read_only: false,
};

static DELETE: Statement = Statement {
    sql: "DELETE FROM fenced_lock_internal.leases \
          WHERE name OPERATOR(pg_catalog.=) $1 AND token OPERATOR(pg_catalog.=) $2",
    args: &[T, I8],
    read_only: false,
};

static EXPIRED: Statement = Statement {
    sql: "SELECT name FROM fenced_lock_internal.leases WHERE expires_at OPERATOR(pg_catalog.<) $1 \
          ORDER BY expires_at LIMIT $2",
    args: &[TS, I8],
    read_only: true,
};

static DELETE_EXPIRED: Statement = Statement {
    sql: "DELETE FROM fenced_lock_internal.leases \
          WHERE name OPERATOR(pg_catalog.=) $1 AND expires_at OPERATOR(pg_catalog.<) $2",
    args: &[T, TS],
    read_only: false,
};
