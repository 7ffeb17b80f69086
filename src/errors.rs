//! The error type and the SQLSTATEs fenced_lock raises.
//!
//! Each module builds the errors it raises, next to the decision that raises
//! them; this file holds only what they share. Errors are values (`FlError`)
//! until the very top of a SQL-callable function (`fmgr.rs`), where they are
//! handed to PostgreSQL with their own SQLSTATE: pgrx's `ereport!` cannot
//! carry a code it does not know, such as `FL001`. `docs/reference.md` lists
//! every code; a unit test below keeps that table and this file in step.

use std::fmt;

/// SQLSTATEs used by fenced_lock (docs/reference.md, "SQLSTATEs").
pub mod sqlstate {
    /// Stale token: not the live lease of the name.
    pub const STALE_TOKEN: &str = "FL001";
    /// Guarded write without a token.
    pub const MISSING_TOKEN: &str = "FL002";
    /// A request that can never be granted as asked (another mode or count
    /// is live, an upgrade, waiting for a lease of one's own session).
    pub const MODE_CONFLICT: &str = "FL003";
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
    /// A lease change on a hot standby or in a read-only transaction.
    pub const READ_ONLY_SQL_TRANSACTION: &str = "25006";
    /// A lease record changed under a statement that could not see it.
    pub const SERIALIZATION_FAILURE: &str = "40001";
    /// The extension's objects are missing, or older than the library.
    pub const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
    /// `fenced_lock_protect` of something that is not a table.
    pub const WRONG_OBJECT_TYPE: &str = "42809";
    /// `fenced_lock_protect` of a table protected with other arguments.
    pub const DUPLICATE_OBJECT: &str = "42710";
    /// A relation given by OID that does not exist (any more).
    pub const UNDEFINED_TABLE: &str = "42P01";
    /// Something that should not happen (an SPI failure without an error).
    pub const INTERNAL_ERROR: &str = "XX000";

    /// Every code above, for the documentation test.
    #[cfg(test)]
    pub const ALL: [&str; 16] = [
        STALE_TOKEN,
        MISSING_TOKEN,
        MODE_CONFLICT,
        LOCK_NOT_AVAILABLE,
        NULL_VALUE_NOT_ALLOWED,
        INVALID_PARAMETER_VALUE,
        INSUFFICIENT_PRIVILEGE,
        TRIGGER_PROTOCOL_VIOLATED,
        UNDEFINED_COLUMN,
        DATATYPE_MISMATCH,
        READ_ONLY_SQL_TRANSACTION,
        SERIALIZATION_FAILURE,
        OBJECT_NOT_IN_PREREQUISITE_STATE,
        WRONG_OBJECT_TYPE,
        DUPLICATE_OBJECT,
        UNDEFINED_TABLE,
    ];
}

/// Longest lock name, in bytes (docs/design.md, "Words").
pub const MAX_NAME_BYTES: usize = 512;
/// Longest holder, in bytes.
pub const MAX_HOLDER_BYTES: usize = 512;
/// Longest prefix of a lock name quoted in a message.
const SHOWN_NAME_BYTES: usize = 80;

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

impl FlError {
    pub fn new(sqlstate: &'static str, message: String) -> Self {
        FlError { sqlstate, message, detail: None, hint: None }
    }

    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// The extension's objects are missing (or damaged).
    pub fn not_installed(what: &str) -> Self {
        Self::new(sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE, format!("fenced_lock: {what} is missing")).hint(
            "Run CREATE EXTENSION fenced_lock in this database (or ALTER EXTENSION fenced_lock UPDATE).",
        )
    }
}

/// A lock name fit to quote in a message: over-long names are cut (on a
/// character boundary) so that an error never echoes megabytes back. A cut
/// name is marked with `...` after the closing quote: it names another lock.
pub fn quote_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len().min(SHOWN_NAME_BYTES) + 8);
    out.push('"');
    if name.len() <= SHOWN_NAME_BYTES {
        out.push_str(name);
        out.push('"');
    } else {
        out.push_str(&name[..char_floor(name, SHOWN_NAME_BYTES)]);
        out.push_str("\"...");
    }
    out
}

/// Is `quote_name(name)` the whole name?
pub fn quoted_in_full(name: &str) -> bool {
    name.len() <= SHOWN_NAME_BYTES
}

fn char_floor(s: &str, mut at: usize) -> usize {
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// "none" or the token, for messages.
pub fn token_text(token: Option<i64>) -> String {
    match token {
        Some(t) => t.to_string(),
        None => "none".to_string(),
    }
}

/// `s` as an SQL string literal, for hints that show a statement to run.
pub fn sql_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
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
        for code in sqlstate::ALL {
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
        assert!(!quoted_in_full(&name));
        assert_eq!(quote_name("a"), "\"a\"");
    }

    #[test]
    fn sql_literal_doubles_quotes() {
        assert_eq!(sql_literal("it's"), "'it''s'");
    }

    /// docs/reference.md documents every SQLSTATE this file defines.
    #[test]
    fn reference_documents_every_sqlstate() {
        let reference = include_str!("../docs/reference.md");
        for code in sqlstate::ALL {
            assert!(reference.contains(&format!("| `{code}` |")), "docs/reference.md lacks a row for {code}");
        }
    }
}
