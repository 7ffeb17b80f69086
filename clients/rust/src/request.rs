//! What an acquire asks for, and the client's own checks of it.

use std::time::Duration;

use crate::connection::Connection;
use crate::error::Error;

/// The longest ttl or wait the client sends (the server's
/// `fenced_lock.max_ttl` is lower unless raised).
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 86400);

/// Every argument of the server function, with the server's defaults, plus
/// the client's own: keepalive, the connection to acquire on, the retry
/// helper's attempts.
#[derive(Clone)]
pub(crate) struct Request {
    pub(crate) name: String,
    pub(crate) ttl: Duration,
    pub(crate) wait: Option<Duration>,
    pub(crate) holder: Option<String>,
    pub(crate) session_bound: bool,
    pub(crate) shared: bool,
    pub(crate) permits: u32,
    pub(crate) keepalive: bool,
    pub(crate) conn: Option<Connection>,
    pub(crate) attempts: Option<u32>,
}

impl Request {
    pub(crate) fn new(name: String) -> Request {
        Request {
            name,
            ttl: Duration::from_secs(30),
            wait: None,
            holder: None,
            session_bound: false,
            shared: false,
            permits: 1,
            keepalive: true,
            conn: None,
            attempts: None,
        }
    }

    /// The client's own checks, in the order of the server function's
    /// arguments, against the locker's `keepalive_interval` and
    /// `transaction_pooling`; nothing is sent when one fails.
    pub(crate) fn validate(
        &self,
        waiting: bool,
        keepalive_interval: Option<Duration>,
        transaction_pooling: bool,
    ) -> Result<(), Error> {
        if self.name.is_empty() {
            return Err(Error::invalid_argument(
                "name must not be empty",
                "A lock name is non-empty text of at most 512 bytes.",
            ));
        }
        if self.name.contains('\0') {
            return Err(Error::invalid_argument(
                "name must not contain a NUL character",
                "PostgreSQL text cannot hold NUL characters.",
            ));
        }
        check_duration("ttl", self.ttl, false)?;
        if waiting {
            if let Some(w) = self.wait {
                check_duration("wait", w, true)?;
            }
        }
        if self.holder.as_deref().is_some_and(|h| h.contains('\0')) {
            return Err(Error::invalid_argument(
                "holder must not contain a NUL character",
                "PostgreSQL text cannot hold NUL characters.",
            ));
        }
        if self.permits < 1 {
            return Err(Error::invalid_argument(
                format!("permits must be at least 1, not {}", self.permits),
                "1 is an ordinary exclusive lease; N > 1 is one of N permits.",
            ));
        }
        if self.shared && self.permits > 1 {
            return Err(Error::invalid_argument(
                format!("shared cannot be combined with permits = {}", self.permits),
                "A lease is shared, or one of N permits, not both.",
            ));
        }
        if self.keepalive {
            if let Some(i) = keepalive_interval {
                if i >= self.ttl {
                    return Err(Error::invalid_argument(
                        format!("keepalive_interval {i:?} must be shorter than the ttl {:?}", self.ttl),
                        "Renew a few times per ttl: leave keepalive_interval unset for ttl/3.",
                    ));
                }
            }
        }
        if self.session_bound && transaction_pooling {
            return Err(Error::usage(
                "session_bound = true is refused with transaction_pooling: the session would be a pooled \
                 server connection shared with other clients, and the lease would end with their session, \
                 not yours; use a plain lease (ttl + keepalive)",
            ));
        }
        Ok(())
    }
}

fn check_duration(arg: &str, d: Duration, zero_ok: bool) -> Result<(), Error> {
    if !zero_ok && d < Duration::from_micros(1) {
        return Err(Error::invalid_argument(
            format!("{arg} must be greater than zero (at least 1 microsecond), not {d:?}"),
            "Pass a ttl such as Duration::from_secs(30).",
        ));
    }
    if d > MAX_DURATION {
        return Err(Error::invalid_argument(
            format!("{arg} {d:?} is longer than 100 years"),
            "Leases are renewed: use a ttl of seconds to hours.",
        ));
    }
    Ok(())
}
