//! `fenced_lock_guard()`: the trigger that makes the database reject writes
//! from a holder that lost its lease (docs/design.md, "The guard").
//!
//! ```sql
//! CREATE TRIGGER inventory_fence
//!   BEFORE INSERT OR UPDATE OR DELETE ON inventory
//!   FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('inventory:{item_id}', 'fence_token');
//! ```
//!
//! - INSERT: the row's token must be the live lease of the name resolved from
//!   the new row.
//! - UPDATE: the same for the new row, and the token may not be lower than
//!   the one already stored. An UPDATE that moves the row to another lock
//!   name also needs what a DELETE of the old row needs.
//! - DELETE: this transaction must have called `fenced_lock_assert` for the
//!   resolved name with a token that is still live.
//! - TRUNCATE (as a `BEFORE TRUNCATE ... FOR EACH STATEMENT` trigger with the
//!   same arguments): refused for per-row templates; for a whole-table lock,
//!   accepted like a DELETE.
//!
//! Template values are the columns' text output. For types whose text form
//! depends on session settings (dates, floats, bytea, ...) they are rendered
//! under fixed settings (`CANONICAL_SETTINGS`), so that every session computes
//! the same lock name for the same row.
//!
//! Misuse (wrong timing or level, bad arguments, missing or mistyped columns)
//! is refused when the trigger is created (`inspect.rs`, through the
//! extension's event trigger), and reported every time the trigger fires,
//! the first time included.
//!
//! - `shape`    a trigger's arguments resolved against its table, and the lock name of a row
//! - `inspect`  what is wrong with a guard trigger (the view `fenced_lock_guards`, the event trigger)
//! - `protect`  `fenced_lock_protect` / `fenced_lock_unprotect`
//! - `errors`   the errors the guard raises

mod errors;
mod inspect;
mod protect;
mod shape;

pub use inspect::{check_ddl, inspect};
pub use protect::{protect, unprotect};

use crate::errors::FlError;
use crate::fence;
use crate::mode::LeaseMode;
use errors::{guard_not_before_row, guard_truncate_per_row, token_goes_backwards};
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use shape::{name_data, resolve, Guard};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CStr;
use std::rc::Rc;

thread_local! {
    /// Resolved guards by (table, trigger): parsing the arguments and finding
    /// the columns is done once, not per row. Forgotten on any relcache
    /// invalidation of the table, which ALTER TABLE, CREATE OR REPLACE / DROP
    /// TRIGGER and ALTER TRIGGER all send.
    static GUARDS: RefCell<HashMap<(pg_sys::Oid, pg_sys::Oid), Rc<Guard>>> = RefCell::new(HashMap::new());
}

/// From `_PG_init`.
pub fn register() {
    crate::relcache::on_invalidation(forget_guards);
}

fn forget_guards(relid: pg_sys::Oid) {
    GUARDS.with(|g| {
        let mut g = g.borrow_mut();
        if relid == pg_sys::InvalidOid {
            g.clear();
        } else {
            g.retain(|(table, _), _| *table != relid);
        }
    });
}

enum Op {
    Insert,
    Update,
    Delete,
    Truncate,
}

/// The trigger body.
///
/// # Safety
/// `fcinfo` comes from PostgreSQL's trigger manager.
pub unsafe fn fire(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    // SAFETY: PostgreSQL only calls a `RETURNS trigger` function with a
    // TriggerData context (it refuses direct calls); we check the node tag.
    unsafe {
        let ctx = (*fcinfo).context;
        if ctx.is_null() || (*ctx).type_ != pg_sys::NodeTag::T_TriggerData {
            return Err(guard_not_before_row("?", "?"));
        }
        let td = ctx as *mut pg_sys::TriggerData;
        let event = (*td).tg_event;
        let rel = (*td).tg_relation;
        let trigger = (*td).tg_trigger;
        let names = || {
            (
                name_data(&(*(*rel).rd_rel).relname),
                CStr::from_ptr((*trigger).tgname).to_string_lossy().into_owned(),
            )
        };

        let timing = event & pg_sys::TRIGGER_EVENT_TIMINGMASK;
        let row_level = event & pg_sys::TRIGGER_EVENT_ROW != 0;
        let op_bits = event & pg_sys::TRIGGER_EVENT_OPMASK;
        let misplaced = || {
            let (table, trigger) = names();
            guard_not_before_row(&table, &trigger)
        };
        let op = if op_bits == pg_sys::TRIGGER_EVENT_TRUNCATE && timing == pg_sys::TRIGGER_EVENT_BEFORE {
            // TRUNCATE fires statement-level triggers only.
            Op::Truncate
        } else if timing != pg_sys::TRIGGER_EVENT_BEFORE || !row_level {
            return Err(misplaced());
        } else {
            match op_bits {
                pg_sys::TRIGGER_EVENT_INSERT => Op::Insert,
                pg_sys::TRIGGER_EVENT_UPDATE => Op::Update,
                pg_sys::TRIGGER_EVENT_DELETE => Op::Delete,
                _ => return Err(misplaced()),
            }
        };

        let tupdesc = (*rel).rd_att;
        let key = ((*rel).rd_id, (*trigger).tgoid);
        let guard = match GUARDS.with(|g| g.borrow().get(&key).cloned()) {
            Some(guard) => guard,
            None => {
                let args: Vec<String> = (0..(*trigger).tgnargs as usize)
                    .map(|i| CStr::from_ptr(*(*trigger).tgargs.add(i)).to_string_lossy().into_owned())
                    .collect();
                let (table, trigger_name) = names();
                let guard = Rc::new(resolve(&table, &trigger_name, &args, tupdesc)?);
                GUARDS.with(|g| g.borrow_mut().insert(key, guard.clone()));
                guard
            }
        };
        match op {
            Op::Insert => {
                let row = (*td).tg_trigtuple;
                let name = guard.lock_name(row, tupdesc)?;
                let token = guard.token(row, tupdesc, &name)?;
                fence::check(&name, token, guard.accept_shared)?;
                Ok(Datum::from(row))
            }
            Op::Update => {
                let old = (*td).tg_trigtuple;
                let new = (*td).tg_newtuple;
                let name = guard.lock_name(new, tupdesc)?;
                let token = guard.token(new, tupdesc, &name)?;
                let old_name = guard.lock_name(old, tupdesc)?;
                if old_name != name {
                    check_delete(&old_name, "update moving a row out of", guard.accept_shared)?;
                }
                let mode = fence::check(&name, token, guard.accept_shared)?;
                // Under an exclusive lease nobody with a later token can have
                // written the row meanwhile, unless the lease was lost: a
                // lower token means a stale writer. Shared leases and permits
                // of one name are live together, each with its own token, so
                // there the order of tokens says nothing (each write is
                // fenced by its own lease being live).
                if let Some(stored) = guard.stored_token(old, tupdesc) {
                    if token < stored && mode == LeaseMode::Exclusive {
                        return Err(token_goes_backwards(&name, token, stored, Some(token)));
                    }
                }
                Ok(Datum::from(new))
            }
            Op::Delete => {
                let old = (*td).tg_trigtuple;
                let name = guard.lock_name(old, tupdesc)?;
                check_delete(&name, "delete under", guard.accept_shared)?;
                Ok(Datum::from(old))
            }
            Op::Truncate => {
                // Only a table guarded by one lock can be truncated, by a
                // transaction that asserted that lock; per-row locks cannot
                // all be checked by one statement.
                if !guard.template.columns().is_empty() {
                    return Err(guard_truncate_per_row(&guard.table, &guard.template_text));
                }
                let name = guard.template_text_name()?;
                check_delete(&name, "truncate under", guard.accept_shared)?;
                Ok(Datum::from(0))
            }
        }
    }
}

/// A delete, truncate or move away of rows under `name` needs a live token
/// asserted in this transaction.
fn check_delete(name: &str, what: &str, accept_shared: bool) -> Result<(), FlError> {
    match fence::asserted_token(name) {
        Some(token) => fence::check(name, token, accept_shared).map(|_| ()),
        None => Err(fence::delete_without_assert(name, what)),
    }
}
