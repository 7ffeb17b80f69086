//! Every error this extension raises: its SQLSTATE, message, detail and hint.
//!
//! The README's SQLSTATE table is written from this file; keep them together.
//! Errors are values (`FlError`) until the very top of a SQL-callable function
//! (see `sqlfn.rs`), where [`FlError::raise`] hands them to PostgreSQL with their
//! own SQLSTATE. pgrx's `ereport!` cannot carry a code it does not know (such as
//! `FL001`), which is why raising is done here and not through pgrx.

use std::fmt;

/// SQLSTATEs used by fenced_lock (SPEC §5).
pub mod sqlstate {
    /// Stale token: not the live lease of the name.
    pub const STALE_TOKEN: &str = "FL001";
    /// Guarded write without a token.
    pub const MISSING_TOKEN: &str = "FL002";
    /// `fenced_lock_acquire` waited `wait` without getting the lock.
    pub const LOCK_NOT_AVAILABLE: &str = "55P03";
    /// A required argument is NULL.
    pub const NULL_VALUE_NOT_ALLOWED: &str = "22004";
    /// A bad argument value.
    pub const INVALID_PARAMETER_VALUE: &str = "22023";
    /// Not allowed (owner / operator checks).
    pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
    /// Guard attached as an AFTER, INSTEAD OF or statement-level trigger.
    pub const TRIGGER_PROTOCOL_VIOLATED: &str = "39P01";
    /// Guard names a column that does not exist.
    pub const UNDEFINED_COLUMN: &str = "42703";
    /// Guard names a token column that is not bigint.
    pub const DATATYPE_MISMATCH: &str = "42804";
    /// The extension's own objects are missing or damaged.
    pub const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
}

/// Longest lock name, in bytes (SPEC §2).
pub const MAX_NAME_BYTES: usize = 512;
/// Longest holder, in bytes.
pub const MAX_HOLDER_BYTES: usize = 512;

/// An error on its way to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlError {
    pub sqlstate: &'static str,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl fmt::Display for FlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.sqlstate, self.message)
    }
}

/// A lock name fit to quote in a message: over-long names are cut (on a
/// character boundary) so that an error never echoes megabytes back.
pub fn quote_name(name: &str) -> String {
    const SHOWN: usize = 80;
    let mut out = String::with_capacity(name.len().min(SHOWN) + 8);
    out.push('"');
    if name.len() <= SHOWN {
        out.push_str(name);
        out.push('"');
    } else {
        let mut cut = SHOWN;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        out.push_str(&name[..cut]);
        out.push_str("\"...");
    }
    out
}

fn token_text(token: Option<i64>) -> String {
    match token {
        Some(t) => t.to_string(),
        None => "none".to_string(),
    }
}

impl FlError {
    fn new(sqlstate: &'static str, message: String) -> Self {
        FlError { sqlstate, message, detail: None, hint: None }
    }

    fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    // ---- bad arguments (22004, 22023) -------------------------------------

    /// A required argument is NULL. `name` is the lock, when it is known.
    pub fn null_argument(function: &str, argument: &str, name: Option<&str>) -> Self {
        let on = match name {
            Some(n) => format!(" (lock {})", quote_name(n)),
            None => String::new(),
        };
        Self::new(
            sqlstate::NULL_VALUE_NOT_ALLOWED,
            format!("{function}: argument \"{argument}\" must not be NULL{on}"),
        )
        .hint(format!("Pass a value for \"{argument}\"."))
    }

    pub fn empty_name(function: &str) -> Self {
        Self::new(sqlstate::INVALID_PARAMETER_VALUE, format!("{function}: lock name \"\" is empty"))
            .hint("A lock name is non-empty text of at most 512 bytes.")
    }

    pub fn name_too_long(function: &str, name: &str) -> Self {
        Self::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!(
                "{function}: lock name {} is {} bytes long, more than {MAX_NAME_BYTES}",
                quote_name(name),
                name.len()
            ),
        )
        .hint("Use a shorter lock name, for example a hash of the long one.")
    }

    pub fn holder_too_long(function: &str, name: &str, len: usize) -> Self {
        Self::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!(
                "{function}: holder for lock {} is {len} bytes long, more than {MAX_HOLDER_BYTES}",
                quote_name(name)
            ),
        )
        .hint("A holder is a short worker id; use at most 512 bytes.")
    }

    pub fn ttl_not_positive(function: &str, name: &str, ttl: &str) -> Self {
        Self::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("{function}: ttl {ttl} for lock {} is not positive", quote_name(name)),
        )
        .hint("Pass a ttl greater than zero, such as '30 seconds'.")
    }

    pub fn ttl_too_long(function: &str, name: &str, ttl: &str, max_seconds: i64) -> Self {
        Self::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!(
                "{function}: ttl {ttl} for lock {} exceeds fenced_lock.max_ttl ({max_seconds} s)",
                quote_name(name)
            ),
        )
        .hint("Use a shorter ttl and renew the lease, or ask a superuser to raise fenced_lock.max_ttl.")
    }

    pub fn wait_negative(function: &str, name: &str, wait: &str) -> Self {
        Self::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("{function}: wait {wait} for lock {} is negative", quote_name(name)),
        )
        .hint("Pass a wait of zero or more, or NULL to wait until granted.")
    }

    pub fn token_not_positive(function: &str, name: &str, token: i64) -> Self {
        Self::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("{function}: token {token} for lock {} is not positive", quote_name(name)),
        )
        .hint("Fencing tokens are greater than zero; pass the token your acquire returned.")
    }

    // ---- not allowed (42501) ----------------------------------------------

    pub fn not_owner(function: &str, name: &str, token: i64, owner: &str) -> Self {
        Self::new(
            sqlstate::INSUFFICIENT_PRIVILEGE,
            format!("{function}: lease {token} of lock {} belongs to role \"{owner}\"", quote_name(name)),
        )
        .hint("Only the role that acquired a lease (or a member of it) may renew or release it.")
    }

    pub fn not_operator(function: &str, name: &str) -> Self {
        Self::new(
            sqlstate::INSUFFICIENT_PRIVILEGE,
            format!("{function}: permission denied to force release lock {}", quote_name(name)),
        )
        .hint("Force release needs a superuser or a member of the role named in fenced_lock.operator_role.")
    }

    pub fn max_ttl_untrusted(function: &str) -> Self {
        Self::new(
            sqlstate::INSUFFICIENT_PRIVILEGE,
            format!(
                "{function}: fenced_lock.max_ttl was set for this session by a role that may not set it, and the server's value was lost"
            ),
        )
        .hint("Reconnect without setting fenced_lock.max_ttl (for example in PGOPTIONS or the connection options), or add fenced_lock to shared_preload_libraries.")
    }

    // ---- lost the lock (FL001, FL002) -------------------------------------

    /// `token` is not the live lease of `name`; `live` is the live token, if any.
    pub fn stale_token(name: &str, token: i64, live: Option<i64>) -> Self {
        Self::new(
            sqlstate::STALE_TOKEN,
            format!(
                "stale fencing token {token} for lock {}: live token is {}",
                quote_name(name),
                token_text(live)
            ),
        )
        .detail(format!(
            "lock: {}; presented token: {token}; live token: {}",
            quote_name(name),
            token_text(live)
        ))
        .hint("The lease was lost (expired, released or taken over). Acquire the lock again, re-read, and retry with the new token.")
    }

    /// An UPDATE would lower the token stored in the row.
    pub fn token_goes_backwards(name: &str, token: i64, stored: i64, live: Option<i64>) -> Self {
        Self::new(
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
        .hint("A later lease has written this row. Acquire the lock again, re-read, and retry with the new token.")
    }

    pub fn missing_token(name: &str, column: &str) -> Self {
        Self::new(
            sqlstate::MISSING_TOKEN,
            format!(
                "guarded write to lock {} without a fencing token: column \"{column}\" is NULL",
                quote_name(name)
            ),
        )
        .hint(format!(
            "Acquire the lock and set \"{column}\" to the token fenced_lock_try_acquire or fenced_lock_acquire returned."
        ))
    }

    /// A DELETE, TRUNCATE, or UPDATE moving a row to another lock, with no
    /// `fenced_lock_assert` of `name` in this transaction. `what` says which.
    pub fn delete_without_assert(name: &str, what: &str) -> Self {
        Self::new(
            sqlstate::MISSING_TOKEN,
            format!("guarded {what} lock {} without a fencing token", quote_name(name)),
        )
        .hint(format!(
            "Call fenced_lock_assert({}, <token>) in the same transaction first.",
            sql_literal(name)
        ))
    }

    pub fn guard_truncate_per_row(table: &str, template: &str) -> Self {
        Self::new(
            sqlstate::INSUFFICIENT_PRIVILEGE,
            format!(
                "fenced_lock_guard: cannot truncate \"{table}\": its rows are guarded by per-row locks \"{template}\""
            ),
        )
        .hint("Delete the rows instead, asserting each row's lock; only a table guarded by one lock name can be truncated.")
    }

    // ---- waiting (55P03) --------------------------------------------------

    pub fn wait_timeout(name: &str, waited_ms: i64) -> Self {
        Self::new(
            sqlstate::LOCK_NOT_AVAILABLE,
            format!("fenced_lock_acquire: lock {} not granted within {waited_ms} ms", quote_name(name)),
        )
        .hint(
            "Another holder has the lease; retry later, pass a longer wait, or use fenced_lock_try_acquire.",
        )
    }

    // ---- trigger misuse (39P01, 22023, 42703, 42804, 22004) ---------------

    pub fn guard_not_before_row(table: &str, trigger: &str) -> Self {
        Self::new(
            sqlstate::TRIGGER_PROTOCOL_VIOLATED,
            format!(
                "fenced_lock_guard: trigger \"{trigger}\" on \"{table}\" must be BEFORE ... FOR EACH ROW (or BEFORE TRUNCATE)"
            ),
        )
        .hint("Recreate it as: CREATE TRIGGER ... BEFORE INSERT OR UPDATE OR DELETE ON ... FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('<name template>', '<token column>').")
    }

    pub fn guard_bad_arguments(table: &str, trigger: &str, count: usize) -> Self {
        Self::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!(
                "fenced_lock_guard: trigger \"{trigger}\" on \"{table}\" has {count} arguments; it takes a lock name template and optionally a token column"
            ),
        )
        .hint("Example: EXECUTE FUNCTION fenced_lock_guard('inventory:{item_id}', 'fence_token').")
    }

    pub fn guard_bad_template(table: &str, trigger: &str, problem: &str) -> Self {
        Self::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!(
                "fenced_lock_guard: trigger \"{trigger}\" on \"{table}\" has a bad lock name template: {problem}"
            ),
        )
        .hint("Write columns as {column}; write literal braces as {{ and }}.")
    }

    pub fn guard_missing_column(table: &str, trigger: &str, column: &str, role: &str) -> Self {
        Self::new(
            sqlstate::UNDEFINED_COLUMN,
            format!(
                "fenced_lock_guard: {role} column \"{column}\" of trigger \"{trigger}\" does not exist in \"{table}\""
            ),
        )
        .hint("Column names in the guard's arguments are case-sensitive and must name user columns of the table.")
    }

    pub fn guard_token_not_bigint(table: &str, trigger: &str, column: &str, found: &str) -> Self {
        Self::new(
            sqlstate::DATATYPE_MISMATCH,
            format!(
                "fenced_lock_guard: token column \"{column}\" of \"{table}\" (trigger \"{trigger}\") is {found}, not bigint"
            ),
        )
        .hint("Store fencing tokens in a bigint column.")
    }

    pub fn guard_null_template_value(table: &str, column: &str, template: &str) -> Self {
        Self::new(
            sqlstate::NULL_VALUE_NOT_ALLOWED,
            format!(
                "fenced_lock_guard: column \"{column}\" of \"{table}\" is NULL, so lock name template \"{template}\" names no lock"
            ),
        )
        .hint("Give the column a value, or make it NOT NULL.")
    }

    pub fn guard_bad_resolved_name(table: &str, name: &str) -> Self {
        if name.is_empty() {
            Self::new(
                sqlstate::INVALID_PARAMETER_VALUE,
                format!("fenced_lock_guard: the row of \"{table}\" resolves to an empty lock name"),
            )
        } else {
            Self::new(
                sqlstate::INVALID_PARAMETER_VALUE,
                format!(
                    "fenced_lock_guard: the row of \"{table}\" resolves to lock name {}, {} bytes long, more than {MAX_NAME_BYTES}",
                    quote_name(name),
                    name.len()
                ),
            )
        }
        .hint("A lock name is non-empty text of at most 512 bytes.")
    }

    // ---- installation ------------------------------------------------------

    pub fn not_installed(what: &str) -> Self {
        Self::new(sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE, format!("fenced_lock: {what} is missing")).hint(
            "Run CREATE EXTENSION fenced_lock in this database (or ALTER EXTENSION fenced_lock UPDATE).",
        )
    }
}

/// `s` as an SQL string literal, for hints that show a statement to run.
pub fn sql_literal(s: &str) -> String {
    let shown = if s.len() > 80 { &quote_name(s)[1..] } else { s };
    format!("'{}'", shown.trim_end_matches("\"...").replace('\'', "''"))
}

/// Encode a five-character SQLSTATE the way PostgreSQL's MAKE_SQLSTATE does.
pub fn encode_sqlstate(code: &str) -> i32 {
    let b = code.as_bytes();
    assert_eq!(b.len(), 5, "SQLSTATE must have five characters");
    let six = |c: u8| ((c.wrapping_sub(b'0')) & 0x3F) as i32;
    six(b[0]) + (six(b[1]) << 6) + (six(b[2]) << 12) + (six(b[3]) << 18) + (six(b[4]) << 24)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_encode_like_make_sqlstate() {
        // ERRCODE_INVALID_PARAMETER_VALUE in PostgreSQL's errcodes.h
        assert_eq!(encode_sqlstate("22023"), 50856066);
        // round trip: decode what we encoded
        for code in ["FL001", "FL002", "55P03", "22004", "22023", "42501", "39P01", "42703", "42804"] {
            let v = encode_sqlstate(code);
            let decoded: String = (0..5).map(|i| (((v >> (6 * i)) & 0x3F) as u8 + b'0') as char).collect();
            assert_eq!(decoded, code);
        }
    }

    #[test]
    fn long_names_are_cut_in_messages_on_a_char_boundary() {
        let name = "é".repeat(300);
        let q = quote_name(&name);
        assert!(q.len() < 100);
        assert!(q.ends_with("\"..."));
        assert_eq!(quote_name("a"), "\"a\"");
    }

    #[test]
    fn stale_token_message_names_lock_and_both_tokens() {
        let e = FlError::stale_token("inventory:1", 41, Some(42));
        assert_eq!(e.sqlstate, "FL001");
        assert!(e.message.contains("\"inventory:1\""));
        assert!(e.message.contains("41"));
        assert!(e.message.contains("42"));
        let e = FlError::stale_token("x", 7, None);
        assert!(e.message.contains("live token is none"));
    }

    #[test]
    fn sql_literal_doubles_quotes() {
        assert_eq!(sql_literal("it's"), "'it''s'");
    }
}
