//! Where a locker's connections come from (a `Config`, a [`Pool`] or a
//! factory), what each is for, and where the extension's functions are in
//! their database.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio_postgres::Config;

use crate::connection::Connection;
use crate::error::Error;
use crate::pool::Pool;

/// The `application_name` of keepalive connections, so that a DBA can find
/// them in `pg_stat_activity`.
pub const KEEPALIVE_APPLICATION_NAME: &str = "fenced_lock_keepalive";

/// What a connection of a [`crate::Locker`] is for, as told to a factory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Purpose {
    /// The lease's connection: the acquire, the caller's guarded writes, the
    /// release.
    Lease,
    /// A keepalive's own connection. The locker sets its
    /// `application_name` to [`KEEPALIVE_APPLICATION_NAME`] once opened.
    Keepalive,
    /// A release whose lease connection was gone.
    Release,
}

pub(crate) type FactoryFn =
    dyn Fn(Purpose) -> Pin<Box<dyn Future<Output = Result<Connection, Error>> + Send>> + Send + Sync;

/// The three ways a locker can be given to open connections.
pub(crate) enum Origin {
    Config(Box<Config>),
    Pool(Pool),
    Factory(Arc<FactoryFn>),
}

/// A locker's connections and its schema: all that a lease, its keepalive
/// and its release need of the locker.
pub(crate) struct Source {
    origin: Origin,
    /// `"schema".` or empty: what goes before the extension's function
    /// names.
    pub(crate) prefix: String,
}

impl Source {
    pub(crate) fn new(origin: Origin, prefix: String) -> Source {
        Source { origin, prefix }
    }

    /// `config`, `pool` or `factory`, for `Debug`.
    pub(crate) fn kind(&self) -> &'static str {
        match self.origin {
            Origin::Config(_) => "config",
            Origin::Pool(_) => "pool",
            Origin::Factory(_) => "factory",
        }
    }

    /// A connection for `purpose`.
    pub(crate) async fn open(&self, purpose: Purpose) -> Result<Connection, Error> {
        match &self.origin {
            Origin::Config(c) => Connection::connect(c).await,
            Origin::Pool(p) => p.get().await,
            Origin::Factory(f) => f(purpose).await,
        }
    }

    /// With a pool, the slot of a lease's keepalive connection, taken
    /// before the acquire so that a pool too small for it fails the acquire
    /// (before anything is sent) rather than the keepalive later.
    pub(crate) async fn reserve_keepalive(&self) -> Result<Option<OwnedSemaphorePermit>, Error> {
        match &self.origin {
            Origin::Pool(p) => Ok(Some(p.slot().await?)),
            _ => Ok(None),
        }
    }

    /// A keepalive connection, in its reserved pool slot if it has one.
    pub(crate) async fn open_keepalive(
        &self,
        reserved: Option<OwnedSemaphorePermit>,
        interval: Duration,
    ) -> Result<Connection, Error> {
        match &self.origin {
            Origin::Config(c) => Connection::connect(&keepalive_config(c, interval)).await,
            Origin::Pool(p) => p.dedicated(|c| *c = keepalive_config(c, interval), reserved).await,
            Origin::Factory(f) => {
                let conn = f(Purpose::Keepalive).await?;
                conn.batch_execute(&format!("SET application_name = '{KEEPALIVE_APPLICATION_NAME}'")).await?;
                Ok(conn)
            }
        }
    }
}

/// A keepalive's connection settings: its `application_name`, and a TCP
/// user timeout of one renew interval (at least a second), so that a renew
/// sent into a network cut fails with a connection error after that long,
/// instead of waiting on a dead connection until the deadline, and is
/// retried on a new connection. A renew waiting on the server for the
/// lease's lock is not cut by it (the server acknowledges the bytes): its own
/// `lock_timeout` gives it up (see `keepalive::held_up_bound`).
fn keepalive_config(base: &Config, interval: Duration) -> Config {
    let mut c = base.clone();
    c.application_name(KEEPALIVE_APPLICATION_NAME);
    let timeout = interval.max(Duration::from_secs(1));
    c.tcp_user_timeout(base.get_tcp_user_timeout().map_or(timeout, |t| (*t).min(timeout)));
    c
}
