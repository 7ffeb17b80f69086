//! What is wrong with a guard trigger, if anything (docs/reference.md,
//! "Guards a DBA can see"): for the view `fenced_lock_guards`, and for the
//! extension's event trigger, which refuses a guard that could never work
//! when it is created, and an `ALTER TABLE` that would break one.
//!
//! A guard *cannot work* when its timing or level is wrong, its arguments
//! are malformed, or a column it names is missing or mistyped: each is the
//! error its first write would raise, with the same SQLSTATE and text. A
//! guard is *incomplete* when it works but leaves a way around it: it is
//! disabled, or a row guard's table has no `BEFORE TRUNCATE` guard with the
//! same arguments (so TRUNCATE is not fenced).

use super::errors::guard_not_before_row;
use super::shape::{name_data, resolve, DEFAULT_TOKEN_COLUMN};
use crate::errors::FlError;
use pgrx::pg_sys;
use std::ffi::CStr;

/// One guard trigger as the view shows it.
pub struct Inspection {
    pub trigger: String,
    pub template: Option<String>,
    pub token_column: Option<String>,
    /// INSERT, UPDATE, DELETE, TRUNCATE: what it fires on
    pub events: Vec<&'static str>,
    pub problem: Option<Problem>,
}

/// What is wrong with a guard.
pub enum Problem {
    /// It cannot work: the error its first write would raise.
    Broken(FlError),
    /// It works but leaves a way around it.
    Incomplete(String),
}

impl Problem {
    pub fn text(&self) -> String {
        match self {
            Problem::Broken(e) => e.message.clone(),
            Problem::Incomplete(s) => s.clone(),
        }
    }
}

// pg_trigger.tgtype bits (catalog/pg_trigger.h).
const ROW: i16 = 1 << 0;
const BEFORE: i16 = 1 << 1;
const INSERT: i16 = 1 << 2;
const DELETE: i16 = 1 << 3;
const UPDATE: i16 = 1 << 4;
const TRUNCATE: i16 = 1 << 5;
const INSTEAD: i16 = 1 << 6;

/// A trigger of a relation, copied out of its relcache entry.
struct TriggerCopy {
    oid: pg_sys::Oid,
    name: String,
    function: pg_sys::Oid,
    tgtype: i16,
    enabled: bool,
    args: Vec<String>,
}

/// The triggers of `relid` and what the guard's resolution of each says, or
/// None if the relation is gone. `each` sees the relation's descriptor.
fn with_triggers<T>(
    relid: pg_sys::Oid,
    each: impl FnOnce(&str, pg_sys::TupleDesc, &[TriggerCopy]) -> T,
) -> Option<T> {
    // SAFETY: try_relation_open returns NULL for a dropped relation; the
    // trigger descriptor's strings are copied before the relation closes.
    unsafe {
        let rel = pg_sys::try_relation_open(relid, pg_sys::AccessShareLock as i32);
        if rel.is_null() {
            return None;
        }
        let table = name_data(&(*(*rel).rd_rel).relname);
        let desc = (*rel).trigdesc;
        let mut triggers = Vec::new();
        if !desc.is_null() {
            for i in 0..(*desc).numtriggers as usize {
                let t = &*(*desc).triggers.add(i);
                triggers.push(TriggerCopy {
                    oid: t.tgoid,
                    name: CStr::from_ptr(t.tgname).to_string_lossy().into_owned(),
                    function: t.tgfoid,
                    tgtype: t.tgtype,
                    enabled: t.tgenabled as u8 != b'D',
                    args: (0..t.tgnargs as usize)
                        .map(|a| CStr::from_ptr(*t.tgargs.add(a)).to_string_lossy().into_owned())
                        .collect(),
                });
            }
        }
        let out = each(&table, (*rel).rd_att, &triggers);
        pg_sys::relation_close(rel, pg_sys::NoLock as i32);
        Some(out)
    }
}

/// Is `function` fenced_lock's guard (the C function `fl_guard` of this
/// library, in whatever schema)?
pub fn is_guard_function(function: pg_sys::Oid) -> bool {
    // SAFETY: a syscache lookup, released at once; prosrc and probin are
    // text attributes of pg_proc.
    unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::PROCOID as i32,
            pg_sys::Datum::from(function),
        );
        if tuple.is_null() {
            return false;
        }
        let text = |attno: u32| {
            let mut isnull = false;
            let d = pg_sys::SysCacheGetAttr(
                pg_sys::SysCacheIdentifier::PROCOID as i32,
                tuple,
                attno as i16,
                &mut isnull,
            );
            (!isnull).then(|| crate::datum::text_value(d))
        };
        let ours = text(pg_sys::Anum_pg_proc_prosrc).as_deref() == Some("fl_guard")
            && text(pg_sys::Anum_pg_proc_probin).is_some_and(|b| b.ends_with("fenced_lock"));
        pg_sys::ReleaseSysCache(tuple);
        ours
    }
}

fn events(tgtype: i16) -> Vec<&'static str> {
    [(INSERT, "INSERT"), (UPDATE, "UPDATE"), (DELETE, "DELETE"), (TRUNCATE, "TRUNCATE")]
        .into_iter()
        .filter(|(bit, _)| tgtype & bit != 0)
        .map(|(_, e)| e)
        .collect()
}

/// Judge one guard trigger `t` of `table` (descriptor `desc`), beside the
/// table's other triggers.
unsafe fn judge(table: &str, desc: pg_sys::TupleDesc, t: &TriggerCopy, all: &[TriggerCopy]) -> Inspection {
    let template = t.args.first().cloned();
    let token_column = Some(t.args.get(1).cloned().unwrap_or_else(|| DEFAULT_TOKEN_COLUMN.to_string()));
    let truncate = t.tgtype & TRUNCATE != 0;
    let placed = if truncate {
        t.tgtype & ROW == 0 && t.tgtype & BEFORE != 0
    } else {
        t.tgtype & ROW != 0 && t.tgtype & BEFORE != 0 && t.tgtype & INSTEAD == 0
    };
    let problem = if !placed {
        Some(Problem::Broken(guard_not_before_row(table, &t.name)))
    // SAFETY: `desc` is the trigger's relation's descriptor.
    } else if let Err(e) = unsafe { resolve(table, &t.name, &t.args, desc) } {
        Some(Problem::Broken(e))
    } else if !t.enabled {
        Some(Problem::Incomplete(format!(
            "trigger \"{}\" on \"{table}\" is disabled: writes to the table are not fenced",
            t.name
        )))
    } else if !truncate
        && !all.iter().any(|o| {
            o.tgtype & TRUNCATE != 0
                && o.tgtype & ROW == 0
                && o.enabled
                && is_guard_function(o.function)
                && o.args == t.args
        })
    {
        Some(Problem::Incomplete(format!(
            "TRUNCATE of \"{table}\" is not fenced: no enabled BEFORE TRUNCATE guard with the arguments of \"{}\"",
            t.name
        )))
    } else {
        None
    };
    Inspection { trigger: t.name.clone(), template, token_column, events: events(t.tgtype), problem }
}

/// The guard trigger `trigger` of `relid`, inspected; None if the relation
/// or the trigger is gone, or the trigger is not a guard.
pub fn inspect(relid: pg_sys::Oid, trigger: pg_sys::Oid) -> Option<Inspection> {
    with_triggers(relid, |table, desc, all| {
        let t = all.iter().find(|t| t.oid == trigger && is_guard_function(t.function))?;
        // SAFETY: `desc` is the relation's descriptor.
        Some(unsafe { judge(table, desc, t, all) })
    })
    .flatten()
}

/// Every guard trigger of `relid`, inspected (empty if the relation is gone).
pub fn guards_of(relid: pg_sys::Oid) -> Vec<Inspection> {
    with_triggers(relid, |table, desc, all| {
        all.iter()
            .filter(|t| is_guard_function(t.function))
            // SAFETY: `desc` is the relation's descriptor.
            .map(|t| unsafe { judge(table, desc, t, all) })
            .collect()
    })
    .unwrap_or_default()
}

/// What a DDL statement of one of our event trigger's tags is about: the
/// relation, the trigger it creates (if it is `CREATE TRIGGER`), the
/// columns it drops, retypes or renames (if it is `ALTER TABLE`), and the
/// partition it creates or attaches (if it does).
struct Statement {
    relid: pg_sys::Oid,
    trigger: Option<String>,
    /// Some: only guards naming one of these columns are judged (an `ALTER
    /// TABLE` that touches no column a guard names cannot break one, and
    /// must stay possible on a table with a guard already broken, e.g. to
    /// disable it). None: the guards `trigger` selects.
    columns: Option<Vec<String>>,
    partition: Option<pg_sys::Oid>,
}

/// Does guard `g` name `column`, in its template or as its token column?
fn names_column(g: &Inspection, column: &str) -> bool {
    g.token_column.as_deref() == Some(column)
        || g.template
            .as_deref()
            .is_some_and(|t| crate::template::Template::parse(t).is_ok_and(|t| t.columns().contains(&column)))
}

/// # Safety
/// `s` is NULL or a NUL-terminated string.
unsafe fn string(s: *const std::ffi::c_char) -> Option<String> {
    // SAFETY: as the caller promises.
    (!s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
}

/// The relation `range` names, if it exists.
///
/// # Safety
/// `range` is NULL or a valid RangeVar.
unsafe fn relid_of(range: *mut pg_sys::RangeVar) -> Option<pg_sys::Oid> {
    if range.is_null() {
        return None;
    }
    // SAFETY: as the caller promises; missing_ok, no lock (the statement
    // that named it holds one).
    let relid = unsafe {
        pg_sys::RangeVarGetRelidExtended(
            range,
            pg_sys::NoLock as i32,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        )
    };
    (relid != pg_sys::InvalidOid).then_some(relid)
}

/// # Safety
/// `parsetree` is the statement the event trigger fires for.
unsafe fn statement(parsetree: *mut pg_sys::Node) -> Option<Statement> {
    // SAFETY: each node is read as the struct its tag says; PostgreSQL 13+
    // lists are arrays of `length` cells.
    unsafe {
        if parsetree.is_null() {
            return None;
        }
        match (*parsetree).type_ {
            pg_sys::NodeTag::T_CreateTrigStmt => {
                let s = parsetree as *mut pg_sys::CreateTrigStmt;
                let trigger = Some(CStr::from_ptr((*s).trigname).to_string_lossy().into_owned());
                Some(Statement { relid: relid_of((*s).relation)?, trigger, columns: None, partition: None })
            }
            pg_sys::NodeTag::T_AlterTableStmt => {
                let s = parsetree as *mut pg_sys::AlterTableStmt;
                let (mut partition, mut columns) = (None, Vec::new());
                let cmds = (*s).cmds;
                for i in 0..if cmds.is_null() { 0 } else { (*cmds).length as usize } {
                    let cmd = (*(*cmds).elements.add(i)).ptr_value as *mut pg_sys::AlterTableCmd;
                    match (*cmd).subtype {
                        pg_sys::AlterTableType::AT_AttachPartition if !(*cmd).def.is_null() => {
                            partition = relid_of((*((*cmd).def as *mut pg_sys::PartitionCmd)).name);
                        }
                        pg_sys::AlterTableType::AT_DropColumn
                        | pg_sys::AlterTableType::AT_AlterColumnType => {
                            columns.extend(string((*cmd).name));
                        }
                        _ => {}
                    }
                }
                Some(Statement {
                    relid: relid_of((*s).relation)?,
                    trigger: None,
                    columns: Some(columns),
                    partition,
                })
            }
            pg_sys::NodeTag::T_RenameStmt => {
                let s = parsetree as *mut pg_sys::RenameStmt;
                let columns = if (*s).renameType == pg_sys::ObjectType::OBJECT_COLUMN {
                    string((*s).subname).into_iter().collect()
                } else {
                    Vec::new()
                };
                Some(Statement {
                    relid: relid_of((*s).relation)?,
                    trigger: None,
                    columns: Some(columns),
                    partition: None,
                })
            }
            pg_sys::NodeTag::T_CreateStmt => {
                let s = parsetree as *mut pg_sys::CreateStmt;
                if (*s).partbound.is_null() {
                    return None;
                }
                let relid = relid_of((*s).relation)?;
                Some(Statement { relid, trigger: None, columns: Some(Vec::new()), partition: Some(relid) })
            }
            _ => None,
        }
    }
}

/// At the end of `CREATE TRIGGER`, `ALTER TABLE` (and its `RENAME`) and
/// `CREATE TABLE ... PARTITION OF`: refuse a guard that cannot work (the
/// error its first write would raise, so the statement rolls back), and warn
/// when a new partition of a table `fenced_lock_protect` guarded did not get
/// the table's TRUNCATE guard (PostgreSQL clones row triggers only).
///
/// # Safety
/// `parsetree` is the statement the event trigger fires for.
pub unsafe fn check_ddl(parsetree: *mut pg_sys::Node) -> Result<(), FlError> {
    // SAFETY: as the caller promises.
    let Some(st) = (unsafe { statement(parsetree) }) else { return Ok(()) };
    for g in guards_of(st.relid) {
        if st.trigger.as_deref().is_some_and(|t| t != g.trigger) {
            continue;
        }
        if st.columns.as_ref().is_some_and(|cols| !cols.iter().any(|c| names_column(&g, c))) {
            continue;
        }
        if let Some(Problem::Broken(e)) = g.problem {
            return Err(e);
        }
    }
    let Some(partition) = st.partition else { return Ok(()) };
    let truncate_guards: Vec<(Option<String>, Option<String>)> = parents_of(partition)
        .into_iter()
        .flat_map(guards_of)
        .filter(|g| g.events == ["TRUNCATE"] && g.problem.is_none())
        .map(|g| (g.template, g.token_column))
        .collect();
    for g in guards_of(partition) {
        if let Some(Problem::Incomplete(why)) = &g.problem {
            if why.starts_with("TRUNCATE")
                && truncate_guards.contains(&(g.template.clone(), g.token_column.clone()))
            {
                pgrx::warning!("fenced_lock: {why}; run fenced_lock_protect on the partitioned table again");
            }
        }
    }
    Ok(())
}

/// The tables `relid` inherits from directly (its partitioned table).
fn parents_of(relid: pg_sys::Oid) -> Vec<pg_sys::Oid> {
    inherits("SELECT inhparent FROM pg_catalog.pg_inherits WHERE inhrelid OPERATOR(pg_catalog.=) $1", relid)
}

/// The partitions of `relid` (none for a table that is not partitioned).
pub fn partitions_of(relid: pg_sys::Oid) -> Vec<pg_sys::Oid> {
    inherits("SELECT inhrelid FROM pg_catalog.pg_inherits WHERE inhparent OPERATOR(pg_catalog.=) $1", relid)
}

fn inherits(query: &str, relid: pg_sys::Oid) -> Vec<pg_sys::Oid> {
    pgrx::Spi::connect(|c| {
        c.select(query, None, &[relid.into()])
            .map(|rows| rows.filter_map(|r| r.get::<pg_sys::Oid>(1).ok().flatten()).collect())
            .unwrap_or_default()
    })
}
