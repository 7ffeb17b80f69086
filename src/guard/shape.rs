//! A guard trigger's arguments resolved against its table (once per table
//! and trigger, cached by `mod.rs`), and the lock name and token of a row.
//!
//! Template values are the columns' text output. For types whose text form
//! depends on session settings (dates, floats, bytea, ...) they are rendered
//! under fixed settings (`CANONICAL_SETTINGS`), so that every session computes
//! the same lock name for the same row.

use super::errors::{
    guard_bad_arguments, guard_bad_modes, guard_bad_resolved_name, guard_bad_template, guard_missing_column,
    guard_null_template_value, guard_token_not_bigint, missing_token,
};
use crate::errors::FlError;
use crate::guc_scope::GucScope;
use crate::template::Template;
use pgrx::pg_sys;
use std::collections::HashMap;
use std::ffi::{CStr, CString};

pub const DEFAULT_TOKEN_COLUMN: &str = "fence_token";

/// The resolved shape of one trigger on one table.
pub struct Guard {
    pub table: String,
    pub template_text: String,
    pub template: Template,
    /// the lock name, for a template without columns
    pub fixed_name: Option<String>,
    /// attribute numbers of the template's columns, and how to print them
    columns: HashMap<String, (i32, Render)>,
    pub token_column: String,
    pub token_attnum: i32,
    /// Some template column's text form depends on session settings.
    pub canonical: bool,
    /// Shared leases fence writes too (the third argument, `'shared'`).
    pub accept_shared: bool,
}

/// Parse the arguments and find the columns they name, or say what is wrong.
pub unsafe fn resolve(
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
    pub unsafe fn lock_name(
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
    pub fn template_text_name(&self) -> Result<String, FlError> {
        let name = self.template.render(|_| Ok::<_, FlError>(None), |_| unreachable!("no columns"))?;
        self.checked_name(name)
    }

    fn checked_name(&self, name: String) -> Result<String, FlError> {
        crate::args::check_name("fenced_lock_guard", &name)
            .map_err(|_| guard_bad_resolved_name(&self.table, &name))?;
        Ok(name)
    }

    /// The token column of `row`, or FL002 when it is NULL.
    pub unsafe fn token(
        &self,
        row: pg_sys::HeapTuple,
        tupdesc: pg_sys::TupleDesc,
        name: &str,
    ) -> Result<i64, FlError> {
        // SAFETY: as in stored_token.
        unsafe { self.stored_token(row, tupdesc) }.ok_or_else(|| missing_token(name, &self.token_column))
    }

    pub unsafe fn stored_token(&self, row: pg_sys::HeapTuple, tupdesc: pg_sys::TupleDesc) -> Option<i64> {
        let mut isnull = false;
        // SAFETY: token_attnum is a bigint column of tupdesc.
        let d = unsafe { pg_sys::SPI_getbinval(row, tupdesc, self.token_attnum, &mut isnull) };
        (!isnull).then(|| d.value() as i64)
    }
}

pub fn name_data(n: &pg_sys::NameData) -> String {
    // SAFETY: NameData is a NUL-terminated fixed-size C string.
    unsafe { CStr::from_ptr(n.data.as_ptr()) }.to_string_lossy().into_owned()
}
