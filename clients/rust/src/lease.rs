//! [`Lease`]: a granted lease, its lost signal and its release.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio::task::JoinHandle;
use tokio_postgres::types::Type;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::connection::{Connection, Transaction};
use crate::error::Error;
use crate::keepalive::{self, renew_on};
use crate::request::Request;
use crate::source::{Purpose, Source};
use crate::status::{LeaseCore, LeaseState, LeaseStatus, ABANDONED, LIVE, LOST, RELEASED, RELEASING};
use crate::tap::TransactionStatus;

/// What the server answered to an acquire that granted a lease.
pub(crate) struct Grant {
    /// The lease's connection.
    pub(crate) conn: Connection,
    pub(crate) token: i64,
    /// When the acquire was sent: the client's deadline counts from there
    /// (the grant came at some instant of the call the client cannot know).
    pub(crate) sent: Instant,
    /// The acquire waited in line for an interval or more: renew once
    /// before the lease is handed over.
    pub(crate) confirm: bool,
    /// The pool slot of its keepalive connection, if it has one.
    pub(crate) reserved: Option<OwnedSemaphorePermit>,
}

/// A granted lease. Dropping it releases it (see below); call
/// [`Lease::release`] to know the server's answer.
///
/// It carries the fencing token to stamp guarded writes with, the
/// connection it was acquired on ([`Lease::client`]), a keepalive that
/// renews it on a connection of its own every `ttl/3` (or the locker's
/// `keepalive_interval`), and the lost signal ([`Lease::lost`]).
///
/// **Drop.** `Drop` cannot wait, so a lease dropped while live hands its
/// release to the keepalive thread, which stops the keepalive
/// (waiting for a renew in flight), then sends the release on the lease's
/// connection (as part of its open transaction, if one is open), or on a
/// new connection if that one is gone. That also happens when the scope is
/// left by `?` or a panic. A lost lease is never released. If the process
/// exits first, the release is not sent: the lease ends at its ttl (a
/// session-bound one with its connection).
pub struct Lease {
    core: Arc<LeaseCore>,
    conn: Connection,
    source: Arc<Source>,
    holder: Option<String>,
    session_bound: bool,
    shared: bool,
    permits: u32,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.core.name)
            .field("token", &self.core.token)
            .field("ttl", &self.core.ttl)
            .field("state", &self.status().state)
            .finish()
    }
}

impl Lease {
    /// The lease `grant` gave for `r`, renewed once first after a long wait
    /// in line, with its keepalive (or, with keepalive off, its deadline
    /// watch) started, renewing every `interval`.
    pub(crate) async fn start(source: Arc<Source>, r: Request, interval: Duration, grant: Grant) -> Lease {
        let core = Arc::new(LeaseCore::new(r.name, grant.token, r.ttl, interval, r.keepalive, grant.sent));
        let lease = Lease {
            core,
            conn: grant.conn,
            source,
            holder: r.holder,
            session_bound: r.session_bound,
            shared: r.shared,
            permits: r.permits,
            task: Mutex::new(None),
        };
        // The lease exists before this renew: if the acquire's future is
        // dropped during it, the lease is dropped too, and releases itself.
        if grant.confirm {
            lease.confirm().await;
        }
        let task = keepalive::spawn(keepalive::run(lease.core.clone(), lease.source.clone(), grant.reserved));
        *lease.task.lock().unwrap() = Some(task);
        lease
    }

    /// After a long wait in line the deadline, counted from the acquire's
    /// send, leaves little of the ttl, maybe none: one renew, on the lease's
    /// connection, before the lease is handed over, and the deadline counts
    /// from its send. If it fails, the deadline stays, and the keepalive
    /// (its first renew due already) or the deadline decides.
    async fn confirm(&self) {
        let bound = keepalive::held_up_bound(self.core.interval);
        match renew_on(&self.core, &self.source.prefix, &self.conn, Some(bound)).await {
            Ok(Some(sent)) => self.core.renewed(sent),
            Ok(None) => {
                self.core.signal_lost();
            }
            Err(e) => self.core.publish(|s| {
                s.keepalive_error = Some(format!("the renew after the wait in line failed: {e}"))
            }),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// The fencing token: stamp every guarded write with it.
    pub fn token(&self) -> i64 {
        self.core.token
    }

    /// The ttl it was taken with (each renew extends it by that much).
    pub fn ttl(&self) -> Duration {
        self.core.ttl
    }

    /// The holder it was taken with.
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_deref()
    }

    /// It ends with its connection's session.
    pub fn session_bound(&self) -> bool {
        self.session_bound
    }

    /// A shared lease.
    pub fn shared(&self) -> bool {
        self.shared
    }

    /// The permits of its semaphore (1: exclusive).
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Whether a keepalive renews it.
    pub fn keepalive(&self) -> bool {
        self.core.keepalive
    }

    /// How often the keepalive renews.
    pub fn keepalive_interval(&self) -> Duration {
        self.core.interval
    }

    /// The backend pid of the keepalive's connection while it has one.
    pub fn keepalive_backend_pid(&self) -> Option<i32> {
        match self.core.keepalive_pid.load(Ordering::Acquire) {
            0 => None,
            p => Some(p),
        }
    }

    /// The connection the lease was acquired on.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The lease's connection's client, for the guarded writes.
    pub fn client(&self) -> &Client {
        self.conn.client()
    }

    /// `BEGIN` on the lease's connection. A [`Lease::release`] while it is
    /// open is part of it: "guarded writes, then release, then commit".
    pub async fn transaction(&self) -> Result<Transaction<'_>, Error> {
        self.conn.transaction().await
    }

    /// The lost signal: cancelled at once, exactly once, when the lease is
    /// lost (a renew said it had ended, or the deadline passed before a
    /// renew succeeded, including after a pause of this process). Never
    /// cancelled by a release. Each call gives a new child token, so
    /// cancelling it yourself does not mark the lease lost.
    pub fn lost(&self) -> CancellationToken {
        self.core.lost.child_token()
    }

    /// The lease was lost.
    pub fn is_lost(&self) -> bool {
        self.core.state() == LOST
    }

    /// Where the lease stands now.
    pub fn status(&self) -> LeaseStatus {
        self.core.status.borrow().clone()
    }

    /// A channel that sees every change of [`Lease::status`] (renews, loss,
    /// release).
    pub fn watch(&self) -> watch::Receiver<LeaseStatus> {
        self.core.status.subscribe()
    }

    /// `fenced_lock_renew` now, on the lease's connection (outside a
    /// transaction block): `Ok(false)` if the lease had ended (it is then
    /// lost). With keepalive off, this is how the lease is kept.
    pub async fn renew(&self) -> Result<bool, Error> {
        if self.core.state() != LIVE {
            return Ok(false);
        }
        match self.conn.transaction_status().await {
            TransactionStatus::Idle => {}
            TransactionStatus::Closed => return Err(Error::connection("the lease's connection is closed")),
            _ => return Err(Error::usage(
                "renew must run outside a transaction block: inside one it would hold the lease's lock until \
                     commit, and the keepalive's renews would wait for that commit",
            )),
        }
        let _one = self.core.renew_lock.lock().await;
        if Instant::now() >= self.core.deadline() {
            self.core.signal_lost();
            return Ok(false);
        }
        match renew_on(&self.core, &self.source.prefix, &self.conn, None).await? {
            Some(sent) => {
                self.core.renewed(sent);
                Ok(true)
            }
            None => {
                self.core.signal_lost();
                Ok(false)
            }
        }
    }

    /// Ends the lease: stops the keepalive first (waiting for a renew in
    /// flight, so that no renew is ever sent after the release; its
    /// connection is closed before this returns), then
    /// `fenced_lock_release` on the lease's connection (inside its open
    /// transaction, if any, after a rollback if that transaction has
    /// failed; on a new connection if it is gone). Returns the server's
    /// answer: `false` if the lease was no longer live. A lost lease is not
    /// released (`false`, nothing sent); a second call returns `false`
    /// without a round trip. Dropping this future before it is done does
    /// not stop the release: it runs on the keepalive thread.
    pub async fn release(&self) -> Result<bool, Error> {
        if !self.core.advance(LIVE, RELEASING) {
            return Ok(false);
        }
        let task = self.task.lock().unwrap().take();
        // On the keepalive thread, so that dropping this future (a timeout,
        // a select) does not leave the release half done.
        let release = release_now(self.core.clone(), self.conn.clone(), self.source.clone(), task);
        match keepalive::spawn(release).await {
            Ok(r) => r,
            Err(e) => Err(Error::other(format!("the release task failed: {e}"))),
        }
    }

    /// Drops the lease without a release (it ends at its ttl), after
    /// stopping its keepalive. What the retry helper does after `FL001`.
    pub async fn abandon(self) {
        if self.core.advance(LIVE, ABANDONED) {
            self.core.publish(|s| s.state = LeaseState::Abandoned);
        }
        self.core.stop.cancel();
        let task = self.task.lock().unwrap().take();
        if let Some(t) = task {
            let _ = t.await;
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.core.advance(LIVE, RELEASING) {
            let task = self.task.lock().unwrap().take();
            let fut = release_now(self.core.clone(), self.conn.clone(), self.source.clone(), task);
            keepalive::spawn(async move {
                let _ = fut.await;
            });
        } else {
            self.core.stop.cancel();
        }
    }
}

async fn release_now(
    core: Arc<LeaseCore>,
    conn: Connection,
    source: Arc<Source>,
    task: Option<JoinHandle<()>>,
) -> Result<bool, Error> {
    core.stop.cancel();
    if let Some(t) = task {
        let _ = t.await;
    }
    // The keepalive may have found it lost while it finished.
    if core.state() == LOST {
        return Ok(false);
    }
    if Instant::now() >= core.deadline() {
        core.signal_lost();
        return Ok(false);
    }
    let r = send_release(&core, &conn, &source).await;
    core.finish(RELEASED, LeaseState::Released);
    r
}

async fn send_release(core: &LeaseCore, conn: &Connection, source: &Source) -> Result<bool, Error> {
    let sql = format!("SELECT {}fenced_lock_release($1, $2)", source.prefix);
    let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 2] =
        [(&core.name, Type::TEXT), (&core.token, Type::INT8)];
    let on_lease_conn = async {
        match conn.transaction_status().await {
            TransactionStatus::Closed => return None,
            // It cannot commit anyway; the release would fail in it.
            TransactionStatus::Failed => {
                if let Err(e) = conn.batch_execute("ROLLBACK").await {
                    return Some(Err(Error::from(e)));
                }
            }
            TransactionStatus::Idle | TransactionStatus::InTransaction => {}
        }
        Some(
            conn.query_typed_one(&sql, &params)
                .await
                .and_then(|row| row.try_get::<_, bool>(0))
                .map_err(Error::from),
        )
    };
    match on_lease_conn.await {
        Some(Err(e)) if e.is_connection() => {}
        Some(r) => return r,
        None => {}
    }
    let fresh = source.open(Purpose::Release).await?;
    let r = fresh
        .query_typed_one(&sql, &params)
        .await
        .and_then(|row| row.try_get::<_, bool>(0))
        .map_err(Error::from);
    fresh.close().await;
    r
}
