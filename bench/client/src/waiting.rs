//! Waiting for a lock: handoff latency from a release to the next waiter's
//! grant, CPU of idle waiters, and how soon a waiter gets the lock of a
//! session-bound holder whose process is killed.

use crate::{cpu_s, epoch_now, percentile, pg_connect, window_async, Line, Opts, Res};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Barrier;
use tokio::time::sleep;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Statement};

/// The server's clock, read in the same statement right after the call.
const NOW: &str = "extract(epoch FROM clock_timestamp())::float8";
/// Handoff: a holder keeps the lock this long, then works elsewhere before queueing again.
const HOLD: Duration = Duration::from_millis(5);
const THINK: Duration = Duration::from_millis(2);

fn acquire_sql(queue: bool) -> String {
    if queue {
        format!("SELECT fenced_lock_acquire($1, '30 s', '5 min'), {NOW}")
    } else {
        format!("SELECT fenced_lock_try_acquire($1, '30 s'), {NOW}")
    }
}

fn method(o: &Opts) -> Res<(&str, bool)> {
    match o.str_or("method", "queue") {
        m @ "queue" => Ok((m, true)),
        m @ "backoff" => Ok((m, false)),
        m => Err(format!("unknown --method {m}").into()),
    }
}

/// Take `name`: asleep in fenced_lock_acquire's queue, or by the simplest
/// alternative, try_acquire with backoff from 10 ms doubling to 500 ms.
/// (token, server clock at the grant). A wait is never abandoned, so that
/// every wait in progress at a release is known.
async fn take(db: &Client, acquire: &Statement, queue: bool, name: &str) -> Res<(i64, f64)> {
    let mut delay = Duration::from_millis(10);
    loop {
        let row = db.query_one(acquire, &[&name]).await?;
        if let Some(tok) = row.get::<_, Option<i64>>(0) {
            return Ok((tok, row.get(1)));
        }
        if queue {
            return Err("fenced_lock_acquire gave up".into());
        }
        sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}

struct Shared {
    /// every client connected and prepared; then the clock starts
    ready: Barrier,
    go: Barrier,
    stop: AtomicBool,
    releases: AtomicU64,
    /// stop once this many releases happened
    last: u64,
}

struct Wait {
    client: usize,
    started: f64,
    granted: f64,
}

struct Release {
    client: usize,
    at: f64,
    index: u64,
}

/// One handoff client: take the lock, hold it, release it, work, queue again.
async fn contender(
    dsn: String,
    name: String,
    queue: bool,
    c: usize,
    sh: Arc<Shared>,
) -> Res<(Vec<Wait>, Vec<Release>, Client)> {
    let setup = async {
        let db = pg_connect(&dsn).await?;
        let acquire = db.prepare(&acquire_sql(queue)).await?;
        let release = db.prepare(&format!("SELECT fenced_lock_release($1, $2), {NOW}")).await?;
        Res::Ok((db, acquire, release))
    }
    .await;
    sh.ready.wait().await; // even after a failed setup, so that nobody waits forever
    sh.go.wait().await;
    let (db, acquire, release) = setup?;
    let (mut waits, mut releases) = (Vec::new(), Vec::new());
    while !sh.stop.load(Relaxed) {
        let started = epoch_now();
        let (tok, granted) = take(&db, &acquire, queue, &name).await?;
        waits.push(Wait { client: c, started, granted });
        if !sh.stop.load(Relaxed) {
            sleep(HOLD).await;
        }
        let row = db.query_one(&release, &[&name, &tok]).await?;
        if !row.get::<_, bool>(0) {
            return Err("release refused".into());
        }
        let index = sh.releases.fetch_add(1, Relaxed);
        if index + 1 >= sh.last {
            sh.stop.store(true, Relaxed);
        }
        releases.push(Release { client: c, at: row.get(1), index });
        sleep(THINK).await;
    }
    // The connection goes back open: it is closed once the measured window is.
    Ok((waits, releases, db))
}

/// Handoff: waiters + 1 clients contend for one name. For each release, on
/// the server's clock: the grant of the first client that was already
/// waiting when it happened, minus the release (both read right after the
/// call, before its commit). Releases with nobody waiting are not counted.
pub async fn handoff(o: &Opts) -> Res<()> {
    let dsn = o.str("dsn")?;
    let waiters: usize = o.num("waiters", 1)?;
    let trials: u64 = o.num("trials", 500)?;
    let (method, queue) = method(o)?;
    let warm = waiters as u64 + 1; // every client has had the lock once
    let sh = Arc::new(Shared {
        ready: Barrier::new(waiters + 2),
        go: Barrier::new(waiters + 2),
        stop: AtomicBool::new(false),
        releases: AtomicU64::new(0),
        last: warm + trials,
    });
    let name = format!("handoff:{}:{method}:{waiters}", std::process::id());
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..=waiters {
        tasks.spawn(contender(dsn.into(), name.clone(), queue, c, sh.clone()));
    }
    sh.ready.wait().await;
    window_async("start")?;
    let cpu0 = cpu_s();
    sh.go.wait().await;
    // In completion order, so that a failure is reported at once rather than
    // after a queued client's wait runs out.
    let (mut waits, mut releases, mut conns) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(done) = tasks.join_next().await {
        let (w, r, db) = done??;
        waits.extend(w);
        releases.extend(r);
        conns.push(db);
    }
    let cpu = cpu_s() - cpu0;
    window_async("end")?;
    drop(conns);
    let (mut handoffs, mut waiting) = (Vec::new(), 0usize);
    for r in releases.iter().filter(|r| r.index >= warm && r.index < warm + trials) {
        let ahead = waits.iter().filter(|w| w.client != r.client && w.started < r.at && r.at < w.granted);
        let (n, first) = ahead.fold((0, f64::INFINITY), |(n, g), w| (n + 1, g.min(w.granted)));
        if n > 0 {
            handoffs.push((first - r.at) * 1e3);
            waiting += n;
        }
    }
    handoffs.sort_by(f64::total_cmp);
    Line::default()
        .s("kind", "handoff")
        .s("method", method)
        .raw("waiters", waiters)
        .raw("handoffs", handoffs.len())
        .raw("releases", sh.releases.load(Relaxed))
        .raw("window_ops", sh.releases.load(Relaxed))
        .raw("total_ops", sh.releases.load(Relaxed))
        .n("client_cpu_s", cpu)
        .n("p50_ms", percentile(&handoffs, 50.0))
        .n("p99_ms", percentile(&handoffs, 99.0))
        .n("mean_waiting", waiting as f64 / handoffs.len() as f64)
        .print();
    Ok(())
}

/// CPU time of every thread of `pid` in ns: the kernel's runtime counter
/// (the one behind utime+stime), read from schedstat because /proc/<pid>/stat
/// rounds each process down to 10 ms ticks, which turns 100 nearly idle
/// backends into a plain zero.
fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// CPU of idle waiters: `waiters` clients (tasks of this process, own
/// connections) wait for a lock held all along; CPU time of their backends
/// and of this process over `seconds`, as % of one core.
pub async fn idle_cpu(o: &Opts) -> Res<()> {
    let dsn = o.str("dsn")?;
    let waiters: usize = o.num("waiters", 100)?;
    let seconds: f64 = o.num("seconds", 10.0)?;
    let (method, queue) = method(o)?;
    let name = format!("held:{}:{method}", std::process::id());
    let holder = pg_connect(dsn).await?;
    let tok: Option<i64> =
        holder.query_one("SELECT fenced_lock_try_acquire($1, '10 min')", &[&name]).await?.get(0);
    let tok = tok.ok_or("the held lock was not granted")?;
    let (mut pids, mut tasks) = (Vec::new(), Vec::new());
    for _ in 0..waiters {
        let db = pg_connect(dsn).await?;
        pids.push(db.query_one("SELECT pg_backend_pid()", &[]).await?.get::<_, i32>(0));
        let acquire = db.prepare(&acquire_sql(queue)).await?;
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            let (tok, _) = take(&db, &acquire, queue, &name).await?;
            db.query_one("SELECT fenced_lock_release($1, $2)", &[&name, &tok]).await?;
            Res::Ok(())
        }));
    }
    // Queue: every waiter asleep in fenced_lock_acquire before the clock starts.
    let deadline = Instant::now() + Duration::from_secs(30);
    let active = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1) AND state = 'active'";
    while queue && holder.query_one(active, &[&pids]).await?.get::<_, i64>(0) < waiters as i64 {
        if Instant::now() > deadline {
            return Err("the waiters did not queue".into());
        }
        sleep(Duration::from_millis(50)).await;
    }
    sleep(Duration::from_secs(1)).await; // backoff: at its 500 ms steady state
    let backends = || pids.iter().map(|&p| cpu_ns(p as u32)).sum::<u64>();
    let (b0, c0, t0) = (backends(), cpu_ns(std::process::id()), Instant::now());
    sleep(Duration::from_secs_f64(seconds)).await;
    let (b1, c1, elapsed) = (backends(), cpu_ns(std::process::id()), t0.elapsed().as_secs_f64());
    holder.query_one("SELECT fenced_lock_release($1, $2)", &[&name, &tok]).await?;
    for t in tasks {
        t.await??;
    }
    let pct = |ns: u64| 100.0 * ns as f64 / 1e9 / elapsed;
    Line::default()
        .s("kind", "idle-cpu")
        .s("method", method)
        .raw("waiters", waiters)
        .n("seconds", elapsed)
        .n("backends_pct", pct(b1 - b0))
        .n("client_pct", pct(c1 - c0))
        .n("total_pct", pct(b1 - b0 + c1 - c0))
        .print();
    Ok(())
}

/// session-kill's holder, a process of its own: take a session-bound lease,
/// say "held", then sleep until killed (at most two minutes).
pub async fn hold(o: &Opts) -> Res<()> {
    let db = pg_connect(o.str("dsn")?).await?;
    let sql = "SELECT fenced_lock_acquire($1, '30 s', NULL, NULL, session_bound => true)";
    let tok: Option<i64> = db.query_one(sql, &[&o.str("name")?]).await?.get(0);
    println!("held {}", tok.ok_or("not granted")?);
    sleep(Duration::from_secs(120)).await;
    Ok(())
}

/// A holder process with a session-bound lease is killed with SIGKILL while
/// a waiter on another connection is queued for the same name: time from the
/// kill (this process's wall clock) to the waiter's grant (the server's
/// clock, same machine), and to the waiter's call returning (monotonic).
pub async fn session_kill(o: &Opts) -> Res<()> {
    let dsn = o.str("dsn")?;
    let trials: u32 = o.num("trials", 20)?;
    let waiter = Arc::new(pg_connect(dsn).await?);
    let sql = format!("SELECT fenced_lock_acquire($1, '30 s', '60 s', session_bound => true), {NOW}");
    let acquire = match waiter.prepare(&sql).await {
        Ok(s) => s,
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_FUNCTION) => {
            let why = e.as_db_error().map_or(e.to_string(), |d| d.message().to_string());
            Line::default().s("kind", "session-kill").raw("available", false).s("reason", &why).print();
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let wpid: i32 = waiter.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
    let monitor = pg_connect(dsn).await?;
    let (mut grant_ms, mut return_ms) = (Vec::new(), Vec::new());
    for trial in 0..trials {
        let name = format!("kill:{}:{trial}", std::process::id());
        let mut holder = tokio::process::Command::new(std::env::current_exe()?)
            .args(["hold", "--dsn", dsn, "--name", &name])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut said = String::new();
        BufReader::new(holder.stdout.take().ok_or("no holder stdout")?).read_line(&mut said).await?;
        if !said.starts_with("held") {
            return Err("the holder did not get its lease".into());
        }
        let (w, a, n) = (waiter.clone(), acquire.clone(), name.clone());
        let waiting = tokio::spawn(async move { w.query_one(&a, &[&n]).await });
        // The waiter's call is running; give it a moment to be asleep in it.
        let deadline = Instant::now() + Duration::from_secs(10);
        let active = "SELECT state = 'active' FROM pg_stat_activity WHERE pid = $1";
        while !monitor.query_one(active, &[&wpid]).await?.get::<_, bool>(0) {
            if Instant::now() > deadline {
                return Err("the waiter did not start waiting".into());
            }
            sleep(Duration::from_millis(5)).await;
        }
        sleep(Duration::from_millis(50)).await;
        let (killed_at, t0) = (epoch_now(), Instant::now());
        holder.start_kill()?; // SIGKILL
        let row = tokio::time::timeout(Duration::from_secs(60), waiting).await???;
        return_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        let (tok, granted): (Option<i64>, f64) = (row.get(0), row.get(1));
        grant_ms.push((granted - killed_at) * 1e3);
        holder.wait().await?;
        waiter.query_one("SELECT fenced_lock_release($1, $2)", &[&name, &tok.ok_or("not granted")?]).await?;
    }
    grant_ms.sort_by(f64::total_cmp);
    return_ms.sort_by(f64::total_cmp);
    Line::default()
        .s("kind", "session-kill")
        .raw("available", true)
        .raw("trials", grant_ms.len())
        .n("p50_ms", percentile(&grant_ms, 50.0))
        .n("p99_ms", percentile(&grant_ms, 99.0))
        .n("returned_p50_ms", percentile(&return_ms, 50.0))
        .n("returned_p99_ms", percentile(&return_ms, 99.0))
        .print();
    Ok(())
}
