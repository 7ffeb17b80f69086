//! The errors a guard trigger raises, with the SQLSTATEs docs/reference.md
//! lists; the same texts serve the view `fenced_lock_guards` and the check
//! when a trigger is created.

use crate::errors::{quote_name, sqlstate, token_text, FlError, MAX_NAME_BYTES};

/// An UPDATE would lower the token stored in the row.
pub fn token_goes_backwards(name: &str, token: i64, stored: i64, live: Option<i64>) -> FlError {
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

pub fn missing_token(name: &str, column: &str) -> FlError {
    FlError::new(
        sqlstate::MISSING_TOKEN,
        format!("guarded write to lock {} without a fencing token: column \"{column}\" is NULL", quote_name(name)),
    )
    .hint(format!(
        "Acquire the lock and set \"{column}\" to the token fenced_lock_try_acquire or fenced_lock_acquire returned."
    ))
}

pub fn guard_truncate_per_row(table: &str, template: &str) -> FlError {
    FlError::new(
        sqlstate::INSUFFICIENT_PRIVILEGE,
        format!("fenced_lock_guard: cannot truncate \"{table}\": its rows are guarded by per-row locks \"{template}\""),
    )
    .hint("Delete the rows instead, asserting each row's lock; only a table guarded by one lock name can be truncated.")
}

pub fn guard_not_before_row(table: &str, trigger: &str) -> FlError {
    FlError::new(
        sqlstate::TRIGGER_PROTOCOL_VIOLATED,
        format!("fenced_lock_guard: trigger \"{trigger}\" on \"{table}\" must be BEFORE ... FOR EACH ROW (or BEFORE TRUNCATE)"),
    )
    .hint("Recreate it as: CREATE TRIGGER ... BEFORE INSERT OR UPDATE OR DELETE ON ... FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('<name template>', '<token column>').")
}

pub fn guard_bad_arguments(table: &str, trigger: &str, count: usize) -> FlError {
    FlError::new(
        sqlstate::INVALID_PARAMETER_VALUE,
        format!(
            "fenced_lock_guard: trigger \"{trigger}\" on \"{table}\" has {count} arguments; it takes a lock name template, and optionally a token column and the modes it accepts"
        ),
    )
    .hint("Example: EXECUTE FUNCTION fenced_lock_guard('inventory:{item_id}', 'fence_token').")
}

pub fn guard_bad_modes(table: &str, trigger: &str, modes: &str) -> FlError {
    FlError::new(
        sqlstate::INVALID_PARAMETER_VALUE,
        format!(
            "fenced_lock_guard: trigger \"{trigger}\" on \"{table}\" accepts modes \"{modes}\"; the third argument is 'exclusive' (the default: exclusive leases and permits) or 'shared' (shared leases too)"
        ),
    )
    .hint("Example: EXECUTE FUNCTION fenced_lock_guard('inventory:{item_id}', 'fence_token', 'shared').")
}

pub fn guard_bad_template(table: &str, trigger: &str, problem: &str) -> FlError {
    FlError::new(
        sqlstate::INVALID_PARAMETER_VALUE,
        format!(
            "fenced_lock_guard: trigger \"{trigger}\" on \"{table}\" has a bad lock name template: {problem}"
        ),
    )
    .hint("Write columns as {column}; write literal braces as {{ and }}.")
}

pub fn guard_missing_column(table: &str, trigger: &str, column: &str, role: &str) -> FlError {
    FlError::new(
        sqlstate::UNDEFINED_COLUMN,
        format!("fenced_lock_guard: {role} column \"{column}\" of trigger \"{trigger}\" does not exist in \"{table}\""),
    )
    .hint("Column names in the guard's arguments are case-sensitive and must name user columns of the table.")
}

pub fn guard_token_not_bigint(table: &str, trigger: &str, column: &str, found: &str) -> FlError {
    FlError::new(
        sqlstate::DATATYPE_MISMATCH,
        format!("fenced_lock_guard: token column \"{column}\" of \"{table}\" (trigger \"{trigger}\") is {found}, not bigint"),
    )
    .hint("Store fencing tokens in a bigint column.")
}

pub fn guard_null_template_value(table: &str, column: &str, template: &str) -> FlError {
    FlError::new(
        sqlstate::NULL_VALUE_NOT_ALLOWED,
        format!("fenced_lock_guard: column \"{column}\" of \"{table}\" is NULL, so lock name template \"{template}\" names no lock"),
    )
    .hint("Give the column a value, or make it NOT NULL.")
}

pub fn guard_bad_resolved_name(table: &str, name: &str) -> FlError {
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

/// `fenced_lock_protect` of a table that is protected with other arguments.
pub fn guard_protected_otherwise(table: &str, existing: &str, asked: &str) -> FlError {
    FlError::new(
        sqlstate::DUPLICATE_OBJECT,
        format!(
            "fenced_lock_protect: \"{table}\" is already protected with lock name template \"{existing}\", not \"{asked}\""
        ),
    )
    .hint("Run fenced_lock_unprotect on the table first to guard it otherwise.")
}
