//! `fenced_lock_protect` and `fenced_lock_unprotect` (docs/reference.md,
//! "Guards a DBA can see"): the triggers that guard a table completely,
//! created (or removed) in one call, named predictably, after everything
//! they need has been checked.
//!
//! The triggers are created by the caller, with the caller's privileges
//! (as `CREATE TRIGGER` and `DROP TRIGGER` run them), by statements that
//! name every object fully qualified and quote every value.

use super::errors::guard_protected_otherwise;
use super::inspect::{guards_of, partitions_of};
use super::shape::{name_data, resolve};
use crate::errors::{sqlstate, FlError};
use pgrx::pg_sys;
use std::ffi::{CStr, CString};

/// The row guard's name on a protected table.
pub const ROW_TRIGGER: &str = "fenced_lock_guard";
/// The TRUNCATE guard's name, on the table and each of its partitions.
pub const TRUNCATE_TRIGGER: &str = "fenced_lock_guard_truncate";

fn quote_ident(s: &str) -> String {
    let c = CString::new(s).unwrap_or_default();
    // SAFETY: quote_identifier returns its argument or a palloc'd copy.
    unsafe { CStr::from_ptr(pg_sys::quote_identifier(c.as_ptr())).to_string_lossy().into_owned() }
}

fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The schema-qualified, quoted name of relation `relid`, and its kind.
fn relation(function: &str, relid: pg_sys::Oid) -> Result<(String, String, std::ffi::c_char), FlError> {
    // SAFETY: try_relation_open returns NULL for a dropped relation.
    unsafe {
        let rel = pg_sys::try_relation_open(relid, pg_sys::AccessShareLock as i32);
        if rel.is_null() {
            return Err(FlError::new(
                sqlstate::UNDEFINED_TABLE,
                format!("{function}: relation {relid:?} does not exist"),
            ));
        }
        let name = name_data(&(*(*rel).rd_rel).relname);
        let schema = CStr::from_ptr(pg_sys::get_namespace_name((*(*rel).rd_rel).relnamespace))
            .to_string_lossy()
            .into_owned();
        let kind = (*(*rel).rd_rel).relkind;
        let qualified = format!("{}.{}", quote_ident(&schema), quote_ident(&name));
        pg_sys::relation_close(rel, pg_sys::NoLock as i32);
        Ok((qualified, name, kind))
    }
}

/// Check that the guard `args` would work on `relid`, as its first write
/// would: the template parses, its columns and the token column exist, the
/// token column is bigint.
fn check_arguments(relid: pg_sys::Oid, table: &str, args: &[String]) -> Result<(), FlError> {
    // SAFETY: the relation exists (the caller opened it just before).
    unsafe {
        let rel = pg_sys::relation_open(relid, pg_sys::AccessShareLock as i32);
        let checked = resolve(table, ROW_TRIGGER, args, (*rel).rd_att).map(|_| ());
        pg_sys::relation_close(rel, pg_sys::NoLock as i32);
        checked
    }
}

fn run(sql: &str) -> Result<(), FlError> {
    pgrx::Spi::connect_mut(|c| c.update(sql, None, &[]).map(|_| ()))
        .map_err(|e| FlError::new(sqlstate::INTERNAL_ERROR, format!("fenced_lock: {sql}: {e}")))
}

/// `fenced_lock_protect`: guard `relid` with the row and TRUNCATE guards of
/// `template` and `token_column`; the TRUNCATE guard also on each partition
/// (a TRUNCATE of a partition fires only that partition's statement
/// triggers; row triggers PostgreSQL clones to every partition itself, now
/// and later). The same arguments again: nothing changes but missing
/// TRUNCATE guards of partitions added since. Other arguments: `42710`.
/// `guard_function`: the guard function's qualified name, in the
/// extension's schema.
pub fn protect(
    function: &str,
    relid: pg_sys::Oid,
    template: &str,
    token_column: &str,
    guard_function: &str,
) -> Result<(), FlError> {
    let (qualified, table, kind) = relation(function, relid)?;
    if ![pg_sys::RELKIND_RELATION, pg_sys::RELKIND_PARTITIONED_TABLE].contains(&(kind as u8)) {
        return Err(FlError::new(
            sqlstate::WRONG_OBJECT_TYPE,
            format!("{function}: \"{table}\" is not a table or a partitioned table"),
        )
        .hint("Guard the table the rows are stored in; writes through a view reach its table's guard."));
    }
    let args = vec![template.to_string(), token_column.to_string()];
    check_arguments(relid, &table, &args)?;
    let ours: Vec<_> = guards_of(relid)
        .into_iter()
        .filter(|g| g.trigger == ROW_TRIGGER || g.trigger == TRUNCATE_TRIGGER)
        .collect();
    for g in &ours {
        if g.template.as_deref() != Some(template) || g.token_column.as_deref() != Some(token_column) {
            return Err(guard_protected_otherwise(&table, g.template.as_deref().unwrap_or(""), template));
        }
    }
    let call = format!("{guard_function}({}, {})", quote_literal(template), quote_literal(token_column));
    if !ours.iter().any(|g| g.trigger == ROW_TRIGGER) {
        run(&format!(
            "CREATE TRIGGER {ROW_TRIGGER} BEFORE INSERT OR UPDATE OR DELETE ON {qualified} \
             FOR EACH ROW EXECUTE FUNCTION {call}"
        ))?;
    }
    // The table, and every partition below it.
    let mut pending = vec![relid];
    while let Some(rel) = pending.pop() {
        let has = guards_of(rel).iter().any(|g| g.trigger == TRUNCATE_TRIGGER);
        if !has {
            let (name, _, _) = relation(function, rel)?;
            run(&format!(
                "CREATE TRIGGER {TRUNCATE_TRIGGER} BEFORE TRUNCATE ON {name} FOR EACH STATEMENT EXECUTE FUNCTION {call}"
            ))?;
        }
        pending.extend(partitions_of(rel));
    }
    Ok(())
}

/// `fenced_lock_unprotect`: drop exactly the triggers `fenced_lock_protect`
/// creates on `relid` and its partitions (the row guard's clones go with
/// it). A table without them is left as it is.
pub fn unprotect(function: &str, relid: pg_sys::Oid) -> Result<(), FlError> {
    let mut pending = vec![relid];
    while let Some(rel) = pending.pop() {
        let (name, _, _) = relation(function, rel)?;
        for g in guards_of(rel) {
            let is_ours = (rel == relid && g.trigger == ROW_TRIGGER) || g.trigger == TRUNCATE_TRIGGER;
            if is_ours {
                run(&format!("DROP TRIGGER {} ON {name}", quote_ident(&g.trigger)))?;
            }
        }
        pending.extend(partitions_of(rel));
    }
    Ok(())
}
