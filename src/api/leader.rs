//! Elections that others can watch (docs/reference.md, "Leader election"):
//! campaign is `fenced_lock_acquire(..., session_bound => true)`, resign is
//! `fenced_lock_release`; the leader publishes a value, and anyone granted
//! `fenced_lock_leader` can ask who leads.

use super::{name_arg, token_arg, Change};
use crate::args::{check_value, required};
use crate::datum::text_datum;
use crate::errors::FlError;
use crate::fmgr::{arg_text, return_bool, return_rows, sql_function};
use crate::lease;
use crate::roles::current_role;
use pgrx::pg_sys;
use pgrx::pg_sys::Datum;

unsafe fn leader(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_leader";
    // SAFETY: (name text) RETURNS TABLE(holder text, token bigint,
    // acquired_at timestamptz, expires_at timestamptz, value text)
    unsafe {
        let name = name_arg(fcinfo, F)?;
        let rows: Vec<Vec<Option<Datum>>> = lease::leader(&name)?
            .into_iter()
            .map(|l| {
                vec![
                    l.holder.as_deref().map(text_datum),
                    Some(Datum::from(l.token)),
                    Some(Datum::from(l.acquired_at)),
                    Some(Datum::from(l.expires_at)),
                    l.value.as_deref().map(text_datum),
                ]
            })
            .collect();
        Ok(return_rows(fcinfo, &rows))
    }
}
sql_function!(fl_leader, pg_finfo_fl_leader, leader);

unsafe fn proclaim(fcinfo: pg_sys::FunctionCallInfo) -> Result<Datum, FlError> {
    const F: &str = "fenced_lock_proclaim";
    // SAFETY: (name text, token bigint, value text)
    unsafe {
        let name = name_arg(fcinfo, F)?;
        let token = token_arg(fcinfo, 1, F, &name)?;
        let value = required(arg_text(fcinfo, 2), F, "value", Some(&name))?;
        check_value(F, &name, &value)?;
        let _change = Change::begin(F)?;
        lease::proclaim(F, &name, token, &value, current_role()).map(return_bool)
    }
}
sql_function!(fl_proclaim, pg_finfo_fl_proclaim, proclaim);
