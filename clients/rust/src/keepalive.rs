//! The keepalive of a lease: a task on a thread of its own that renews the
//! lease on a connection of its own, and signals it lost.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;
use tokio_postgres::types::{ToSql, Type};

use crate::connection::Connection;
use crate::error::Error;
use crate::source::Source;
use crate::status::{LeaseCore, LIVE, RELEASING};

/// The longest pause between two tries of a renew that failed for a
/// connection error.
const RETRY_CAP: Duration = Duration::from_secs(1);

/// The shortest time a renew waits on the server before it is given up.
const HELD_UP_FLOOR: Duration = Duration::from_millis(50);

/// How long a renew may wait on the server for another open change of the
/// same lease (another session's renew, a `fenced_lock_proclaim`, a release
/// not yet committed, the holder's own transaction included) before it is
/// given up and tried again: `min(interval, 1 s)`, at least 50 ms. A
/// release waits for the renew in flight, so this is also the longest a
/// release waits for the keepalive, even one in the very transaction that
/// holds the renew up.
pub(crate) fn held_up_bound(interval: Duration) -> Duration {
    interval.min(RETRY_CAP).max(HELD_UP_FLOOR)
}

/// The thread the keepalives run on, with a small runtime of its own (one
/// per process, started with the first lease): a busy or blocked
/// application runtime cannot delay a renew, and a release handed over by
/// a dropped lease still runs while the application's runtime shuts down.
fn background() -> &'static tokio::runtime::Handle {
    static HANDLE: OnceLock<tokio::runtime::Handle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("fenced_lock-keepalive".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("fenced_lock: cannot build the keepalive runtime");
                let _ = handle_tx.send(rt.handle().clone());
                rt.block_on(std::future::pending::<()>());
            })
            .expect("fenced_lock: cannot start the keepalive thread");
        handle_rx.recv().expect("fenced_lock: the keepalive runtime did not start")
    })
}

/// Runs `f` on the keepalive thread.
pub(crate) fn spawn<T, F>(f: F) -> tokio::task::JoinHandle<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    background().spawn(f)
}

/// One renew on `conn`: `Some(sent)` if the lease is still live. With
/// `held_up`, the renew gives up waiting on the server for another open
/// change of the lease after that long (`lock_timeout`, set for its own
/// statement only, so that nothing is left in the session: behind a
/// transaction pooler it is shared) and fails with `55P03`.
pub(crate) async fn renew_on(
    core: &LeaseCore,
    prefix: &str,
    conn: &Connection,
    held_up: Option<Duration>,
) -> Result<Option<Instant>, Error> {
    let renew = format!("{prefix}fenced_lock_renew($1, $2, $3::float8 * interval '1 microsecond')");
    let ttl = core.ttl.as_micros() as i64;
    let timeout = held_up.map(|b| format!("{}ms", b.as_millis().max(1)));
    let mut params: Vec<(&(dyn ToSql + Sync), Type)> =
        vec![(&core.name, Type::TEXT), (&core.token, Type::INT8), (&ttl, Type::INT8)];
    let sql = match &timeout {
        None => format!("SELECT {renew}"),
        Some(t) => {
            params.push((t, Type::TEXT));
            // The subquery (kept apart by OFFSET 0) sets the timeout before
            // the renew can wait for the lease's lock.
            format!("SELECT {renew} FROM (SELECT set_config('lock_timeout', $4, true) OFFSET 0) AS held_up")
        }
    };
    let sent = Instant::now();
    let row = conn.query_typed_one(&sql, &params).await?;
    Ok(if row.try_get::<_, bool>(0)? { Some(sent) } else { None })
}

/// A renew that was given up after waiting [`held_up_bound`] on the server.
fn held_up(e: &Error) -> bool {
    e.sqlstate() == Some(crate::error::sqlstate::WAIT_TIMEOUT)
}

/// The keepalive of one lease, on the keepalive thread, until the lease is
/// released, abandoned or lost. With keepalive off it only watches the
/// deadline.
pub(crate) async fn run(
    core: Arc<LeaseCore>,
    source: Arc<Source>,
    mut reserved: Option<OwnedSemaphorePermit>,
) {
    let mut conn: Option<Connection> = None;
    let mut next = core.base() + core.interval;
    if core.keepalive && core.state() == LIVE {
        // Opened when the lease is granted; a failure here is retried at the
        // first renew.
        match connect_unless_stopped(&core, &source, reserved.take()).await {
            None => return finish(&core, conn).await,
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
            match connect_unless_stopped(&core, &source, None).await {
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
        // deadline; held up on the server, it gives itself up after
        // `held_up_bound`.
        let bound = held_up_bound(core.interval);
        let attempt = Instant::now();
        let renew = renew_on(&core, &source.prefix, conn.as_ref().expect("connected"), Some(bound));
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
            // Held up on the server by another open change of the lease (the
            // holder's own transaction, maybe, whose release is waiting for
            // this renew): given up, and tried again on the same connection,
            // which is fine, until it succeeds or the deadline passes.
            Ok(Err(e)) if held_up(&e) => {
                core.publish(|s| {
                    s.keepalive_error = Some(format!(
                        "renew held up on the server by another open change of the lease, given up after \
                         {bound:?} and retried: {e}"
                    ))
                });
                next = attempt + core.interval.min(RETRY_CAP);
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
    finish(&core, conn).await
}

/// A keepalive connection, unless a release (or abandon) stops the
/// keepalive first: nothing has been sent for the lease on it yet, so the
/// attempt can be dropped at once. Bounded by the deadline.
async fn connect_unless_stopped(
    core: &LeaseCore,
    source: &Source,
    reserved: Option<OwnedSemaphorePermit>,
) -> Option<Result<Connection, Error>> {
    let open = async {
        let c = source.open_keepalive(reserved, core.interval).await?;
        core.keepalive_pid.store(c.backend_pid().unwrap_or(0), Ordering::Release);
        Ok(c)
    };
    let open = tokio::time::timeout_at(core.deadline().into(), open);
    tokio::select! {
        biased;
        _ = core.stop.cancelled() => None,
        r = open => Some(r.unwrap_or_else(|_| Err(Error::connection("keepalive: no connection before the deadline")))),
    }
}

/// The keepalive's connection is closed (the server's session gone) before
/// the keepalive ends, so before a release returns.
async fn finish(core: &LeaseCore, conn: Option<Connection>) {
    if let Some(c) = conn {
        c.close().await;
    }
    core.keepalive_pid.store(0, Ordering::Release);
}
