//! Setting PostgreSQL's own settings for a while, the way a function's
//! `SET` clause does: under a GUC nest level that is popped when the scope
//! ends (on error, the transaction's abort pops it), or for the rest of the
//! transaction.

use pgrx::pg_sys;
use std::ffi::CStr;

/// Settings changed from `enter` until the scope is dropped.
pub struct GucScope {
    nest_level: i32,
}

impl GucScope {
    pub fn enter() -> GucScope {
        // SAFETY: pushes a nest level that Drop (or the abort) pops.
        GucScope { nest_level: unsafe { pg_sys::NewGUCNestLevel() } }
    }

    /// Set `name` to `value` until the scope ends. Every caller passes a
    /// valid value of a USERSET parameter.
    pub fn set(&self, name: &CStr, value: &CStr) {
        set(name, value, pg_sys::GucAction::GUC_ACTION_SAVE);
    }
}

impl Drop for GucScope {
    fn drop(&mut self) {
        // While an error unwinds, the transaction's abort restores the settings.
        if !std::thread::panicking() {
            // SAFETY: pops the nest level pushed in `enter`.
            unsafe { pg_sys::AtEOXact_GUC(true, self.nest_level) };
        }
    }
}

/// Set `name` to `value` until the end of the current transaction (as
/// `SET LOCAL` does).
pub fn set_for_transaction(name: &CStr, value: &CStr) {
    set(name, value, pg_sys::GucAction::GUC_ACTION_LOCAL);
}

fn set(name: &CStr, value: &CStr, action: pg_sys::GucAction::Type) {
    // SAFETY: inside a transaction; the callers pass valid USERSET values.
    unsafe {
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            action,
            true,
            0,
            false,
        );
    }
}
