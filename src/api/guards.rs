//! Guards a DBA can see (docs/reference.md, "Guards a DBA can see"):
//! protecting a table in one call, the view `fenced_lock_guards`, and the
//! event trigger that refuses a guard that could never work.

use crate::args::required;
use crate::datum::text_datum;
use crate::errors::FlError;
use crate::fmgr::{arg_datum, arg_text, return_null, return_rows, sql_function};
use crate::guard;
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use std::ffi::CStr;

/// The guard function's qualified name: in the schema of the function
/// being called (every function of the extension is in its one schema).
unsafe fn guard_function(fcinfo: pg_sys::FunctionCallInfo) -> String {
    // SAFETY: a valid fcinfo; syscache lookups of the function being run.
    unsafe {
        let schema = pg_sys::get_func_namespace((*(*fcinfo).flinfo).fn_oid);
        let name = CStr::from_ptr(pg_sys::get_namespace_name(schema)).to_string_lossy();
        let quoted =
            CStr::from_ptr(pg_sys::quote_identifier(std::ffi::CString::new(name.as_ref()).unwrap().as_ptr()))
                .to_string_lossy()
                .into_owned();
        format!("{quoted}.fenced_lock_guard")
    }
}

/// A regclass argument.
unsafe fn relation_arg(fcinfo: pg_sys::FunctionCallInfo, function: &str) -> Result<pg_sys::Oid, FlError> {
    // SAFETY: argument 0 is `tbl regclass`, an Oid by value.
    let oid = unsafe { arg_datum(fcinfo, 0) }.map(|d| pg_sys::Oid::from(d.value() as u32));
    required(oid, function, "tbl", None)
}

unsafe fn protect(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_protect";
    // SAFETY: (tbl regclass, template text, token_column name)
    unsafe {
        let relid = relation_arg(fcinfo, F)?;
        let template = required(arg_text(fcinfo, 1), F, "template", None)?;
        let token_column = match arg_datum(fcinfo, 2) {
            Some(d) => CStr::from_ptr(d.cast_mut_ptr::<std::ffi::c_char>()).to_string_lossy().into_owned(),
            None => return Err(crate::args::null_argument(F, "token_column", None)),
        };
        guard::protect(F, relid, &template, &token_column, &guard_function(fcinfo))?;
        Ok(return_null(fcinfo))
    }
}
sql_function!(fl_protect, pg_finfo_fl_protect, protect);

unsafe fn unprotect(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_unprotect";
    // SAFETY: (tbl regclass)
    unsafe {
        let relid = relation_arg(fcinfo, F)?;
        guard::unprotect(F, relid)?;
        Ok(return_null(fcinfo))
    }
}
sql_function!(fl_unprotect, pg_finfo_fl_unprotect, unprotect);

/// For the view: one guard trigger (relid, trigger oid) as a row (template,
/// token_column, events, valid, problem), or no row if it is not a guard.
unsafe fn guard_state(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    // SAFETY: (tbl oid, trigger oid) RETURNS TABLE (template text,
    // token_column text, events text[], valid boolean, problem text)
    unsafe {
        let oid = |n| arg_datum(fcinfo, n).map(|d| pg_sys::Oid::from(d.value() as u32));
        let rows: Vec<Vec<Option<Datum>>> = match (oid(0), oid(1)) {
            (Some(relid), Some(trigger)) => guard::inspect(relid, trigger)
                .into_iter()
                .map(|g| {
                    let events: Vec<Datum> = g.events.iter().map(|e| text_datum(e)).collect();
                    let array = pg_sys::construct_array(
                        events.as_ptr() as *mut Datum,
                        events.len() as i32,
                        pg_sys::TEXTOID,
                        -1,
                        false,
                        pg_sys::TYPALIGN_INT as std::ffi::c_char,
                    );
                    vec![
                        g.template.as_deref().map(text_datum),
                        g.token_column.as_deref().map(text_datum),
                        Some(Datum::from(array)),
                        Some(Datum::from(g.problem.is_none())),
                        g.problem.as_ref().map(|p| text_datum(&p.text())),
                    ]
                })
                .collect(),
            _ => Vec::new(),
        };
        Ok(return_rows(fcinfo, &rows))
    }
}
sql_function!(fl_guard_state, pg_finfo_fl_guard_state, guard_state);

/// The event trigger at `ddl_command_end` of `CREATE TRIGGER`, `ALTER
/// TABLE` and `CREATE TABLE`.
unsafe fn check_guards(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    // SAFETY: PostgreSQL calls an event trigger function with an
    // EventTriggerData context (checked by its node tag).
    unsafe {
        let ctx = (*fcinfo).context;
        if ctx.is_null() || (*ctx).type_ != pg_sys::NodeTag::T_EventTriggerData {
            pgrx::error!("fenced_lock: check_guards is an event trigger");
        }
        let data = ctx as *mut pg_sys::EventTriggerData;
        guard::check_ddl((*data).parsetree)?;
        Ok(Datum::from(0))
    }
}
sql_function!(fl_check_guards, pg_finfo_fl_check_guards, check_guards);
