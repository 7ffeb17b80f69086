//! What the views call (docs/reference.md, "Views"): the set-returning
//! functions behind `fenced_lock_waiters` and `fenced_lock_stats`, and the
//! helpers of the visibility rule and of `live`. Declared by hand in
//! `sql/fenced_lock.sql` (hence `sql = false`); the views add the visibility
//! rule and the column names users see.

use crate::errors::FlError;
use crate::fmgr::{arg_datum, arg_i64, return_bool, return_null, sql_function};
use crate::registry::{self, Waiter};
use crate::roles::may_see_role;
use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use pgrx::prelude::*;
use std::collections::BTreeMap;

/// The pids queued before `pid` on the lock it waits for, in queue order.
fn pids_ahead(pid: i32) -> Vec<i32> {
    // SAFETY: GetBlockerStatusData returns palloc'd arrays describing `pid`'s
    // wait (nothing if it is not waiting); each proc's waiters are the pids
    // ahead of it in the lock's wait queue.
    unsafe {
        let data = pg_sys::GetBlockerStatusData(pid);
        let mut out = Vec::new();
        for i in 0..(*data).nprocs as usize {
            let p = &*(*data).procs.add(i);
            if p.pid == pid {
                for j in 0..p.num_waiters as usize {
                    out.push(*(*data).waiter_pids.add(p.first_waiter as usize + j));
                }
            }
        }
        out
    }
}

/// One row per waiting `fenced_lock_acquire` in this database.
#[pg_extern(sql = false)]
#[allow(clippy::type_complexity)]
fn fl_waiters() -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(pid, i32),
        name!(holder, Option<String>),
        name!(owner, pg_sys::Oid),
        name!(waiting_since, Option<TimestampWithTimeZone>),
        name!(position, i32),
        name!(mode, &'static str),
        name!(permits, Option<i32>),
    ),
> {
    // SAFETY: plain accessor.
    let database = unsafe { pg_sys::MyDatabaseId };
    let all: Vec<Waiter> = registry::waiters().into_iter().filter(|w| w.database == database).collect();
    let mut by_name: BTreeMap<&str, Vec<&Waiter>> = BTreeMap::new();
    for w in &all {
        by_name.entry(w.name.as_str()).or_default().push(w);
    }
    let mut rows = Vec::with_capacity(all.len());
    for waiters in by_name.values() {
        let mut ranked = registry::positions(waiters, pids_ahead);
        ranked.sort_by_key(|&(i, position)| (position, waiters[i].waiting_since));
        for (i, position) in ranked {
            let w = waiters[i];
            let since = TimestampWithTimeZone::try_from(w.waiting_since).ok();
            rows.push((
                w.name.clone(),
                w.pid,
                w.holder.clone(),
                w.owner,
                since,
                position,
                w.mode.as_str(),
                w.mode.capacity(),
            ));
        }
    }
    TableIterator::new(rows)
}

/// The counters since server start, NULL unless the library is preloaded.
#[pg_extern(sql = false)]
#[allow(clippy::type_complexity)]
fn fl_stats() -> TableIterator<
    'static,
    (
        name!(grants, Option<i64>),
        name!(renewals, Option<i64>),
        name!(releases, Option<i64>),
        name!(expiries, Option<i64>),
        name!(force_releases, Option<i64>),
        name!(session_ends, Option<i64>),
        name!(waits, Option<i64>),
        name!(wait_timeouts, Option<i64>),
        name!(fence_rejections, Option<i64>),
        name!(missing_tokens, Option<i64>),
        name!(preloaded, bool),
    ),
> {
    let c = crate::stats::snapshot().map(|c| c.map(Some)).unwrap_or([None; 10]);
    TableIterator::once((
        c[0],
        c[1],
        c[2],
        c[3],
        c[4],
        c[5],
        c[6],
        c[7],
        c[8],
        c[9],
        crate::stats::preloaded(),
    ))
}

/// The counters of the lease events by mode since server start, NULL unless
/// the library is preloaded.
#[pg_extern(sql = false)]
#[allow(clippy::type_complexity)]
fn fl_stats_by_mode() -> TableIterator<
    'static,
    (
        name!(mode, &'static str),
        name!(grants, Option<i64>),
        name!(renewals, Option<i64>),
        name!(releases, Option<i64>),
        name!(expiries, Option<i64>),
        name!(force_releases, Option<i64>),
        name!(session_ends, Option<i64>),
        name!(waits, Option<i64>),
        name!(wait_timeouts, Option<i64>),
    ),
> {
    let rows: Vec<_> = match crate::stats::snapshot_by_mode() {
        Some(by_mode) => by_mode
            .into_iter()
            .map(|(m, c)| {
                (
                    m,
                    Some(c[0]),
                    Some(c[1]),
                    Some(c[2]),
                    Some(c[3]),
                    Some(c[4]),
                    Some(c[5]),
                    Some(c[6]),
                    Some(c[7]),
                )
            })
            .collect(),
        None => ["exclusive", "shared", "permit"]
            .into_iter()
            .map(|m| (m, None, None, None, None, None, None, None, None))
            .collect(),
    };
    TableIterator::new(rows)
}

/// For the views: may the current role see token and holder of a lease owned
/// by `owner` (argument 0, regrole)? Its owner's members and operators may.
unsafe fn may_see(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    // SAFETY: (owner regrole)
    let owner = unsafe { arg_datum(fcinfo, 0) }.map(|o| pg_sys::Oid::from(o.value() as u32));
    Ok(return_bool(may_see_role(owner)))
}
sql_function!(fl_may_see, pg_finfo_fl_may_see, may_see);

/// The same for a role given by name, as the history keeps it (argument 0, name).
unsafe fn may_see_name(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    // SAFETY: (owner name): a NameData pointer when not NULL.
    let owner = unsafe { arg_datum(fcinfo, 0) }.and_then(|d| {
        // SAFETY: get_role_oid reads the NUL-terminated name; missing_ok.
        let oid = unsafe { pg_sys::get_role_oid(d.cast_mut_ptr::<std::ffi::c_char>(), true) };
        (oid != pg_sys::InvalidOid).then_some(oid)
    });
    Ok(return_bool(may_see_role(owner)))
}
sql_function!(fl_may_see_name, pg_finfo_fl_may_see_name, may_see_name);

/// For `fenced_lock_leases.live`: is the session of session-bound lease
/// `token` (argument 0) still there?
unsafe fn session_alive(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    // SAFETY: (token bigint)
    match unsafe { arg_i64(fcinfo, 0) } {
        Some(token) => Ok(return_bool(crate::session::token_alive(token))),
        // SAFETY: valid fcinfo.
        None => Ok(unsafe { return_null(fcinfo) }),
    }
}
sql_function!(fl_session_alive, pg_finfo_fl_session_alive, session_alive);
