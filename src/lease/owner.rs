//! What is done to a live lease by its holder (renew, release, proclaim)
//! or by an operator (force release), and the reads of `validate` and
//! `fenced_lock_leader` (docs/design.md, "Transitions").
//!
//! Each takes the lease lock of the one lease it touches (L6: it waits for
//! it; these are the holder's or an operator's own actions, and must not
//! fail because a guarded write is in flight), then reads the committed
//! record and decides. A change keeps the lock until commit; a refusal gives
//! it back at once.

use super::decide::{decide_owner_change, OwnerDecision, State};
use super::{after, current, state_of, Change};
use crate::clock::now;
use crate::errors::{quote_name, sqlstate, FlError};
use crate::locktags::{LockTag, Mode};
use crate::mode::LeaseMode;
use crate::roles::{acts_for, role_name};
use crate::session;
use crate::store::{records_of, Ending, Lease, Store, Visibility};
use pgrx::pg_sys;

fn not_owner(function: &str, name: &str, token: i64, owner: pg_sys::Oid) -> FlError {
    FlError::new(
        sqlstate::INSUFFICIENT_PRIVILEGE,
        format!(
            "{function}: lease {token} of lock {} belongs to role \"{}\"",
            quote_name(name),
            role_name(owner)
        ),
    )
    .hint("Only the role that acquired a lease (or a member of it) may renew or release it.")
}

/// Take the lease lock in `mode`, read, and decide a change by the owner of
/// `token`: the live lease and the instant of the decision, or None (not
/// live; the lock is given back).
fn owner_change(
    function: &str,
    name: &str,
    token: i64,
    caller: pg_sys::Oid,
    mode: Mode,
) -> Result<Option<(Lease, i64)>, FlError> {
    crate::store::check_catalog_writable()?;
    let lock = LockTag::lease(token);
    lock.lock(mode);
    let now = now();
    let current = current(name, token, now)?;
    match decide_owner_change(current.as_ref().map(|(l, s)| (l, *s)), token, |owner| acts_for(caller, owner))
    {
        OwnerDecision::Apply => Ok(Some((current.expect("Apply implies a record").0, now))),
        OwnerDecision::NotLive => {
            lock.unlock(mode);
            Ok(None)
        }
        OwnerDecision::NotOwner { owner } => {
            lock.unlock(mode);
            Err(not_owner(function, name, token, owner))
        }
    }
}

/// `fenced_lock_renew`: `ttl_micros` None renews for the ttl the lease was
/// granted with. It does not wait for the lease's guarded writes (they stay
/// valid), only for another renew or the end of the same lease. A renew
/// that brings the expiry forward wakes the head waiter, so the handoff
/// happens at the new expiry instant.
pub fn renew(
    function: &str,
    name: &str,
    token: i64,
    ttl_micros: Option<i64>,
    caller: pg_sys::Oid,
) -> Result<bool, FlError> {
    let Some((lease, now)) = owner_change(function, name, token, caller, Mode::ShareUpdateExclusive)? else {
        return Ok(false);
    };
    let ttl = ttl_micros.unwrap_or(lease.ttl_micros);
    Store::open()?.extend(name, &lease, now, ttl)?;
    after(Change::Renewed { name, mode: lease.mode, shortened: now.saturating_add(ttl) < lease.expires_at });
    Ok(true)
}

/// `fenced_lock_release`: waits for the lease's in-flight guarded writes.
pub fn release(function: &str, name: &str, token: i64, caller: pg_sys::Oid) -> Result<bool, FlError> {
    let Some((lease, now)) = owner_change(function, name, token, caller, Mode::Exclusive)? else {
        return Ok(false);
    };
    Store::open()?.end(name, &lease, Ending::Release, now, Some(caller))?;
    after(Change::Ended { lease: &lease, ending: Ending::Release, taken_over: false });
    Ok(true)
}

/// `fenced_lock_release_all`: each (name, token) pair released as
/// `fenced_lock_release` would; how many were live and are released now.
pub fn release_all(function: &str, pairs: &[(String, i64)], caller: pg_sys::Oid) -> Result<i32, FlError> {
    let mut released = 0;
    for (name, token) in pairs {
        released += release(function, name, *token, caller)? as i32;
    }
    Ok(released)
}

/// `fenced_lock_proclaim`: the holder of the live exclusive lease `token`
/// publishes `value`, which `fenced_lock_leader` returns; false unless the
/// token is that lease and the caller acts for its owner.
pub fn proclaim(
    function: &str,
    name: &str,
    token: i64,
    value: &str,
    caller: pg_sys::Oid,
) -> Result<bool, FlError> {
    let lock_mode = Mode::ShareUpdateExclusive;
    let Some((lease, _)) = owner_change(function, name, token, caller, lock_mode).or_else(|e| {
        // Not the owner: simply false, as for a token that is not live.
        if e.sqlstate == sqlstate::INSUFFICIENT_PRIVILEGE {
            Ok(None)
        } else {
            Err(e)
        }
    })?
    else {
        return Ok(false);
    };
    if lease.mode != LeaseMode::Exclusive {
        LockTag::lease(token).unlock(lock_mode);
        return Ok(false);
    }
    if lease.value.as_deref() != Some(value) {
        Store::open()?.set_value(name, &lease, value)?;
        after(Change::Proclaimed { name, token });
    }
    Ok(true)
}

/// `fenced_lock_force_release`: the caller has been checked as operator.
/// Ends every live lease of `name`; true if there was one.
pub fn force_release(name: &str, caller: pg_sys::Oid) -> Result<bool, FlError> {
    crate::store::check_catalog_writable()?;
    let mut ended = false;
    let now = now();
    for seen in records_of(name, Visibility::Committed)? {
        if state_of(&seen.lease, now) != State::Live {
            continue;
        }
        let lock = LockTag::lease(seen.lease.token);
        lock.lock(Mode::Exclusive);
        let now = crate::clock::now();
        match current(name, seen.lease.token, now)? {
            Some((lease, State::Live)) => {
                Store::open()?.end(name, &lease, Ending::ForceRelease, now, Some(caller))?;
                after(Change::Ended { lease: &lease, ending: Ending::ForceRelease, taken_over: false });
                ended = true;
            }
            _ => lock.unlock(Mode::Exclusive),
        }
    }
    Ok(ended)
}

/// `fenced_lock_renew_all`: renew every live lease the caller may renew
/// with holder `holder` (None: every lease bound to this session), for
/// `ttl_micros` (None: each lease's own ttl). How many were renewed.
pub fn renew_all(
    function: &str,
    holder: Option<&str>,
    ttl_micros: Option<i64>,
    caller: pg_sys::Oid,
) -> Result<i32, FlError> {
    crate::store::check_catalog_writable()?;
    let leases: Vec<(String, i64)> = match holder {
        Some(h) => Store::open()?
            .with_holder(h)
            .into_iter()
            .filter(|l| acts_for(caller, l.owner))
            .map(|l| (l.name, l.token))
            .collect(),
        None => session::bound().into_iter().map(|(token, name)| (name, token)).collect(),
    };
    let mut renewed = 0;
    for (name, token) in leases {
        // Another role's lease reached through this session is not renewed.
        match renew(function, &name, token, ttl_micros, caller) {
            Ok(done) => renewed += done as i32,
            Err(e) if e.sqlstate == sqlstate::INSUFFICIENT_PRIVILEGE => {}
            Err(e) => return Err(e),
        }
    }
    Ok(renewed)
}

/// `fenced_lock_validate`: is `token` a live lease of `name` now? A read of
/// the latest committed state, no lock.
pub fn validate(name: &str, token: i64) -> Result<bool, FlError> {
    Ok(matches!(current(name, token, now())?, Some((_, State::Live))))
}

/// The live exclusive lease of a name, as `fenced_lock_leader` shows it.
pub struct Leader {
    pub holder: Option<String>,
    pub token: i64,
    pub acquired_at: i64,
    pub expires_at: i64,
    pub value: Option<String>,
}

/// `fenced_lock_leader`: the live exclusive lease of `name`, if any.
pub fn leader(name: &str) -> Result<Option<Leader>, FlError> {
    let now = now();
    Ok(records_of(name, Visibility::Committed)?
        .into_iter()
        .map(|s| s.lease)
        .find(|l| l.mode == LeaseMode::Exclusive && state_of(l, now) == State::Live)
        .map(|l| Leader {
            holder: l.holder,
            token: l.token,
            acquired_at: l.acquired_at,
            expires_at: l.expires_at,
            value: l.value,
        }))
}
