//! [`Lease`]: a granted lease, its keepalive, its lost signal and its
//! release.

use std::fmt;
use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify, OwnedSemaphorePermit};
use tokio::task::JoinHandle;
use tokio_postgres::types::Type;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::connection::{Connection, Transaction};
use crate::error::Error;
use crate::locker::{Locker, LockerInner, Purpose, Request};
use crate::tap::TransactionStatus;

/// The longest pause between two tries of a renew that failed for a
/// connection error.
const RETRY_CAP: Duration = Duration::from_secs(1);

const LIVE: u8 = 0;
const RELEASING: u8 = 1;
const RELEASED: u8 = 2;
const LOST: u8 = 3;
const ABANDONED: u8 = 4;

/// Where a lease stands, as the client knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Granted, and (as far as the client knows) not ended.
    Live,
    /// Released by this client (see [`Lease::release`]).
    Released,
    /// Lost: a renew said it had ended, or its deadline passed before a
    /// renew succeeded. Stop the work; do not write.
    Lost,
    /// Dropped without a release by [`Lease::abandon`]; it ends at its ttl.
    Abandoned,
}

/// A snapshot of a lease's state, from [`Lease::status`] or
/// [`Lease::watch`].
#[derive(Debug, Clone)]
pub struct LeaseStatus {
    /// Live, released, lost or abandoned.
    pub state: LeaseState,
    /// Successful renews so far (the keepalive's and [`Lease::renew`]'s).
    pub renewals: u64,
    /// The client's deadline: when the last successful renew (or the grant)
    /// was sent, plus the ttl, on this process' monotonic clock. Never later
    /// than the server's expiry.
    pub deadline: Instant,
    /// The keepalive's last failure, cleared by its next success.
    pub keepalive_error: Option<String>,
}

pub(crate) struct LeaseCore {
    name: String,
    token: i64,
    ttl: Duration,
    interval: Duration,
    keepalive: bool,
    state: AtomicU8,
    lost: CancellationToken,
    stop: CancellationToken,
    status: watch::Sender<LeaseStatus>,
    /// The instant the deadline counts from (grant or last renew sent).
    base: Mutex<Instant>,
    deadline_moved: Notify,
    /// One renew at a time: the keepalive's or the caller's.
    renew_lock: tokio::sync::Mutex<()>,
    keepalive_pid: AtomicI32,
}

impl LeaseCore {
    fn deadline(&self) -> Instant {
        *self.base.lock().unwrap() + self.ttl
    }

    fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    fn publish(&self, f: impl FnOnce(&mut LeaseStatus)) {
        self.status.send_modify(f);
    }

    /// At once, exactly once, and only while live (or while a release waits
    /// for the keepalive).
    fn signal_lost(&self) -> bool {
        for from in [LIVE, RELEASING] {
            if self.state.compare_exchange(from, LOST, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                self.publish(|s| s.state = LeaseState::Lost);
                self.lost.cancel();
                return true;
            }
        }
        false
    }

    fn renewed(&self, sent: Instant) {
        {
            let mut base = self.base.lock().unwrap();
            if sent > *base {
                *base = sent;
            }
        }
        let deadline = self.deadline();
        self.publish(|s| {
            s.renewals += 1;
            s.deadline = deadline;
            s.keepalive_error = None;
        });
        self.deadline_moved.notify_waiters();
    }

    fn finish(&self, state: u8, public: LeaseState) {
        self.state.store(state, Ordering::Release);
        self.publish(|s| s.state = public);
    }
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
/// release to the locker's keepalive thread, which stops the keepalive
/// (waiting for a renew in flight), then sends the release on the lease's
/// connection (as part of its open transaction, if one is open), or on a
/// new connection if that one is gone. That also happens when the scope is
/// left by `?` or a panic. A lost lease is never released. If the process
/// exits first, the release is not sent: the lease ends at its ttl (a
/// session-bound one with its connection).
pub struct Lease {
    core: Arc<LeaseCore>,
    conn: Connection,
    locker: Locker,
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

pub(crate) fn start(
    locker: Locker,
    r: Request,
    conn: Connection,
    token: i64,
    base: Instant,
    live: bool,
    reserved: Option<OwnedSemaphorePermit>,
) -> Lease {
    let interval = locker.inner.keepalive_interval.unwrap_or(r.ttl / 3);
    let (status, _) = watch::channel(LeaseStatus {
        state: LeaseState::Live,
        renewals: 0,
        deadline: base + r.ttl,
        keepalive_error: None,
    });
    let core = Arc::new(LeaseCore {
        name: r.name,
        token,
        ttl: r.ttl,
        interval,
        keepalive: r.keepalive,
        state: AtomicU8::new(LIVE),
        lost: CancellationToken::new(),
        stop: CancellationToken::new(),
        status,
        base: Mutex::new(base),
        deadline_moved: Notify::new(),
        renew_lock: tokio::sync::Mutex::new(()),
        keepalive_pid: AtomicI32::new(0),
    });
    if !live {
        core.signal_lost();
    }
    let task = locker.inner.spawn(keepalive(core.clone(), locker.inner.clone(), reserved));
    Lease {
        core,
        conn,
        locker,
        holder: r.holder,
        session_bound: r.session_bound,
        shared: r.shared,
        permits: r.permits,
        task: Mutex::new(Some(task)),
    }
}

impl Lease {
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
                "renew must run outside a transaction block: inside one it would hold the lock's name until \
                     commit and delay the keepalive",
            )),
        }
        let _one = self.core.renew_lock.lock().await;
        if Instant::now() >= self.core.deadline() {
            self.core.signal_lost();
            return Ok(false);
        }
        match renew_on(&self.core, &self.locker.inner.prefix, &self.conn).await? {
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
        if self.core.state.compare_exchange(LIVE, RELEASING, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return Ok(false);
        }
        let task = self.task.lock().unwrap().take();
        // On the keepalive thread, so that dropping this future (a timeout,
        // a select) does not leave the release half done.
        let release = release_now(self.core.clone(), self.conn.clone(), self.locker.inner.clone(), task);
        match self.locker.inner.spawn(release).await {
            Ok(r) => r,
            Err(e) => Err(Error::other(format!("the release task failed: {e}"))),
        }
    }

    /// Drops the lease without a release (it ends at its ttl), after
    /// stopping its keepalive. What the retry helper does after `FL001`.
    pub async fn abandon(self) {
        if self.core.state.compare_exchange(LIVE, ABANDONED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
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
        if self.core.state.compare_exchange(LIVE, RELEASING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            let task = self.task.lock().unwrap().take();
            let fut = release_now(self.core.clone(), self.conn.clone(), self.locker.inner.clone(), task);
            self.locker.inner.spawn(async move {
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
    locker: Arc<LockerInner>,
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
    let r = send_release(&core, &conn, &locker).await;
    core.finish(RELEASED, LeaseState::Released);
    r
}

async fn send_release(core: &LeaseCore, conn: &Connection, locker: &LockerInner) -> Result<bool, Error> {
    let sql = format!("SELECT {}fenced_lock_release($1, $2)", locker.prefix);
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
    let fresh = locker.open(Purpose::Release).await?;
    let r = fresh
        .query_typed_one(&sql, &params)
        .await
        .and_then(|row| row.try_get::<_, bool>(0))
        .map_err(Error::from);
    fresh.close().await;
    r
}

/// One renew on `conn`: `Some(sent)` if the lease is still live.
async fn renew_on(core: &LeaseCore, prefix: &str, conn: &Connection) -> Result<Option<Instant>, Error> {
    let sql = format!("SELECT {prefix}fenced_lock_renew($1, $2, $3::float8 * interval '1 microsecond')");
    let ttl = core.ttl.as_micros() as i64;
    let sent = Instant::now();
    let row = conn
        .query_typed_one(&sql, &[(&core.name, Type::TEXT), (&core.token, Type::INT8), (&ttl, Type::INT8)])
        .await?;
    Ok(if row.try_get::<_, bool>(0)? { Some(sent) } else { None })
}

async fn open_keepalive(
    core: &LeaseCore,
    locker: &LockerInner,
    reserved: Option<OwnedSemaphorePermit>,
) -> Result<Connection, Error> {
    let c = locker.open_keepalive(reserved, core.interval).await?;
    core.keepalive_pid.store(c.backend_pid().unwrap_or(0), Ordering::Release);
    Ok(c)
}

/// The keepalive of one lease, on the locker's keepalive thread. With
/// keepalive off it only watches the deadline.
async fn keepalive(
    core: Arc<LeaseCore>,
    locker: Arc<LockerInner>,
    mut reserved: Option<OwnedSemaphorePermit>,
) {
    let mut conn: Option<Connection> = None;
    let mut next = *core.base.lock().unwrap() + core.interval;
    if core.keepalive && core.state() == LIVE {
        // Opened when the lease is granted; a failure here is retried at the
        // first renew.
        match connect_unless_stopped(&core, &locker, reserved.take()).await {
            None => return finish_keepalive(&core, conn).await,
            Some(Ok(c)) => conn = Some(c),
            Some(Err(e)) => core.publish(|s| s.keepalive_error = Some(e.to_string())),
        }
    }
    drop(reserved);
    while core.state() == LIVE || core.state() == RELEASING {
        let moved = core.deadline_moved.notified();
        let wake = if core.keepalive { next.min(core.deadline()) } else { core.deadline() };
        tokio::select! {
            biased;
            _ = core.stop.cancelled() => break,
            _ = moved => continue,
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
        // After a pause (GC, SIGSTOP, a stopped VM) the clock is checked
        // before anything is sent: past the deadline the lease may already
        // be someone else's.
        if Instant::now() >= core.deadline() {
            core.signal_lost();
            break;
        }
        if !core.keepalive || Instant::now() < next {
            continue;
        }
        if conn.as_ref().is_none_or(Connection::is_closed) {
            conn = None;
            match connect_unless_stopped(&core, &locker, None).await {
                None => break,
                Some(Ok(c)) => conn = Some(c),
                Some(Err(e)) => {
                    core.publish(|s| s.keepalive_error = Some(e.to_string()));
                    next = Instant::now() + core.interval.min(RETRY_CAP);
                    continue;
                }
            }
            if Instant::now() >= core.deadline() {
                core.signal_lost();
                break;
            }
        }
        let one = core.renew_lock.lock().await;
        // A release that began meanwhile: no renew may follow it.
        if core.stop.is_cancelled() {
            break;
        }
        // Not interrupted by a release (which waits for it), only by the
        // deadline.
        let renew = renew_on(&core, &locker.prefix, conn.as_ref().expect("connected"));
        let result = tokio::time::timeout_at(core.deadline().into(), renew).await;
        drop(one);
        match result {
            // The deadline passed with the renew unanswered.
            Err(_) => {
                core.signal_lost();
                break;
            }
            Ok(Ok(Some(sent))) => {
                core.renewed(sent);
                next = sent + core.interval;
                // Answered, but only after a pause past the deadline.
                if Instant::now() >= core.deadline() {
                    core.signal_lost();
                    break;
                }
            }
            Ok(Ok(None)) => {
                core.signal_lost();
                break;
            }
            // Retried on a new connection until it succeeds or the deadline
            // passes: renewals never stop because of one connection error.
            Ok(Err(e)) => {
                conn = None;
                core.publish(|s| s.keepalive_error = Some(e.to_string()));
                next = Instant::now() + core.interval.min(RETRY_CAP);
            }
        }
    }
    finish_keepalive(&core, conn).await
}

/// A keepalive connection, unless a release (or abandon) stops the
/// keepalive first: nothing has been sent for the lease on it yet, so the
/// attempt can be dropped at once. Bounded by the deadline.
async fn connect_unless_stopped(
    core: &LeaseCore,
    locker: &LockerInner,
    reserved: Option<OwnedSemaphorePermit>,
) -> Option<Result<Connection, Error>> {
    let open = tokio::time::timeout_at(core.deadline().into(), open_keepalive(core, locker, reserved));
    tokio::select! {
        biased;
        _ = core.stop.cancelled() => None,
        r = open => Some(r.unwrap_or_else(|_| Err(Error::connection("keepalive: no connection before the deadline")))),
    }
}

/// The keepalive's connection is closed (the server's session gone) before
/// the keepalive ends, so before a release returns.
async fn finish_keepalive(core: &LeaseCore, conn: Option<Connection>) {
    if let Some(c) = conn {
        c.close().await;
    }
    core.keepalive_pid.store(0, Ordering::Release);
}
