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
//! is reported every time the trigger fires, the first time included.

use crate::errors::{quote_name, sqlstate, token_text, FlError, MAX_NAME_BYTES};
use crate::fence;
use crate::guc_scope::GucScope;
use crate::mode::LeaseMode;
use crate::template::Template;
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::rc::Rc;

const DEFAULT_TOKEN_COLUMN: &str = "fence_token";

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

/// The resolved shape of one trigger on one table.
struct Guard {
    table: String,
    template_text: String,
    template: Template,
    /// the lock name, for a template without columns
    fixed_name: Option<String>,
    /// attribute numbers of the template's columns, and how to print them
    columns: HashMap<String, (i32, Render)>,
    token_column: String,
    token_attnum: i32,
    /// Some template column's text form depends on session settings.
    canonical: bool,
    /// Shared leases fence writes too (the third argument, `'shared'`).
    accept_shared: bool,
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

/// Parse the arguments and find the columns they name, or say what is wrong.
unsafe fn resolve(
    table: &str,
    trigger: &str,
    args: &[String],
    tupdesc: pg_sys::TupleDesc,
) -> Result<Guard, FlError> {
    if args.is_empty() || args.len() > 3 {
        return Err(guard_bad_arguments(table, trigger, args.len()));
    }
    let accept_shared = match args.get(2).map(String::as_str) {
        None | Some("exclusive") => false,
        Some("shared") => true,
        Some(other) => return Err(guard_bad_modes(table, trigger, other)),
    };
    let template_text = args[0].clone();
    let template =
        Template::parse(&template_text).map_err(|problem| guard_bad_template(table, trigger, &problem))?;

    let mut columns = HashMap::new();
    let mut canonical = false;
    for c in template.columns() {
        // SAFETY: valid tuple descriptor of the trigger's relation.
        let attnum = unsafe { attnum(tupdesc, c) }
            .ok_or_else(|| guard_missing_column(table, trigger, c, "template"))?;
        // SAFETY: attnum is a user column of tupdesc.
        // SAFETY: as above.
        let typ = unsafe { pg_sys::SPI_gettypeid(tupdesc, attnum) };
        canonical |= !text_form_is_fixed(typ);
        columns.insert(c.to_string(), (attnum, Render::of(typ)));
    }
    let token_column = args.get(1).cloned().unwrap_or_else(|| DEFAULT_TOKEN_COLUMN.to_string());
    // SAFETY: as above.
    let token_attnum = unsafe { attnum(tupdesc, &token_column) }
        .ok_or_else(|| guard_missing_column(table, trigger, &token_column, "token"))?;
    // SAFETY: token_attnum is a valid user attribute of tupdesc.
    let typ = unsafe { pg_sys::SPI_gettypeid(tupdesc, token_attnum) };
    if typ != pg_sys::INT8OID {
        // SAFETY: format_type_be returns a palloc'd C string.
        let found = unsafe { CStr::from_ptr(pg_sys::format_type_be(typ)).to_string_lossy().into_owned() };
        return Err(guard_token_not_bigint(table, trigger, &token_column, &found));
    }
    let mut guard = Guard {
        table: table.to_string(),
        template_text,
        template,
        fixed_name: None,
        columns,
        token_column,
        token_attnum,
        canonical,
        accept_shared,
    };
    if guard.template.columns().is_empty() {
        guard.fixed_name = Some(guard.template_text_name()?);
    }
    Ok(guard)
}

/// How a template column's value becomes text: what the type's output
/// function prints. Integers and text are read straight from the datum (the
/// common lock-name columns, on every guarded row); anything else goes
/// through the output function.
#[derive(Clone, Copy)]
enum Render {
    Int2,
    Int4,
    Int8,
    /// text, varchar, bpchar (printed as stored, padding included)
    Text,
    Output,
}

impl Render {
    fn of(typ: pg_sys::Oid) -> Render {
        // SAFETY: catalog lookup; a domain prints as its base type.
        match unsafe { pg_sys::getBaseType(typ) } {
            pg_sys::INT2OID => Render::Int2,
            pg_sys::INT4OID => Render::Int4,
            pg_sys::INT8OID => Render::Int8,
            pg_sys::TEXTOID | pg_sys::VARCHAROID | pg_sys::BPCHAROID => Render::Text,
            _ => Render::Output,
        }
    }

    /// The text of column `attnum` of `row`, None for SQL NULL.
    ///
    /// # Safety
    /// `attnum` is a user column of `tupdesc`, of a type this Render was
    /// chosen for.
    unsafe fn text(self, row: pg_sys::HeapTuple, tupdesc: pg_sys::TupleDesc, attnum: i32) -> Option<String> {
        // SAFETY: as the caller promises; SPI_getvalue returns NULL for SQL
        // NULL, else a palloc'd C string made by the type's output function.
        unsafe {
            if let Render::Output = self {
                let v = pg_sys::SPI_getvalue(row, tupdesc, attnum);
                return (!v.is_null()).then(|| CStr::from_ptr(v).to_string_lossy().into_owned());
            }
            let mut isnull = false;
            let d = pg_sys::SPI_getbinval(row, tupdesc, attnum, &mut isnull);
            if isnull {
                return None;
            }
            Some(match self {
                Render::Int2 => (d.value() as i16).to_string(),
                Render::Int4 => (d.value() as i32).to_string(),
                Render::Int8 => (d.value() as i64).to_string(),
                _ => crate::datum::text_value(d),
            })
        }
    }
}

/// Types whose text output never depends on session settings. Anything else
/// (dates, times, intervals, floats, bytea, money, reg* types, arrays,
/// records, ...) is rendered under `CanonicalOutput`.
fn text_form_is_fixed(typ: pg_sys::Oid) -> bool {
    // SAFETY: catalog lookup; a domain resolves to its base type.
    let base = unsafe { pg_sys::getBaseType(typ) };
    [
        pg_sys::INT2OID,
        pg_sys::INT4OID,
        pg_sys::INT8OID,
        pg_sys::NUMERICOID,
        pg_sys::OIDOID,
        pg_sys::BOOLOID,
        pg_sys::TEXTOID,
        pg_sys::VARCHAROID,
        pg_sys::BPCHAROID,
        pg_sys::NAMEOID,
        pg_sys::CHAROID,
        pg_sys::UUIDOID,
    ]
    .contains(&base)
}

/// The settings under which template values are rendered when their text form
/// could depend on the session: every session then computes the same lock name
/// for the same row. Restored when dropped.
const CANONICAL_SETTINGS: [(&std::ffi::CStr, &std::ffi::CStr); 7] = [
    (c"DateStyle", c"ISO, YMD"),
    (c"IntervalStyle", c"postgres"),
    (c"TimeZone", c"UTC"),
    (c"extra_float_digits", c"1"),
    (c"bytea_output", c"hex"),
    (c"lc_monetary", c"C"),
    // reg* types print names qualified unless visible on the search path
    (c"search_path", c""),
];

/// Enter the canonical settings; they are restored when the scope drops.
fn canonical_output() -> GucScope {
    let scope = GucScope::enter();
    for (name, value) in CANONICAL_SETTINGS {
        scope.set(name, value);
    }
    scope
}

/// The attribute number of user column `name`, if it exists (not dropped,
/// not a system column).
unsafe fn attnum(tupdesc: pg_sys::TupleDesc, name: &str) -> Option<i32> {
    let c = CString::new(name).ok()?;
    // SAFETY: valid tuple descriptor; SPI_fnumber does not need a connection.
    let n = unsafe { pg_sys::SPI_fnumber(tupdesc, c.as_ptr()) };
    (n > 0).then_some(n)
}

impl Guard {
    /// The lock name of `row`: the template with column text substituted.
    unsafe fn lock_name(
        &self,
        row: pg_sys::HeapTuple,
        tupdesc: pg_sys::TupleDesc,
    ) -> Result<String, FlError> {
        if let Some(name) = &self.fixed_name {
            return Ok(name.clone());
        }
        let settings = self.canonical.then(canonical_output);
        let name = self.template.render(
            // SAFETY: each attnum is a user column of tupdesc, of the type
            // its Render was chosen for.
            |column| Ok(unsafe { self.columns[column].1.text(row, tupdesc, self.columns[column].0) }),
            |column| guard_null_template_value(&self.table, column, &self.template_text),
        )?;
        drop(settings);
        self.checked_name(name)
    }

    /// The lock name of a template without columns (guarding the whole table).
    fn template_text_name(&self) -> Result<String, FlError> {
        let name = self.template.render(|_| Ok::<_, FlError>(None), |_| unreachable!("no columns"))?;
        self.checked_name(name)
    }

    fn checked_name(&self, name: String) -> Result<String, FlError> {
        crate::args::check_name("fenced_lock_guard", &name)
            .map_err(|_| guard_bad_resolved_name(&self.table, &name))?;
        Ok(name)
    }

    /// The token column of `row`, or FL002 when it is NULL.
    unsafe fn token(
        &self,
        row: pg_sys::HeapTuple,
        tupdesc: pg_sys::TupleDesc,
        name: &str,
    ) -> Result<i64, FlError> {
        // SAFETY: as in stored_token.
        unsafe { self.stored_token(row, tupdesc) }.ok_or_else(|| missing_token(name, &self.token_column))
    }

    unsafe fn stored_token(&self, row: pg_sys::HeapTuple, tupdesc: pg_sys::TupleDesc) -> Option<i64> {
        let mut isnull = false;
        // SAFETY: token_attnum is a bigint column of tupdesc.
        let d = unsafe { pg_sys::SPI_getbinval(row, tupdesc, self.token_attnum, &mut isnull) };
        (!isnull).then(|| d.value() as i64)
    }
}

fn name_data(n: &pg_sys::NameData) -> String {
    // SAFETY: NameData is a NUL-terminated fixed-size C string.
    unsafe { CStr::from_ptr(n.data.as_ptr()) }.to_string_lossy().into_owned()
}

// ---- the errors the guard raises ------------------------------------------

/// An UPDATE would lower the token stored in the row.
fn token_goes_backwards(name: &str, token: i64, stored: i64, live: Option<i64>) -> FlError {
    FlError::new(
        sqlstate::STALE_TOKEN,
        format!(
            "stale fencing token {token} for lock {}: the row was already written with token {stored}",
            quote_name(name)
        ),
    )
    .detail(format!(
        "lock: {}; presented token: {token}; stored token: {stored}; live token: {}",
        quote_name(name),
        token_text(live)
    ))
    .hint(
        "A later lease has written this row. Acquire the lock again, re-read, and retry with the new token.",
    )
}

fn missing_token(name: &str, column: &str) -> FlError {
    FlError::new(
        sqlstate::MISSING_TOKEN,
        format!("guarded write to lock {} without a fencing token: column \"{column}\" is NULL", quote_name(name)),
    )
    .hint(format!(
        "Acquire the lock and set \"{column}\" to the token fenced_lock_try_acquire or fenced_lock_acquire returned."
    ))
}

fn guard_truncate_per_row(table: &str, template: &str) -> FlError {
    FlError::new(
        sqlstate::INSUFFICIENT_PRIVILEGE,
        format!("fenced_lock_guard: cannot truncate \"{table}\": its rows are guarded by per-row locks \"{template}\""),
    )
    .hint("Delete the rows instead, asserting each row's lock; only a table guarded by one lock name can be truncated.")
}

fn guard_not_before_row(table: &str, trigger: &str) -> FlError {
    FlError::new(
        sqlstate::TRIGGER_PROTOCOL_VIOLATED,
        format!("fenced_lock_guard: trigger \"{trigger}\" on \"{table}\" must be BEFORE ... FOR EACH ROW (or BEFORE TRUNCATE)"),
    )
    .hint("Recreate it as: CREATE TRIGGER ... BEFORE INSERT OR UPDATE OR DELETE ON ... FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('<name template>', '<token column>').")
}

fn guard_bad_arguments(table: &str, trigger: &str, count: usize) -> FlError {
    FlError::new(
        sqlstate::INVALID_PARAMETER_VALUE,
        format!(
            "fenced_lock_guard: trigger \"{trigger}\" on \"{table}\" has {count} arguments; it takes a lock name template, and optionally a token column and the modes it accepts"
        ),
    )
    .hint("Example: EXECUTE FUNCTION fenced_lock_guard('inventory:{item_id}', 'fence_token').")
}

fn guard_bad_modes(table: &str, trigger: &str, modes: &str) -> FlError {
    FlError::new(
        sqlstate::INVALID_PARAMETER_VALUE,
        format!(
            "fenced_lock_guard: trigger \"{trigger}\" on \"{table}\" accepts modes \"{modes}\"; the third argument is 'exclusive' (the default: exclusive leases and permits) or 'shared' (shared leases too)"
        ),
    )
    .hint("Example: EXECUTE FUNCTION fenced_lock_guard('inventory:{item_id}', 'fence_token', 'shared').")
}

fn guard_bad_template(table: &str, trigger: &str, problem: &str) -> FlError {
    FlError::new(
        sqlstate::INVALID_PARAMETER_VALUE,
        format!(
            "fenced_lock_guard: trigger \"{trigger}\" on \"{table}\" has a bad lock name template: {problem}"
        ),
    )
    .hint("Write columns as {column}; write literal braces as {{ and }}.")
}

fn guard_missing_column(table: &str, trigger: &str, column: &str, role: &str) -> FlError {
    FlError::new(
        sqlstate::UNDEFINED_COLUMN,
        format!("fenced_lock_guard: {role} column \"{column}\" of trigger \"{trigger}\" does not exist in \"{table}\""),
    )
    .hint("Column names in the guard's arguments are case-sensitive and must name user columns of the table.")
}

fn guard_token_not_bigint(table: &str, trigger: &str, column: &str, found: &str) -> FlError {
    FlError::new(
        sqlstate::DATATYPE_MISMATCH,
        format!("fenced_lock_guard: token column \"{column}\" of \"{table}\" (trigger \"{trigger}\") is {found}, not bigint"),
    )
    .hint("Store fencing tokens in a bigint column.")
}

fn guard_null_template_value(table: &str, column: &str, template: &str) -> FlError {
    FlError::new(
        sqlstate::NULL_VALUE_NOT_ALLOWED,
        format!("fenced_lock_guard: column \"{column}\" of \"{table}\" is NULL, so lock name template \"{template}\" names no lock"),
    )
    .hint("Give the column a value, or make it NOT NULL.")
}

fn guard_bad_resolved_name(table: &str, name: &str) -> FlError {
    let message = if name.is_empty() {
        format!("fenced_lock_guard: the row of \"{table}\" resolves to an empty lock name")
    } else {
        format!(
            "fenced_lock_guard: the row of \"{table}\" resolves to lock name {}, {} bytes long, more than {MAX_NAME_BYTES}",
            quote_name(name),
            name.len()
        )
    };
    FlError::new(sqlstate::INVALID_PARAMETER_VALUE, message)
        .hint("A lock name is non-empty text of at most 512 bytes.")
}
