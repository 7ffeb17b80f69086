//! Typed errors: every SQLSTATE of the contract has its own variant, each
//! carrying the server's SQLSTATE, message, detail and hint.

use std::error::Error as StdError;
use std::fmt;

/// The SQLSTATEs the contract gives a type of their own.
pub mod sqlstate {
    /// A guarded write or `fenced_lock_assert` with a token that is not live.
    pub const STALE_TOKEN: &str = "FL001";
    /// A guarded write without a token.
    pub const MISSING_TOKEN: &str = "FL002";
    /// The request can never be granted as asked (0.3.0).
    pub const MODE_CONFLICT: &str = "FL003";
    /// `acquire` waited `wait` without a grant.
    pub const WAIT_TIMEOUT: &str = "55P03";
    /// A lease change on a standby or in a read-only transaction.
    pub const READ_ONLY: &str = "25006";
    /// Renew or release of another role's lease, a role without EXECUTE, ...
    pub const NOT_ALLOWED: &str = "42501";
    /// A bad argument value (also raised by the client before sending).
    pub const INVALID_ARGUMENT: &str = "22023";
}

/// What the server (or, for [`Error::InvalidArgument`] raised before
/// anything is sent, the client) said about a failed call.
#[derive(Debug)]
pub struct SqlError {
    sqlstate: String,
    message: String,
    detail: Option<String>,
    hint: Option<String>,
    source: Option<tokio_postgres::Error>,
}

impl SqlError {
    /// The five-character SQLSTATE.
    pub fn sqlstate(&self) -> &str {
        &self.sqlstate
    }
    /// The primary message.
    pub fn message(&self) -> &str {
        &self.message
    }
    /// The server's DETAIL, if any.
    pub fn detail(&self) -> Option<&str> {
        self.detail.as_deref()
    }
    /// The server's HINT, if any.
    pub fn hint(&self) -> Option<&str> {
        self.hint.as_deref()
    }
    /// True when the server raised it; false for an argument the client
    /// refused before sending anything.
    pub fn from_server(&self) -> bool {
        self.source.is_some()
    }
    /// The driver's error, when the server raised it.
    pub fn driver_error(&self) -> Option<&tokio_postgres::Error> {
        self.source.as_ref()
    }
}

impl fmt::Display for SqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (SQLSTATE {})", self.message, self.sqlstate)?;
        if let Some(d) = &self.detail {
            write!(f, "; detail: {d}")?;
        }
        if let Some(h) = &self.hint {
            write!(f, "; hint: {h}")?;
        }
        Ok(())
    }
}

/// Every error of this crate.
///
/// Match on the variant to tell "you lost the lock" ([`Error::StaleToken`])
/// from everything else; [`Error::sqlstate`] gives the code whatever the
/// variant.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// `FL001`: the token is not the live lease (the lease was lost and the
    /// database refused the write). The retry helper retries on this one.
    StaleToken(SqlError),
    /// `FL002`: a guarded write without a token.
    MissingToken(SqlError),
    /// `FL003`: the request can never be granted as asked.
    ModeConflict(SqlError),
    /// `55P03`: `acquire` waited `wait` without a grant.
    WaitTimeout(SqlError),
    /// `25006`: a lease change on a standby or in a read-only transaction.
    ReadOnly(SqlError),
    /// `42501`: not allowed (another role's lease, no EXECUTE, ...).
    NotAllowed(SqlError),
    /// `22023`: a bad argument value. Raised by the client before anything
    /// is sent (the message names the argument), or by the server for what
    /// only it can judge (a name over 512 bytes, a ttl above
    /// `fenced_lock.max_ttl`).
    InvalidArgument(SqlError),
    /// Any other SQLSTATE, as the server raised it.
    Database(SqlError),
    /// The call was refused by the client because it cannot work as asked
    /// (an acquire inside a transaction block, a session-bound lease behind
    /// transaction pooling, a pool with no free connection). Nothing was
    /// sent.
    Usage(String),
    /// The connection could not be opened or was lost (no SQLSTATE).
    Connection(Box<dyn StdError + Send + Sync>),
    /// Another error of the driver without a SQLSTATE (a row of an
    /// unexpected type, an unexpected row count, ...).
    Driver(tokio_postgres::Error),
    /// An error of the caller's own code, returned from the closure given to
    /// the retry helper (see [`Error::other`]).
    Other(Box<dyn StdError + Send + Sync>),
}

impl Error {
    /// Wraps an error of the caller's own code, for the retry helper's
    /// closure. It is returned as it is, after the release.
    pub fn other(e: impl Into<Box<dyn StdError + Send + Sync>>) -> Error {
        Error::Other(e.into())
    }

    pub(crate) fn invalid_argument(message: impl Into<String>, hint: impl Into<String>) -> Error {
        Error::InvalidArgument(SqlError {
            sqlstate: sqlstate::INVALID_ARGUMENT.to_string(),
            message: message.into(),
            detail: None,
            hint: Some(hint.into()),
            source: None,
        })
    }

    pub(crate) fn usage(message: impl Into<String>) -> Error {
        Error::Usage(message.into())
    }

    pub(crate) fn connection(e: impl Into<Box<dyn StdError + Send + Sync>>) -> Error {
        Error::Connection(e.into())
    }

    /// The SQL-level details, for the variants that have them.
    pub fn sql(&self) -> Option<&SqlError> {
        match self {
            Error::StaleToken(e)
            | Error::MissingToken(e)
            | Error::ModeConflict(e)
            | Error::WaitTimeout(e)
            | Error::ReadOnly(e)
            | Error::NotAllowed(e)
            | Error::InvalidArgument(e)
            | Error::Database(e) => Some(e),
            _ => None,
        }
    }

    /// The SQLSTATE, or `None` for errors that have none (connection, usage,
    /// the caller's own).
    pub fn sqlstate(&self) -> Option<&str> {
        self.sql().map(SqlError::sqlstate)
    }

    /// The server's DETAIL, if any.
    pub fn detail(&self) -> Option<&str> {
        self.sql().and_then(SqlError::detail)
    }

    /// The server's HINT, if any.
    pub fn hint(&self) -> Option<&str> {
        self.sql().and_then(SqlError::hint)
    }

    /// `FL001`: the lease was lost and the database refused the write.
    pub fn is_stale_token(&self) -> bool {
        matches!(self, Error::StaleToken(_))
    }

    /// The connection could not be opened or was lost.
    pub fn is_connection(&self) -> bool {
        match self {
            Error::Connection(_) => true,
            // Admin shutdown and the like end the session: the connection is gone.
            Error::Database(e) => e.sqlstate.starts_with("08") || e.sqlstate.starts_with("57P0"),
            _ => false,
        }
    }

    /// Maps a SQLSTATE to its variant (also used for errors built here).
    pub(crate) fn from_sql(e: SqlError) -> Error {
        match e.sqlstate.as_str() {
            sqlstate::STALE_TOKEN => Error::StaleToken(e),
            sqlstate::MISSING_TOKEN => Error::MissingToken(e),
            sqlstate::MODE_CONFLICT => Error::ModeConflict(e),
            sqlstate::WAIT_TIMEOUT => Error::WaitTimeout(e),
            sqlstate::READ_ONLY => Error::ReadOnly(e),
            sqlstate::NOT_ALLOWED => Error::NotAllowed(e),
            sqlstate::INVALID_ARGUMENT => Error::InvalidArgument(e),
            _ => Error::Database(e),
        }
    }
}

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Error {
        if let Some(db) = e.as_db_error() {
            let sql = SqlError {
                sqlstate: db.code().code().to_string(),
                message: db.message().to_string(),
                detail: db.detail().map(str::to_string),
                hint: db.hint().map(str::to_string),
                source: None,
            };
            return Error::from_sql(SqlError { source: Some(e), ..sql });
        }
        let io = e.source().is_some_and(|s| s.is::<std::io::Error>());
        if e.is_closed() || io {
            Error::Connection(Box::new(e))
        } else {
            Error::Driver(e)
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::StaleToken(e) => write!(f, "stale token: {e}"),
            Error::MissingToken(e) => write!(f, "missing token: {e}"),
            Error::ModeConflict(e) => write!(f, "mode conflict: {e}"),
            Error::WaitTimeout(e) => write!(f, "wait timeout: {e}"),
            Error::ReadOnly(e) => write!(f, "read only: {e}"),
            Error::NotAllowed(e) => write!(f, "not allowed: {e}"),
            Error::InvalidArgument(e) => write!(f, "invalid argument: {e}"),
            Error::Database(e) => write!(f, "database error: {e}"),
            Error::Usage(m) => write!(f, "usage error: {m}"),
            Error::Connection(e) => write!(f, "connection error: {e}"),
            Error::Driver(e) => write!(f, "driver error: {e}"),
            Error::Other(e) => write!(f, "{e}"),
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Connection(e) | Error::Other(e) => Some(e.as_ref()),
            Error::Driver(e) => Some(e),
            _ => self.sql().and_then(|s| s.source.as_ref()).map(|e| e as &(dyn StdError + 'static)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(code: &str) -> SqlError {
        SqlError { sqlstate: code.into(), message: "m".into(), detail: None, hint: None, source: None }
    }

    #[test]
    fn each_sqlstate_of_the_contract_has_its_variant_and_the_rest_are_database_errors() {
        assert!(matches!(Error::from_sql(sql("FL001")), Error::StaleToken(_)));
        assert!(matches!(Error::from_sql(sql("FL002")), Error::MissingToken(_)));
        assert!(matches!(Error::from_sql(sql("FL003")), Error::ModeConflict(_)));
        assert!(matches!(Error::from_sql(sql("55P03")), Error::WaitTimeout(_)));
        assert!(matches!(Error::from_sql(sql("25006")), Error::ReadOnly(_)));
        assert!(matches!(Error::from_sql(sql("42501")), Error::NotAllowed(_)));
        assert!(matches!(Error::from_sql(sql("22023")), Error::InvalidArgument(_)));
        assert!(matches!(Error::from_sql(sql("22004")), Error::Database(_)));
        assert_eq!(Error::from_sql(sql("40001")).sqlstate(), Some("40001"));
    }

    #[test]
    fn a_client_side_invalid_argument_carries_22023_and_is_not_from_the_server() {
        let e = Error::invalid_argument("name must not be empty", "pass a name");
        assert_eq!(e.sqlstate(), Some("22023"));
        assert!(!e.sql().unwrap().from_server());
        assert_eq!(e.hint(), Some("pass a name"));
    }
}
