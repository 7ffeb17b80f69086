//! [`Locker`]: built from a source of connections and its options, it takes
//! leases: the acquires and the retry helper.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Config;

use crate::connection::{parse_dsn, Connection};
use crate::error::Error;
use crate::lease::{Grant, Lease};
use crate::pool::Pool;
use crate::request::Request;
use crate::source::{FactoryFn, Origin, Purpose, Source};
use crate::tap::TransactionStatus;

struct LockerInner {
    source: Arc<Source>,
    keepalive_interval: Option<Duration>,
    attempts: u32,
    transaction_pooling: bool,
}

impl LockerInner {
    fn validate(&self, r: &Request, waiting: bool) -> Result<(), Error> {
        r.validate(waiting, self.keepalive_interval, self.transaction_pooling)
    }
}

/// Takes leases. Built from a connection string, a [`Config`], a [`Pool`]
/// or a factory of [`Connection`]s; cheap to clone (clones share
/// everything).
///
/// ```no_run
/// # async fn f() -> Result<(), fenced_lock::Error> {
/// let locker = fenced_lock::Locker::new("postgresql://app@db.internal/shop")?;
/// let lease = locker.acquire("inventory:1").ttl(std::time::Duration::from_secs(10)).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locker {
    inner: Arc<LockerInner>,
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locker")
            .field("source", &self.inner.source.kind())
            .field("keepalive_interval", &self.inner.keepalive_interval)
            .field("attempts", &self.inner.attempts)
            .field("transaction_pooling", &self.inner.transaction_pooling)
            .finish()
    }
}

/// Builds a [`Locker`]: one source of connections, and the options.
#[must_use]
pub struct LockerBuilder {
    origin: Result<Origin, Error>,
    keepalive_interval: Option<Duration>,
    attempts: u32,
    transaction_pooling: bool,
    schema: Option<String>,
}

impl LockerBuilder {
    /// How often a keepalive renews (default: a third of the lease's ttl).
    /// It must be shorter than the ttl of every lease taken.
    pub fn keepalive_interval(mut self, d: Duration) -> Self {
        self.keepalive_interval = Some(d);
        self
    }

    /// How many times in all the retry helper runs (default 5).
    pub fn attempts(mut self, n: u32) -> Self {
        self.attempts = n;
        self
    }

    /// The connections go through PgBouncer (or another pooler) in
    /// transaction mode: session-bound leases are then refused, because the
    /// session would be a server connection shared with other clients
    /// (default false).
    pub fn transaction_pooling(mut self, on: bool) -> Self {
        self.transaction_pooling = on;
        self
    }

    /// The schema the extension was created in, when it is not on the
    /// connections' `search_path`.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// The locker, or the invalid-argument error naming the first bad
    /// option.
    pub fn build(self) -> Result<Locker, Error> {
        let origin = self.origin?;
        if self.keepalive_interval == Some(Duration::ZERO) {
            return Err(Error::invalid_argument(
                "keepalive_interval must be greater than zero",
                "Leave it unset for a third of the ttl.",
            ));
        }
        if self.attempts == 0 {
            return Err(Error::invalid_argument("attempts must be at least 1", "The default is 5."));
        }
        let prefix = match self.schema {
            None => String::new(),
            Some(s) if s.is_empty() || s.contains('\0') => {
                return Err(Error::invalid_argument(
                    "schema must be a non-empty name without NUL characters",
                    "Give the schema of CREATE EXTENSION fenced_lock SCHEMA ..., or leave it unset.",
                ))
            }
            Some(s) => format!("\"{}\".", s.replace('"', "\"\"")),
        };
        Ok(Locker {
            inner: Arc::new(LockerInner {
                source: Arc::new(Source::new(origin, prefix)),
                keepalive_interval: self.keepalive_interval,
                attempts: self.attempts,
                transaction_pooling: self.transaction_pooling,
            }),
        })
    }
}

impl Locker {
    /// A locker that opens its connections from a `postgresql://` URL or a
    /// `key=value` string (no TLS; for TLS use [`Locker::factory`] with
    /// [`Connection::connect_tls`]), with the default options.
    pub fn new(dsn: &str) -> Result<Locker, Error> {
        Locker::builder(dsn).build()
    }

    /// A builder with connections from a connection string.
    pub fn builder(dsn: &str) -> LockerBuilder {
        Self::with_origin(parse_dsn(dsn).map(|c| Origin::Config(Box::new(c))))
    }

    /// A builder with connections from a tokio-postgres [`Config`].
    pub fn from_config(config: Config) -> LockerBuilder {
        Self::with_origin(Ok(Origin::Config(Box::new(config))))
    }

    /// A builder with connections from a [`Pool`].
    pub fn from_pool(pool: Pool) -> LockerBuilder {
        Self::with_origin(Ok(Origin::Pool(pool)))
    }

    /// A builder with connections from a factory: an async function that
    /// opens a [`Connection`] (with [`Connection::connect`] or
    /// [`Connection::connect_tls`], say), told what it is for.
    pub fn factory<F, Fut>(f: F) -> LockerBuilder
    where
        F: Fn(Purpose) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Connection, Error>> + Send + 'static,
    {
        let f: Arc<FactoryFn> = Arc::new(move |p| Box::pin(f(p)));
        Self::with_origin(Ok(Origin::Factory(f)))
    }

    fn with_origin(origin: Result<Origin, Error>) -> LockerBuilder {
        LockerBuilder {
            origin,
            keepalive_interval: None,
            attempts: 5,
            transaction_pooling: false,
            schema: None,
        }
    }

    /// A new connection from this locker's source, for the caller's own use
    /// (to acquire on with [`Acquire::on`], for one).
    pub async fn connect(&self) -> Result<Connection, Error> {
        self.inner.source.open(Purpose::Lease).await
    }

    /// `fenced_lock_try_acquire`: a lease now, or `None` if it cannot be
    /// granted without waiting. Set the options on the returned builder and
    /// `.await` it.
    pub fn try_acquire(&self, name: impl Into<String>) -> Acquire<'_, Try> {
        Acquire::new(self, name.into())
    }

    /// `fenced_lock_acquire`: waits in line (at most [`Acquire::wait`], or
    /// until granted). Set the options on the returned builder and `.await`
    /// it, or hand it a closure with [`Acquire::run`].
    pub fn acquire(&self, name: impl Into<String>) -> Acquire<'_, Wait> {
        Acquire::new(self, name.into())
    }

    /// The retry helper with the default acquire options:
    /// `locker.acquire(name).run(f)`.
    pub async fn run<T, F>(&self, name: impl Into<String>, f: F) -> Result<T, Error>
    where
        F: AsyncFnMut(&Lease) -> Result<T, Error>,
    {
        self.acquire(name).run(f).await
    }
}

/// Marks an [`Acquire`] of [`Locker::try_acquire`].
#[derive(Debug)]
pub enum Try {}
/// Marks an [`Acquire`] of [`Locker::acquire`].
#[derive(Debug)]
pub enum Wait {}

/// An acquire being set up: every argument of the server function, with the
/// server's defaults (ttl 30 s; no holder; not session-bound; exclusive),
/// plus `keepalive` (on) and the connection to acquire on. `.await` it.
#[must_use = "an acquire does nothing until it is awaited"]
pub struct Acquire<'l, M> {
    locker: &'l Locker,
    req: Request,
    _mode: PhantomData<M>,
}

impl<'l, M> Acquire<'l, M> {
    fn new(locker: &'l Locker, name: String) -> Self {
        Acquire { locker, req: Request::new(name), _mode: PhantomData }
    }

    /// The lease's ttl (default 30 s).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.req.ttl = ttl;
        self
    }

    /// The holder: a retry by the same holder (and role) gets the same
    /// token back while the lease is live.
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.req.holder = Some(holder.into());
        self
    }

    /// The lease also ends when the session of its connection ends.
    pub fn session_bound(mut self, on: bool) -> Self {
        self.req.session_bound = on;
        self
    }

    /// A shared lease (0.3.0): any number live together, none beside an
    /// exclusive one.
    pub fn shared(mut self, on: bool) -> Self {
        self.req.shared = on;
        self
    }

    /// One of `n` permits of a counting semaphore (0.3.0); 1 is an ordinary
    /// exclusive lease.
    pub fn permits(mut self, n: u32) -> Self {
        self.req.permits = n;
        self
    }

    /// Renew in the background (default on). Off, the lease is still
    /// signalled lost when its ttl has passed without a [`Lease::renew`].
    pub fn keepalive(mut self, on: bool) -> Self {
        self.req.keepalive = on;
        self
    }

    /// Acquire on this connection (a clone is kept for the lease's life)
    /// instead of one of the locker's. It must not be inside a transaction
    /// block.
    pub fn on(mut self, conn: &Connection) -> Self {
        self.req.conn = Some(conn.clone());
        self
    }
}

impl<'l> Acquire<'l, Wait> {
    /// Wait at most this long (default: until granted); then
    /// [`Error::WaitTimeout`].
    pub fn wait(mut self, wait: Duration) -> Self {
        self.req.wait = Some(wait);
        self
    }

    /// The retry helper's attempts for this call (default: the locker's).
    pub fn attempts(mut self, n: u32) -> Self {
        self.req.attempts = Some(n);
        self
    }

    /// The retry helper: acquire (waiting) with keepalive, call `f(&lease)`,
    /// release, and return what `f` returned. If `f` returns
    /// [`Error::StaleToken`] (the lease was lost and the database refused
    /// the write), the lease is dropped without a release and it all runs
    /// again from the acquire, up to `attempts` times in all; then that
    /// error is returned. Any other error of `f` is returned at once, after
    /// the release; an error of the acquire itself is returned at once.
    ///
    /// A release that fails after `f` succeeded does not undo what `f` did
    /// (its writes were accepted while the lease was live); the lease then
    /// ends at its ttl, and `f`'s value is returned.
    pub async fn run<T, F>(self, mut f: F) -> Result<T, Error>
    where
        F: AsyncFnMut(&Lease) -> Result<T, Error>,
    {
        let attempts = self.req.attempts.unwrap_or(self.locker.inner.attempts);
        if attempts == 0 {
            return Err(Error::invalid_argument("attempts must be at least 1", "The default is 5."));
        }
        self.locker.inner.validate(&self.req, true)?;
        let mut last = None;
        for _ in 0..attempts {
            let lease = acquire(self.locker, self.req.clone(), true).await?.expect("acquire returns a lease");
            match f(&lease).await {
                Ok(v) => {
                    let _ = lease.release().await;
                    return Ok(v);
                }
                Err(e) if e.is_stale_token() => {
                    lease.abandon().await;
                    last = Some(e);
                }
                Err(e) => {
                    let _ = lease.release().await;
                    return Err(e);
                }
            }
        }
        Err(last.expect("at least one attempt"))
    }
}

impl<'l> IntoFuture for Acquire<'l, Try> {
    type Output = Result<Option<Lease>, Error>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'l>>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(acquire(self.locker, self.req, false))
    }
}

impl<'l> IntoFuture for Acquire<'l, Wait> {
    type Output = Result<Lease, Error>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'l>>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(
            async move { Ok(acquire(self.locker, self.req, true).await?.expect("acquire returns a lease")) },
        )
    }
}

fn micros(d: Duration) -> i64 {
    d.as_micros() as i64
}

/// Acquires as `r` says: `Ok(None)` only for a try that was not granted.
pub(crate) async fn acquire(locker: &Locker, r: Request, waiting: bool) -> Result<Option<Lease>, Error> {
    locker.inner.validate(&r, waiting)?;
    let given = match &r.conn {
        Some(c) => match c.transaction_status().await {
            TransactionStatus::Idle => Some(c.clone()),
            TransactionStatus::InTransaction | TransactionStatus::Failed => return Err(Error::usage(
                "acquire must run outside a transaction block: the grant has to be committed before a renew \
                     from another connection can see it; commit or roll back first, or acquire on another \
                     connection",
            )),
            TransactionStatus::Closed => {
                return Err(Error::connection("the connection given to acquire is closed"))
            }
        },
        None => None,
    };
    let source = &locker.inner.source;
    let reserved = if r.keepalive { source.reserve_keepalive().await? } else { None };
    let conn = match given {
        Some(c) => c,
        None => source.open(Purpose::Lease).await?,
    };
    let p = &source.prefix;
    let ttl = micros(r.ttl);
    let wait = r.wait.map(micros);
    let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![(&r.name, Type::TEXT), (&ttl, Type::INT8)];
    let mut args = vec!["name => $1".to_string(), "ttl => $2::float8 * interval '1 microsecond'".to_string()];
    if waiting {
        params.push((&wait, Type::INT8));
        args.push("wait => $3::float8 * interval '1 microsecond'".into());
    }
    params.push((&r.holder, Type::TEXT));
    args.push(format!("holder => ${}", params.len()));
    params.push((&r.session_bound, Type::BOOL));
    args.push(format!("session_bound => ${}", params.len()));
    // Sent only when not the default, so an exclusive lease also works
    // against a 0.2.0 server, which has neither argument.
    if r.shared {
        params.push((&r.shared, Type::BOOL));
        args.push(format!("shared => ${}", params.len()));
    }
    let permits = r.permits as i32;
    if r.permits != 1 {
        params.push((&permits, Type::INT4));
        args.push(format!("permits => ${}", params.len()));
    }
    let args = args.join(", ");
    let function = if waiting { "fenced_lock_acquire" } else { "fenced_lock_try_acquire" };
    let sql = format!("SELECT {p}{function}({args})");
    let sent = Instant::now();
    let row = conn.query_typed_one(&sql, &params).await?;
    let token: Option<i64> = row.try_get(0)?;
    let Some(token) = token else { return Ok(None) };
    let interval = locker.inner.keepalive_interval.unwrap_or(r.ttl / 3);
    // The deadline counts from the send, never from the answer nor from a
    // grant instant the server's clocks would suggest. A wait in line of an
    // interval or more would hand over a lease whose first renew is already
    // due, or whose deadline is near or past: it is renewed once first.
    let confirm = waiting && sent.elapsed() >= interval;
    let grant = Grant { conn, token, sent, confirm, reserved };
    Ok(Some(Lease::start(source.clone(), r, interval, grant).await))
}
