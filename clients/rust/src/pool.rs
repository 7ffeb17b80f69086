//! [`Pool`]: a small client-side pool of [`Connection`]s.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Config};

use crate::connection::{parse_dsn, Connection, Home};
use crate::error::Error;
use crate::tap::{TapState, TransactionStatus};

struct Idle {
    client: Client,
    tap: Arc<TapState>,
    driver: Option<JoinHandle<()>>,
}

struct PoolInner {
    config: Config,
    max_size: usize,
    wait: Duration,
    slots: Arc<Semaphore>,
    idle: Mutex<Vec<Idle>>,
}

/// Where a pooled connection goes back to when its last clone is dropped.
struct PoolHome {
    pool: Weak<PoolInner>,
    _slot: OwnedSemaphorePermit,
}

impl Home for PoolHome {
    fn give_back(self: Box<Self>, client: Client, tap: Arc<TapState>, driver: Option<JoinHandle<()>>) {
        // Only a connection that is open and idle, with nothing in flight,
        // is handed to the next user; any other is closed.
        let reusable = !client.is_closed() && tap.status_if_settled() == Some(TransactionStatus::Idle);
        if let (true, Some(pool)) = (reusable, self.pool.upgrade()) {
            pool.idle.lock().unwrap().push(Idle { client, tap, driver });
        }
        // The slot is given back when `self` is dropped, after the push.
    }
}

/// A bounded pool of [`Connection`]s, for a [`crate::Locker`] (or your own
/// queries).
///
/// A lease keeps the pooled connection it was acquired on until it ends,
/// and its keepalive takes a second slot for a connection of its own
/// (opened with `application_name = fenced_lock_keepalive`, closed when the
/// keepalive ends): size the pool at two connections per lease held at the
/// same time, plus what the application uses otherwise.
///
/// A connection goes back to the pool when its last clone is dropped, if it
/// is open and outside a transaction with nothing in flight; otherwise it is
/// closed. Nothing is reset on the way back (no `DISCARD ALL`: that would
/// end the session's session-bound leases).
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("max_size", &self.inner.max_size).field("size", &self.size()).finish()
    }
}

/// Builds a [`Pool`].
pub struct PoolBuilder {
    config: Config,
    max_size: usize,
    wait: Duration,
}

impl PoolBuilder {
    /// At most this many connections open at once (default 10).
    pub fn max_size(mut self, n: usize) -> Self {
        self.max_size = n;
        self
    }

    /// How long [`Pool::get`] waits for a free slot before it fails with a
    /// usage error (default 30 s).
    pub fn wait_timeout(mut self, d: Duration) -> Self {
        self.wait = d;
        self
    }

    /// The pool (connections are opened when first needed).
    pub fn build(self) -> Result<Pool, Error> {
        if self.max_size == 0 {
            return Err(Error::invalid_argument(
                "Pool: max_size must be at least 1",
                "A lease with keepalive needs two connections; give max_size >= 2.",
            ));
        }
        Ok(Pool {
            inner: Arc::new(PoolInner {
                config: self.config,
                max_size: self.max_size,
                wait: self.wait,
                slots: Arc::new(Semaphore::new(self.max_size)),
                idle: Mutex::new(Vec::new()),
            }),
        })
    }
}

impl Pool {
    /// A pool of connections made from `config` (no TLS).
    pub fn builder(config: Config) -> PoolBuilder {
        PoolBuilder { config, max_size: 10, wait: Duration::from_secs(30) }
    }

    /// A pool of connections to a `postgresql://` URL or `key=value`
    /// string, with the default settings.
    pub fn new(dsn: &str) -> Result<Pool, Error> {
        Pool::builder(parse_dsn(dsn)?).build()
    }

    /// The most connections open at once.
    pub fn max_size(&self) -> usize {
        self.inner.max_size
    }

    /// Connections open now (in use or idle).
    pub fn size(&self) -> usize {
        self.inner.max_size - self.inner.slots.available_permits() + self.inner.idle.lock().unwrap().len()
    }

    pub(crate) async fn slot(&self) -> Result<OwnedSemaphorePermit, Error> {
        match tokio::time::timeout(self.inner.wait, self.inner.slots.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            _ => Err(Error::usage(format!(
                "Pool: no free connection within {:?} (max_size {}); a lease with keepalive holds two",
                self.inner.wait, self.inner.max_size
            ))),
        }
    }

    /// A connection: an idle one, or a new one if there is none, waiting for
    /// a free slot at most the pool's `wait_timeout`.
    pub async fn get(&self) -> Result<Connection, Error> {
        let slot = self.slot().await?;
        loop {
            let idle = self.inner.idle.lock().unwrap().pop();
            match idle {
                Some(i) if !i.client.is_closed() && !i.tap.closed() => {
                    let home = PoolHome { pool: Arc::downgrade(&self.inner), _slot: slot };
                    return Ok(Connection::from_parts(i.client, i.tap, i.driver, Some(Box::new(home))));
                }
                Some(_) => continue,
                None => break,
            }
        }
        let conn = Connection::connect(&self.inner.config).await?;
        Ok(conn.with_home(Box::new(PoolHome { pool: Arc::downgrade(&self.inner), _slot: slot })))
    }

    /// A new connection of its own in a slot of the pool, with settings of
    /// its own, closed (not kept) when its last clone is dropped.
    pub(crate) async fn dedicated(
        &self,
        configure: impl FnOnce(&mut Config),
        reserved: Option<OwnedSemaphorePermit>,
    ) -> Result<Connection, Error> {
        let slot = match reserved {
            Some(s) => s,
            None => self.slot().await?,
        };
        let mut config = self.inner.config.clone();
        configure(&mut config);
        let conn = Connection::connect(&config).await?;
        // A home whose pool is gone: the connection is closed, the slot freed.
        Ok(conn.with_home(Box::new(PoolHome { pool: Weak::new(), _slot: slot })))
    }
}
