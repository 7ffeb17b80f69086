//! The Rust client's suite, against a real server (FL_DSN): one test per
//! promise of clients/README.md, named after it. Faults are real: the
//! conformance examples run as child processes and get SIGSTOP/SIGCONT;
//! backends are ended with pg_terminate_backend. Timings are printed, and
//! bounded generously where they are a promise of the contract.
//!
//! Run by test.sh (`cargo test --test suite -- [FILTER...] [--jobs N]`).

mod support;

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced_lock::tokio_postgres::Config;
use fenced_lock::{Connection, Error, Lease, LeaseState, Locker, Pool, TransactionStatus};
use support::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A docs row, inserted with a token of its own lock (the guard wants one).
async fn new_doc(ctx: &Ctx) -> i32 {
    let id = unique_id();
    let lease = ctx.locker().try_acquire(format!("doc:{id}")).await.unwrap().unwrap();
    lease
        .client()
        .execute("INSERT INTO docs (id, body, fence_token) VALUES ($1, 'new', $2)", &[&id, &lease.token()])
        .await
        .unwrap();
    assert!(lease.release().await.unwrap());
    id
}

/// An inventory row with `stock`.
async fn new_item(ctx: &Ctx, stock: i32) -> i32 {
    let id = unique_id();
    let lease = ctx.locker().try_acquire(format!("inventory:{id}")).await.unwrap().unwrap();
    lease
        .client()
        .execute("INSERT INTO inventory VALUES ($1, $2, $3)", &[&id, &stock, &lease.token()])
        .await
        .unwrap();
    assert!(lease.release().await.unwrap());
    id
}

async fn stock(admin: &Connection, item: i32) -> i32 {
    admin.query_one("SELECT stock FROM inventory WHERE item_id = $1", &[&item]).await.unwrap().get(0)
}

async fn ended_by(admin: &Connection, token: i64) -> Option<String> {
    admin
        .query_opt("SELECT ended_by FROM fenced_lock_history WHERE token = $1", &[&token])
        .await
        .unwrap()
        .and_then(|r| r.get(0))
}

/// The retry helper's unit of work in these tests: one sale.
async fn sell_one(lease: &Lease, item: i32) -> Result<Option<i32>, Error> {
    let s: i32 =
        lease.client().query_one("SELECT stock FROM inventory WHERE item_id = $1", &[&item]).await?.get(0);
    if s == 0 {
        return Ok(None);
    }
    lease
        .client()
        .execute(
            "UPDATE inventory SET stock = $1, fence_token = $2 WHERE item_id = $3",
            &[&(s - 1), &lease.token(), &item],
        )
        .await?;
    Ok(Some(s - 1))
}

// ---------------------------------------------------------------- keepalive

async fn keepalive_keeps_a_critical_section_of_three_ttls_alive(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let id = new_doc(&ctx).await;
    let name = format!("doc:{id}");
    let ttl = secs(2);
    let lease = ctx.locker().acquire(&name).ttl(ttl).await.unwrap();
    let lost = lease.lost();
    tokio::time::sleep(ttl * 3 + ms(500)).await;
    assert!(!lost.is_cancelled(), "lost during the section: {:?}", lease.status());
    assert!(live(&admin, &name, lease.token()).await, "the server no longer has the lease");
    let n = lease
        .client()
        .execute(
            "UPDATE docs SET body = 'written after 3 ttl', fence_token = $1 WHERE id = $2",
            &[&lease.token(), &id],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    let renewals = lease.status().renewals;
    assert!(renewals >= 3, "only {renewals} renews in 3 ttl");
    println!("    3 x ttl + 0.5 s (ttl 2 s) held with {renewals} renews");
    assert!(lease.release().await.unwrap());
    assert!(!live(&admin, &name, lease.token()).await);
}

async fn a_guarded_transaction_open_for_three_ttls_keeps_its_lease_and_its_commit_is_accepted(ctx: Arc<Ctx>) {
    ctx.at_least((0, 3, 0), "renews that do not wait for the holder's guarded writes");
    let admin = ctx.admin().await;
    let id = new_doc(&ctx).await;
    let name = format!("doc:{id}");
    let ttl = secs(1);
    let lease = ctx.locker().acquire(&name).ttl(ttl).await.unwrap();
    let token = lease.token();
    let tx = lease.transaction().await.unwrap();
    tx.execute("UPDATE docs SET body = 'first', fence_token = $1 WHERE id = $2", &[&token, &id])
        .await
        .unwrap();
    let before = lease.status().renewals;
    // The write holds the lease's lock until the commit; the keepalive's
    // renews go on beside it, from their own connection.
    tokio::time::sleep(ttl * 3 + ms(500)).await;
    assert!(!lease.is_lost(), "lost with its transaction open: {:?}", lease.status());
    let renewed = lease.status().renewals - before;
    assert!(renewed >= 3, "only {renewed} renews in 3 ttl beside the open transaction");
    assert!(live(&admin, &name, token).await, "the server let the lease expire");
    tx.execute("UPDATE docs SET body = 'second', fence_token = $1 WHERE id = $2", &[&token, &id])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    println!("    a guarded transaction open 3.5 s (ttl 1 s): {renewed} renews beside it, commit accepted");
    let r = admin.query_one("SELECT body, fence_token FROM docs WHERE id = $1", &[&id]).await.unwrap();
    assert_eq!((r.get::<_, String>(0), r.get::<_, i64>(1)), ("second".to_string(), token));
    assert!(lease.release().await.unwrap());
    assert_eq!(ended_by(&admin, token).await.as_deref(), Some("release"));
}

async fn keepalive_renews_while_the_applications_runtime_is_blocked(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let name = unique("blocked");
    let ttl = secs(2);
    let lease = ctx.locker().acquire(&name).ttl(ttl).await.unwrap();
    // This test's runtime has one thread: block it, as CPU-bound or
    // blocking code in a task would. The keepalive runs on its own thread.
    std::thread::sleep(ttl * 3 + ms(500));
    assert!(!lease.is_lost(), "{:?}", lease.status());
    assert!(live(&admin, &name, lease.token()).await, "the lease expired while the runtime was blocked");
    assert!(lease.status().renewals >= 3, "{:?}", lease.status());
    assert!(lease.release().await.unwrap());
}

async fn sigstop_past_the_ttl_signals_lost_within_a_second_of_sigcont_and_the_write_is_refused_with_fl001(
    ctx: Arc<Ctx>,
) {
    let admin = ctx.admin().await;
    let id = new_doc(&ctx).await;
    let name = format!("doc:{id}");
    let before: i64 =
        admin.query_one("SELECT fence_token FROM docs WHERE id = $1", &[&id]).await.unwrap().get(0);
    let write = format!("docs:{id}");
    let mut p = Proc::spawn(
        ctx.example("hold"),
        &["--dsn", &ctx.app_dsn, "--name", &name, "--ttl", "1", "--hold", "6", "--write", &write],
        "hold",
    );
    let (_, acquired) = p.until("acquired", secs(20)).await;
    let token = acquired["token"].as_i64();
    tokio::time::sleep(ms(300)).await;
    p.signal(libc::SIGSTOP);
    tokio::time::sleep(ms(2500)).await;
    // Someone else takes the lock while the holder is stopped.
    let other = ctx
        .locker()
        .try_acquire(&name)
        .ttl(secs(30))
        .await
        .unwrap()
        .expect("the stopped holder's lease expired");
    assert!(other.token() > token);
    p.signal(libc::SIGCONT);
    let resumed = Instant::now();
    let (lost_at, lost) = p.until("lost", secs(5)).await;
    assert_eq!(lost["token"].as_i64(), token);
    let after = lost_at.duration_since(resumed);
    println!("    lost signalled {:.0} ms after SIGCONT", after.as_secs_f64() * 1000.0);
    assert!(after < secs(1), "lost {after:?} after SIGCONT");
    let (_, w) = p.until("write", secs(10)).await;
    assert_eq!(w["ok"], J::Bool(false));
    assert_eq!(w["sqlstate"], J::Str("FL001".into()));
    assert_eq!(p.finish(secs(10)).await, 3, "exit status of a lost hold; saw {:?}", p.names());
    assert!(p.of("released").is_empty(), "a lost lease was released");
    let now: i64 =
        admin.query_one("SELECT fence_token FROM docs WHERE id = $1", &[&id]).await.unwrap().get(0);
    assert_eq!(now, before, "the refused write changed the row");
    assert!(live(&admin, &name, other.token()).await, "the new holder's lease was disturbed");
    assert!(other.release().await.unwrap());
}

async fn keepalive_reconnects_after_its_connection_is_terminated_and_the_lease_stays_live(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let name = unique("reconnect");
    let locker = Locker::builder(&ctx.dsn).keepalive_interval(ms(200)).build().unwrap();
    let lease = locker.acquire(&name).ttl(secs(3)).await.unwrap();
    eventually("a first renew", secs(5), || async { lease.status().renewals >= 1 }).await;
    let old = lease.keepalive_backend_pid().expect("keepalive connected");
    let app: String = admin
        .query_one("SELECT application_name FROM pg_stat_activity WHERE pid = $1", &[&old])
        .await
        .unwrap()
        .get(0);
    assert_eq!(app, "fenced_lock_keepalive");
    let terminated: bool = admin.query_one("SELECT pg_terminate_backend($1)", &[&old]).await.unwrap().get(0);
    assert!(terminated);
    let before = lease.status().renewals;
    let t0 = Instant::now();
    eventually("renews on a new connection", secs(5), || async {
        lease.status().renewals >= before + 2 && lease.keepalive_backend_pid().is_some_and(|p| p != old)
    })
    .await;
    println!(
        "    renewing again on a new connection {:.0} ms after the terminate",
        t0.elapsed().as_secs_f64() * 1000.0
    );
    assert!(!lease.is_lost());
    assert!(live(&admin, &name, lease.token()).await);
    let new = lease.keepalive_backend_pid().unwrap();
    let app: String = admin
        .query_one("SELECT application_name FROM pg_stat_activity WHERE pid = $1", &[&new])
        .await
        .unwrap()
        .get(0);
    assert_eq!(app, "fenced_lock_keepalive");
    assert!(!backend_exists(&admin, old).await);
    assert!(lease.release().await.unwrap());
}

async fn a_network_cut_of_the_keepalives_connection_is_survived_on_a_new_connection(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let name = unique("netcut");
    let locker = Locker::builder(&ctx.dsn).keepalive_interval(secs(1)).build().unwrap();
    let lease = locker.acquire(&name).ttl(secs(10)).await.unwrap();
    eventually("a first renew", secs(5), || async { lease.status().renewals >= 1 }).await;
    let kpid = lease.keepalive_backend_pid().unwrap();
    let port: Option<i32> = admin
        .query_one("SELECT client_port FROM pg_stat_activity WHERE pid = $1", &[&kpid])
        .await
        .unwrap()
        .get(0);
    let port = match port {
        Some(p) if p > 0 => p as u16,
        _ => skip("the keepalive's connection is not over TCP (FL_DSN names a Unix-domain socket)"),
    };
    let cut = NetCut::port(port).unwrap_or_else(|e| skip(e));
    let before = lease.status().renewals;
    let t0 = Instant::now();
    eventually("renews again on a new connection", secs(8), || async {
        lease.status().renewals > before && lease.keepalive_backend_pid().is_some_and(|p| p != kpid)
    })
    .await;
    println!(
        "    network cut: renewing on a new connection after {:.1} s (interval 1 s, ttl 10 s)",
        t0.elapsed().as_secs_f64()
    );
    assert!(!lease.is_lost());
    assert!(live(&admin, &name, lease.token()).await);
    drop(cut);
    assert!(lease.release().await.unwrap());
}

async fn a_session_bound_lease_whose_connection_is_terminated_ends_and_is_signalled_lost_at_the_next_renew(
    ctx: Arc<Ctx>,
) {
    let admin = ctx.admin().await;
    let name = unique("session");
    let locker = Locker::builder(&ctx.dsn).keepalive_interval(ms(300)).build().unwrap();
    let lease = locker.acquire(&name).ttl(secs(20)).session_bound(true).await.unwrap();
    assert!(lease.session_bound());
    let pid = lease.connection().backend_pid().unwrap();
    let lost = lease.lost();
    let t0 = Instant::now();
    let _: bool = admin.query_one("SELECT pg_terminate_backend($1)", &[&pid]).await.unwrap().get(0);
    eventually("the lease ends on the server", secs(5), || async {
        !live(&admin, &name, lease.token()).await
    })
    .await;
    tokio::time::timeout(secs(5), lost.cancelled()).await.expect("lost not signalled at the next renew");
    println!(
        "    lost {:.0} ms after the terminate (keepalive every 300 ms)",
        t0.elapsed().as_secs_f64() * 1000.0
    );
    assert_eq!(lease.status().state, LeaseState::Lost);
    // The session's end was recorded by the server; no release comes after.
    assert!(!lease.release().await.unwrap());
}

// ------------------------------------------------------------------ release

async fn release_stops_the_keepalive_and_its_connection_is_gone_from_the_server_when_release_returns(
    ctx: Arc<Ctx>,
) {
    let admin = ctx.admin().await;
    // Renewing all the time: a release usually meets a renew in flight.
    let locker = Locker::builder(&ctx.dsn).keepalive_interval(ms(20)).build().unwrap();
    for round in 0..5 {
        let name = unique("release");
        let lease = locker.acquire(&name).ttl(secs(5)).await.unwrap();
        eventually("renews", secs(5), || async { lease.status().renewals >= 2 }).await;
        let kpid = lease.keepalive_backend_pid().unwrap();
        assert!(backend_exists(&admin, kpid).await);
        assert!(lease.release().await.unwrap(), "round {round}");
        assert!(
            !backend_exists(&admin, kpid).await,
            "round {round}: the keepalive's session {kpid} is still there after release returned"
        );
        assert_eq!(ended_by(&admin, lease.token()).await.as_deref(), Some("release"));
        let renewals = lease.status().renewals;
        tokio::time::sleep(ms(100)).await;
        assert_eq!(lease.status().renewals, renewals, "a renew after the release");
    }
}

async fn release_waits_for_a_renew_in_flight_and_is_sent_only_after_it(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let name = unique("inflight");
    let locker = Locker::builder(&ctx.dsn).keepalive_interval(ms(300)).build().unwrap();
    let ttl = secs(10);
    let lease = locker.acquire(&name).ttl(ttl).await.unwrap();
    eventually("a first renew", secs(5), || async { lease.status().renewals >= 1 }).await;
    let kpid = lease.keepalive_backend_pid().unwrap();
    let lpid = lease.connection().backend_pid().unwrap();
    // A renew of the lease in another session's open transaction holds the
    // lease's lock until that transaction ends, so the keepalive's next renew
    // waits for it on the server: a renew in flight. (A guarded write would
    // not do: it does not hold up a renew.)
    let blocker = ctx.admin().await;
    let tx = blocker.transaction().await.unwrap();
    let renewed: bool =
        tx.query_one("SELECT fenced_lock_renew($1, $2)", &[&name, &lease.token()]).await.unwrap().get(0);
    assert!(renewed);
    eventually("the keepalive's renew waits on the server", secs(5), || async {
        admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active' AND wait_event_type = 'Lock'",
                &[&kpid],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 1
    })
    .await;
    let release = lease.release();
    tokio::pin!(release);
    assert!(tokio::time::timeout(ms(800), &mut release).await.is_err(), "release did not wait for the renew");
    // Seen from the server: the release has not been sent.
    let (q, _) = last_statement(&admin, lpid).await;
    assert!(!q.contains("fenced_lock_release"), "release sent while a renew was in flight: {q}");
    let before_commit: String = tx.query_one("SELECT clock_timestamp()::text", &[]).await.unwrap().get(0);
    tx.commit().await.unwrap();
    let t0 = Instant::now();
    assert!(tokio::time::timeout(secs(10), release).await.expect("release after the renew").unwrap());
    println!(
        "    release returned {:.0} ms after the renew could go on",
        t0.elapsed().as_secs_f64() * 1000.0
    );
    // The renew ran after the blocker committed, and the release after it.
    let r = admin
        .query_one(
            "SELECT ended_by, expires_at - $2::text::interval >= $3::text::timestamptz, \
                    ended_at >= expires_at - $2::text::interval \
             FROM fenced_lock_history WHERE token = $1",
            &[&lease.token(), &"10 seconds", &before_commit],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "release");
    assert!(r.get::<_, bool>(1), "the keepalive's renew did not run after the blocking renew committed");
    assert!(r.get::<_, bool>(2), "the release ran before the last renew");
    assert!(!backend_exists(&admin, kpid).await, "keepalive connection still open after release");
}

async fn releasing_twice_sends_one_release_and_the_second_returns_false_without_a_round_trip(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let name = unique("twice");
    let lease = ctx.locker().acquire(&name).await.unwrap();
    let pid = lease.connection().backend_pid().unwrap();
    assert!(lease.release().await.unwrap());
    let first = last_statement(&admin, pid).await;
    assert!(first.0.contains("fenced_lock_release"), "{first:?}");
    assert!(!lease.release().await.unwrap());
    assert_eq!(last_statement(&admin, pid).await, first, "the second release reached the server");
}

async fn a_release_inside_a_transaction_is_part_of_it_and_takes_effect_at_commit(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let id = new_doc(&ctx).await;
    let name = format!("doc:{id}");
    let lease = ctx.locker().acquire(&name).await.unwrap();
    let tx = lease.transaction().await.unwrap();
    tx.execute("UPDATE docs SET body = 'in tx', fence_token = $1 WHERE id = $2", &[&lease.token(), &id])
        .await
        .unwrap();
    assert!(lease.release().await.unwrap());
    assert!(live(&admin, &name, lease.token()).await, "the release took effect before the commit");
    tx.commit().await.unwrap();
    assert!(!live(&admin, &name, lease.token()).await);
    let body: String = admin.query_one("SELECT body FROM docs WHERE id = $1", &[&id]).await.unwrap().get(0);
    assert_eq!(body, "in tx");
    assert_eq!(ended_by(&admin, lease.token()).await.as_deref(), Some("release"));
}

async fn a_release_in_a_failed_transaction_rolls_it_back_first(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let name = unique("failedtx");
    let lease = ctx.locker().acquire(&name).await.unwrap();
    let tx = lease.transaction().await.unwrap();
    assert!(tx.execute("SELECT 1/0", &[]).await.is_err());
    assert_eq!(lease.connection().transaction_status().await, TransactionStatus::Failed);
    assert!(lease.release().await.unwrap());
    assert!(!live(&admin, &name, lease.token()).await);
    assert_eq!(lease.connection().transaction_status().await, TransactionStatus::Idle);
    drop(tx);
}

async fn a_release_whose_connection_is_gone_is_sent_on_a_new_connection(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let name = unique("gone");
    let lease = ctx.locker().acquire(&name).ttl(secs(30)).await.unwrap();
    let pid = lease.connection().backend_pid().unwrap();
    let _: bool = admin.query_one("SELECT pg_terminate_backend($1)", &[&pid]).await.unwrap().get(0);
    eventually("the connection is seen closed", secs(5), || async { lease.connection().is_closed() }).await;
    assert!(live(&admin, &name, lease.token()).await, "a plain lease outlives its session");
    assert!(lease.release().await.unwrap());
    assert!(!live(&admin, &name, lease.token()).await);
    assert_eq!(ended_by(&admin, lease.token()).await.as_deref(), Some("release"));
}

async fn a_release_whose_future_is_dropped_still_completes(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let name = unique("dropped-release");
    let lease = ctx.locker().acquire(&name).ttl(secs(30)).await.unwrap();
    // Polled once, then dropped: the release has been handed over.
    let polled_once = tokio::select! {
        biased;
        _ = lease.release() => false,
        _ = std::future::ready(()) => true,
    };
    assert!(polled_once, "a release done at its first poll");
    eventually("released anyway", secs(5), || async { !live(&admin, &name, lease.token()).await }).await;
    assert_eq!(ended_by(&admin, lease.token()).await.as_deref(), Some("release"));
    assert_eq!(lease.status().state, LeaseState::Released);
    assert!(!lease.release().await.unwrap());
}

async fn a_lost_lease_is_never_released(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let name = unique("lostnorelease");
    let lease = ctx.locker().acquire(&name).ttl(ms(500)).keepalive(false).await.unwrap();
    let pid = lease.connection().backend_pid().unwrap();
    tokio::time::timeout(secs(5), lease.lost().cancelled()).await.expect("lost at the deadline");
    let before = last_statement(&admin, pid).await;
    assert!(!lease.release().await.unwrap());
    assert_eq!(last_statement(&admin, pid).await, before, "a release was sent for a lost lease");
    // Its record is still there (expired, or about to: the client's deadline
    // comes first): no release deleted it.
    let records: i64 = admin
        .query_one(
            "SELECT count(*) FROM fenced_lock_leases WHERE name = $1 AND token = $2",
            &[&name, &lease.token()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(records, 1, "the lease's record was deleted");
}

async fn dropping_a_live_lease_releases_it_in_the_background(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let name = unique("drop");
    let lease = ctx.locker().acquire(&name).ttl(secs(30)).await.unwrap();
    let token = lease.token();
    drop(lease);
    eventually("released after the drop", secs(5), || async { !live(&admin, &name, token).await }).await;
    assert_eq!(ended_by(&admin, token).await.as_deref(), Some("release"));
}

async fn leaving_the_scope_by_a_panic_releases_the_lease(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let name = unique("panic");
    let locker = ctx.locker();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let n = name.clone();
    let task = tokio::spawn(async move {
        let lease = locker.acquire(&n).ttl(secs(30)).await.unwrap();
        tx.send(lease.token()).unwrap();
        std::panic::panic_any(Intended("the work failed"));
    });
    let token = rx.await.unwrap();
    assert!(task.await.unwrap_err().is_panic());
    eventually("released after the panic", secs(5), || async { !live(&admin, &name, token).await }).await;
    assert_eq!(ended_by(&admin, token).await.as_deref(), Some("release"));
}

// ---------------------------------------------------------------- acquiring

async fn an_acquire_that_waited_longer_than_its_ttl_is_not_lost_when_granted(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let name = unique("waited");
    let locker = ctx.locker();
    let first = locker.acquire(&name).ttl(secs(3)).await.unwrap();
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(ms(4000)).await;
        assert!(first.release().await.unwrap());
    });
    let t0 = Instant::now();
    let second = locker.acquire(&name).ttl(secs(2)).await.unwrap();
    let waited = t0.elapsed();
    releaser.await.unwrap();
    assert!(waited > secs(2), "did not wait ({waited:?})");
    tokio::time::sleep(ms(2500)).await;
    assert!(!second.is_lost(), "lost after waiting {waited:?} for a 2 s lease: {:?}", second.status());
    assert!(live(&admin, &name, second.token()).await);
    assert!(second.release().await.unwrap());
}

async fn try_acquire_returns_none_while_the_lock_is_held_and_the_given_connection_stays_usable(
    ctx: Arc<Ctx>,
) {
    let name = unique("try");
    let locker = ctx.locker();
    let held = locker.try_acquire(&name).await.unwrap().unwrap();
    let conn = locker.connect().await.unwrap();
    assert!(locker.try_acquire(&name).on(&conn).await.unwrap().is_none());
    assert!(locker.try_acquire(&name).await.unwrap().is_none());
    let one: i32 = conn.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
    assert!(held.release().await.unwrap());
    let mine = locker.try_acquire(&name).on(&conn).await.unwrap().unwrap();
    assert_eq!(mine.connection().backend_pid(), conn.backend_pid());
    assert!(mine.release().await.unwrap());
}

async fn an_acquire_on_a_connection_inside_a_transaction_is_refused_and_sends_nothing(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let name = unique("intx");
    let locker = ctx.locker();
    let conn = locker.connect().await.unwrap();
    let pid = conn.backend_pid().unwrap();
    let refused = |r: Result<Option<Lease>, Error>| match r {
        Err(Error::Usage(m)) => assert!(m.contains("outside a transaction"), "{m}"),
        other => panic!("not a usage error: {other:?}"),
    };
    {
        let tx = conn.transaction().await.unwrap();
        let before = last_statement(&admin, pid).await;
        refused(locker.try_acquire(&name).on(&conn).await);
        match locker.acquire(&name).on(&conn).await {
            Err(Error::Usage(_)) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(last_statement(&admin, pid).await, before, "something was sent");
        assert!(tx.execute("SELECT 1/0", &[]).await.is_err());
        refused(locker.try_acquire(&name).on(&conn).await);
        // Dropped: its ROLLBACK is queued, and the next acquire waits for its answer.
    }
    let lease =
        locker.try_acquire(&name).on(&conn).await.unwrap().expect("granted once the transaction is gone");
    assert!(lease.release().await.unwrap());
    conn.batch_execute("BEGIN").await.unwrap();
    let before = last_statement(&admin, pid).await;
    refused(locker.try_acquire(&name).on(&conn).await);
    assert_eq!(last_statement(&admin, pid).await, before);
    conn.batch_execute("ROLLBACK").await.unwrap();
    let none: i64 = admin
        .query_one("SELECT count(*) FROM fenced_lock_leases WHERE name = $1 AND live", &[&name])
        .await
        .unwrap()
        .get(0);
    assert_eq!(none, 0);
}

async fn keepalive_off_the_lease_is_lost_at_its_deadline_and_a_manual_renew_moves_it(ctx: Arc<Ctx>) {
    let name = unique("nokeepalive");
    let t0 = Instant::now();
    let lease = ctx.locker().acquire(&name).ttl(secs(1)).keepalive(false).await.unwrap();
    assert!(lease.keepalive_backend_pid().is_none());
    tokio::time::sleep(ms(500)).await;
    assert!(lease.renew().await.unwrap());
    let lost = lease.lost();
    tokio::time::timeout(secs(5), lost.cancelled()).await.expect("lost at the deadline");
    let at = t0.elapsed();
    println!("    lost {:.0} ms after the acquire (renewed at 500 ms, ttl 1 s)", at.as_secs_f64() * 1000.0);
    assert!(at >= ms(1500), "lost at {at:?}, before the renewed deadline");
    assert_eq!(lease.status().renewals, 1);
    assert!(!lease.renew().await.unwrap());
}

async fn shared_leases_and_permits_live_together_as_the_server_allows(ctx: Arc<Ctx>) {
    ctx.at_least((0, 3, 0), "shared leases and permits");
    let locker = ctx.locker();
    let name = unique("shared");
    let a = locker.try_acquire(&name).shared(true).await.unwrap().expect("first shared");
    let b = locker.try_acquire(&name).shared(true).await.unwrap().expect("second shared");
    assert_ne!(a.token(), b.token());
    assert!(locker.try_acquire(&name).await.unwrap().is_none(), "exclusive beside shared");
    assert!(a.release().await.unwrap() && b.release().await.unwrap());
    let name = unique("permits");
    let p1 = locker.try_acquire(&name).permits(2).await.unwrap().expect("permit 1");
    let p2 = locker.try_acquire(&name).permits(2).await.unwrap().expect("permit 2");
    assert!(locker.try_acquire(&name).permits(2).await.unwrap().is_none(), "a third of two permits");
    assert!(p1.release().await.unwrap() && p2.release().await.unwrap());
}

/// The mode and permit count the server recorded for `token`.
async fn mode_of(admin: &Connection, token: i64) -> (String, Option<i32>) {
    let r = admin
        .query_one("SELECT mode, permits FROM fenced_lock_leases WHERE token = $1", &[&token])
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

async fn shared_leases_are_waited_for_renewed_and_released_like_exclusive_ones(ctx: Arc<Ctx>) {
    ctx.at_least((0, 3, 0), "shared leases");
    let admin = ctx.admin().await;
    let locker = Locker::builder(&ctx.dsn).keepalive_interval(ms(200)).build().unwrap();
    let name = unique("shared-acquire");
    let a = locker.acquire(&name).ttl(secs(2)).shared(true).wait(secs(5)).await.unwrap();
    let b = locker.acquire(&name).ttl(secs(2)).shared(true).wait(secs(5)).await.unwrap();
    assert!(a.shared() && b.shared() && a.token() != b.token());
    assert_eq!(mode_of(&admin, a.token()).await, ("shared".to_string(), None));
    // An exclusive request waits for every shared lease to end.
    match locker.acquire(&name).ttl(secs(2)).wait(ms(300)).await {
        Err(e @ Error::WaitTimeout(_)) => assert_eq!(e.sqlstate(), Some("55P03")),
        other => panic!("an exclusive lease beside shared ones: {other:?}"),
    }
    eventually("both shared leases renewed", secs(5), || async {
        a.status().renewals >= 2 && b.status().renewals >= 2
    })
    .await;
    assert!(live(&admin, &name, a.token()).await && live(&admin, &name, b.token()).await);
    assert!(a.release().await.unwrap());
    assert!(b.release().await.unwrap());
    assert_eq!(ended_by(&admin, a.token()).await.as_deref(), Some("release"));
    assert_eq!(ended_by(&admin, b.token()).await.as_deref(), Some("release"));
    let exclusive = locker.try_acquire(&name).await.unwrap().expect("exclusive once the shared leases ended");
    assert!(exclusive.release().await.unwrap());
}

async fn a_permit_is_waited_for_renewed_released_and_taken_by_the_retry_helper(ctx: Arc<Ctx>) {
    ctx.at_least((0, 3, 0), "permits");
    let admin = ctx.admin().await;
    let locker = Locker::builder(&ctx.dsn).keepalive_interval(ms(200)).build().unwrap();
    let name = unique("permit-acquire");
    let p1 = locker.acquire(&name).ttl(secs(2)).permits(2).await.unwrap();
    let p2 = locker.try_acquire(&name).ttl(secs(2)).permits(2).await.unwrap().expect("the second permit");
    assert_eq!(p1.permits(), 2);
    assert_eq!(mode_of(&admin, p1.token()).await, ("permit".to_string(), Some(2)));
    // A third waits until a permit frees, then is granted a new token.
    let waiter = {
        let (locker, name) = (locker.clone(), name.clone());
        tokio::spawn(async move { locker.acquire(&name).ttl(secs(2)).permits(2).wait(secs(10)).await })
    };
    eventually("the third waits in line", secs(5), || async {
        admin
            .query_one("SELECT count(*) FROM fenced_lock_waiters WHERE name = $1", &[&name])
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 1
    })
    .await;
    eventually("both permits renewed", secs(5), || async {
        p1.status().renewals >= 2 && p2.status().renewals >= 2
    })
    .await;
    assert!(p1.release().await.unwrap());
    let p3 =
        tokio::time::timeout(secs(10), waiter).await.expect("granted once a permit freed").unwrap().unwrap();
    assert!(p3.token() > p2.token());
    assert!(live(&admin, &name, p2.token()).await && live(&admin, &name, p3.token()).await);
    assert!(p2.release().await.unwrap() && p3.release().await.unwrap());
    // The retry helper with permits: it returns what its closure returned,
    // after releasing the permit.
    let mut token = 0;
    let (mode, permits) = locker
        .acquire(&name)
        .ttl(secs(2))
        .permits(2)
        .run(async |lease| {
            token = lease.token();
            Ok(mode_of(&admin, lease.token()).await)
        })
        .await
        .unwrap();
    assert_eq!((mode.as_str(), permits), ("permit", Some(2)));
    assert_eq!(ended_by(&admin, token).await.as_deref(), Some("release"));
}

async fn shared_and_permits_are_sent_only_when_they_are_not_the_default(ctx: Arc<Ctx>) {
    ctx.at_least((0, 3, 0), "shared leases and permits");
    let admin = ctx.admin().await;
    let locker = ctx.locker();
    let name = unique("sent");
    let sent =
        async |lease: &Lease| last_statement(&admin, lease.connection().backend_pid().unwrap()).await.0;
    // Without them an exclusive acquire also runs on a 0.2.0 server.
    let lease = locker.try_acquire(&name).await.unwrap().unwrap();
    let q = sent(&lease).await;
    assert!(q.contains("fenced_lock_try_acquire") && !q.contains("shared") && !q.contains("permits"), "{q}");
    assert!(lease.release().await.unwrap());
    let lease = locker.acquire(&name).ttl(secs(5)).await.unwrap();
    let q = sent(&lease).await;
    assert!(q.contains("fenced_lock_acquire") && !q.contains("shared") && !q.contains("permits"), "{q}");
    assert!(lease.release().await.unwrap());
    let lease = locker.acquire(&name).shared(true).await.unwrap();
    let q = sent(&lease).await;
    assert!(q.contains("shared =>") && !q.contains("permits"), "{q}");
    assert!(lease.release().await.unwrap());
    let lease = locker.try_acquire(&name).permits(3).await.unwrap().unwrap();
    let q = sent(&lease).await;
    assert!(q.contains("permits =>") && !q.contains("shared"), "{q}");
    assert!(lease.release().await.unwrap());
}

async fn the_extensions_schema_can_be_named(ctx: Arc<Ctx>) {
    let name = unique("schema");
    let locker = Locker::builder(&ctx.dsn).schema("public").build().unwrap();
    let lease = locker.try_acquire(&name).await.unwrap().unwrap();
    assert!(lease.release().await.unwrap());
    let wrong = Locker::builder(&ctx.dsn).schema("no_such_schema").build().unwrap();
    match wrong.try_acquire(&name).await {
        Err(e @ Error::Database(_)) => assert!(matches!(e.sqlstate(), Some("3F000") | Some("42883")), "{e}"),
        other => panic!("{other:?}"),
    }
}

// ------------------------------------------------------------------- pools

async fn a_pool_gives_each_lease_two_connections_and_reuses_the_leases_connection(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let pool =
        Pool::builder(Config::from_str(&ctx.dsn).unwrap()).max_size(2).wait_timeout(ms(500)).build().unwrap();
    let locker = Locker::from_pool(pool.clone()).build().unwrap();
    let (n1, n2) = (unique("pool"), unique("pool"));
    let first = locker.acquire(&n1).ttl(secs(5)).await.unwrap();
    eventually("the keepalive took its slot", secs(5), || async { first.keepalive_backend_pid().is_some() })
        .await;
    let app: String = admin
        .query_one(
            "SELECT application_name FROM pg_stat_activity WHERE pid = $1",
            &[&first.keepalive_backend_pid().unwrap()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(app, "fenced_lock_keepalive");
    assert_eq!(pool.size(), 2);
    match locker.try_acquire(&n2).await {
        Err(Error::Usage(m)) => assert!(m.contains("no free connection"), "{m}"),
        other => panic!("a third connection from a pool of 2: {other:?}"),
    }
    let lease_pid = first.connection().backend_pid();
    assert!(first.release().await.unwrap());
    drop(first);
    let second = locker.acquire(&n2).ttl(secs(5)).await.unwrap();
    assert_eq!(second.connection().backend_pid(), lease_pid, "the pooled connection was not reused");
    assert!(second.release().await.unwrap());
    drop(second);
    assert!(pool.size() <= 2);
}

// ------------------------------------------------------------ retry helper

async fn the_retry_helper_reruns_from_the_acquire_after_fl001_and_returns_the_value(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let item = new_item(&ctx, 10).await;
    let name = format!("inventory:{item}");
    let locker = ctx.locker();
    let mut tokens = Vec::new();
    let sold = locker
        .acquire(&name)
        .run(async |lease| {
            tokens.push(lease.token());
            if tokens.len() == 1 {
                // The lease is lost (force-released) between the read and the write.
                let _: bool =
                    admin.query_one("SELECT fenced_lock_force_release($1)", &[&name]).await.unwrap().get(0);
            }
            sell_one(lease, item).await
        })
        .await
        .unwrap();
    assert_eq!(sold, Some(9));
    assert_eq!(tokens.len(), 2);
    assert!(tokens[1] > tokens[0]);
    assert_eq!(stock(&admin, item).await, 9);
    assert_eq!(
        ended_by(&admin, tokens[0]).await.as_deref(),
        Some("force_release"),
        "the lost lease was released"
    );
    assert_eq!(ended_by(&admin, tokens[1]).await.as_deref(), Some("release"));
}

async fn the_retry_helper_gives_up_after_its_attempts_with_the_last_fl001(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let item = new_item(&ctx, 10).await;
    let name = format!("inventory:{item}");
    let mut calls = 0;
    let r = ctx
        .locker()
        .acquire(&name)
        .attempts(3)
        .run(async |lease| {
            calls += 1;
            let _: bool =
                admin.query_one("SELECT fenced_lock_force_release($1)", &[&name]).await.unwrap().get(0);
            sell_one(lease, item).await
        })
        .await;
    match r {
        Err(e @ Error::StaleToken(_)) => assert_eq!(e.sqlstate(), Some("FL001")),
        other => panic!("{other:?}"),
    }
    assert_eq!(calls, 3);
    assert_eq!(stock(&admin, item).await, 10);
}

async fn the_retry_helper_returns_any_other_error_at_once_after_the_release(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let name = unique("other");
    let mut calls = 0;
    let mut token = 0;
    let r: Result<(), Error> = ctx
        .locker()
        .run(&name, async |lease| {
            calls += 1;
            token = lease.token();
            Err(Error::other("the work failed"))
        })
        .await;
    assert!(matches!(r, Err(Error::Other(_))), "{r:?}");
    assert_eq!(calls, 1);
    assert_eq!(ended_by(&admin, token).await.as_deref(), Some("release"));
}

async fn four_inventory_processes_one_sigstopped_past_its_ttl_sell_the_stock_of_100_each_sale_counted_once(
    ctx: Arc<Ctx>,
) {
    let admin = ctx.admin().await;
    let item = new_item(&ctx, 100).await;
    let name = format!("inventory:{item}");
    let item_s = item.to_string();
    let ttl = "1.5";
    let mut procs: Vec<Proc> = (0..4)
        .map(|i| {
            Proc::spawn(
                ctx.example("inventory"),
                &["--dsn", &ctx.app_dsn, "--item", &item_s, "--sales", "25", "--ttl", ttl],
                &format!("inventory{i}"),
            )
        })
        .collect();
    let t0 = Instant::now();
    // Stop the process that holds the lock right now.
    let mut stopped = None;
    for _ in 0..200 {
        let row = admin
            .query_opt("SELECT holder, token FROM fenced_lock_leases WHERE name = $1 AND live", &[&name])
            .await
            .unwrap();
        if let Some(row) = row {
            let holder: String = row.get(0);
            let token: i64 = row.get(1);
            let pid: i32 = holder.trim_start_matches("inventory-").parse().unwrap();
            if let Some(p) = procs.iter().position(|p| p.pid() == pid) {
                procs[p].signal(libc::SIGSTOP);
                let still: Option<i64> = admin
                    .query_opt("SELECT token FROM fenced_lock_leases WHERE name = $1 AND live", &[&name])
                    .await
                    .unwrap()
                    .map(|r| r.get(0));
                if still == Some(token) {
                    stopped = Some((p, token));
                    break;
                }
                procs[p].signal(libc::SIGCONT);
            }
        }
        tokio::time::sleep(ms(30)).await;
    }
    let (p, token) = stopped.expect("never caught a process holding the lock");
    tokio::time::sleep(ms(3000)).await;
    procs[p].signal(libc::SIGCONT);
    let mut sold = Vec::new();
    let mut total = 0;
    for pr in procs.iter_mut() {
        let code = pr.finish(secs(90)).await;
        assert_eq!(code, 0, "{}: exit {code}; saw {:?}", pr.label, pr.names());
        assert!(pr.of("sold_out").is_empty(), "{} sold out", pr.label);
        for e in pr.of("sold") {
            sold.push(e["stock"].as_i64());
        }
        let done = pr.of("done");
        assert_eq!(done.len(), 1, "{}", pr.label);
        assert_eq!(done[0]["sold"].as_i64(), 25, "{}", pr.label);
        total += done[0]["sold"].as_i64();
    }
    println!(
        "    100 sales by 4 processes in {:.1} s, one stopped 3 s past its 1.5 s ttl",
        t0.elapsed().as_secs_f64()
    );
    sold.sort();
    assert_eq!(sold, (0..100).collect::<Vec<i64>>(), "each stock value written exactly once");
    assert_eq!(total, 100);
    assert_eq!(stock(&admin, item).await, 0);
    assert_eq!(
        ended_by(&admin, token).await.as_deref(),
        Some("expiry"),
        "the stopped holder's lease did not expire"
    );
}

// ------------------------------------------------------------------ errors

/// The bad arguments every acquire (try, waiting, retry helper) refuses.
#[derive(Debug, Clone, Copy)]
enum Bad {
    EmptyName,
    NulInName,
    ZeroTtl,
    SubMicrosecondTtl,
    TwoHundredYearTtl,
    NulInHolder,
    ZeroPermits,
    SharedWithPermits,
}

const BADS: [Bad; 8] = [
    Bad::EmptyName,
    Bad::NulInName,
    Bad::ZeroTtl,
    Bad::SubMicrosecondTtl,
    Bad::TwoHundredYearTtl,
    Bad::NulInHolder,
    Bad::ZeroPermits,
    Bad::SharedWithPermits,
];

impl Bad {
    fn name(self) -> &'static str {
        match self {
            Bad::EmptyName => "",
            Bad::NulInName => "a\0b",
            _ => "x",
        }
    }
    /// What the message must name.
    fn names(self) -> &'static str {
        match self {
            Bad::EmptyName | Bad::NulInName => "name",
            Bad::ZeroTtl | Bad::SubMicrosecondTtl | Bad::TwoHundredYearTtl => "ttl",
            Bad::NulInHolder => "holder",
            Bad::ZeroPermits => "permits",
            Bad::SharedWithPermits => "shared",
        }
    }
}

fn apply<M>(a: fenced_lock::Acquire<'_, M>, bad: Bad) -> fenced_lock::Acquire<'_, M> {
    match bad {
        Bad::EmptyName | Bad::NulInName => a,
        Bad::ZeroTtl => a.ttl(Duration::ZERO),
        Bad::SubMicrosecondTtl => a.ttl(Duration::from_nanos(500)),
        Bad::TwoHundredYearTtl => a.ttl(Duration::from_secs(200 * 365 * 86400)),
        Bad::NulInHolder => a.holder("a\0b"),
        Bad::ZeroPermits => a.permits(0),
        Bad::SharedWithPermits => a.shared(true).permits(2),
    }
}

fn invalid<T: std::fmt::Debug>(what: &str, r: Result<T, Error>, names: &str) {
    match r {
        Err(Error::InvalidArgument(e)) => {
            assert_eq!(e.sqlstate(), "22023", "{what}");
            assert!(!e.from_server(), "{what}: the server was asked");
            assert!(e.message().contains(names), "{what}: {:?} does not name {names}", e.message());
        }
        other => panic!("{what}: not an invalid-argument error: {other:?}"),
    }
}

async fn every_bad_argument_of_every_call_is_an_invalid_argument_error_and_sends_nothing(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let opened = Arc::new(AtomicUsize::new(0));
    let factory_locker = |interval: Option<Duration>| {
        let (opened, dsn) = (opened.clone(), ctx.dsn.clone());
        let b = Locker::factory(move |_| {
            opened.fetch_add(1, Ordering::SeqCst);
            let dsn = dsn.clone();
            async move { Connection::connect(&Config::from_str(&dsn).unwrap()).await }
        });
        match interval {
            Some(i) => b.keepalive_interval(i),
            None => b,
        }
        .build()
        .unwrap()
    };
    let locker = factory_locker(None);
    let slow = factory_locker(Some(secs(5)));
    let conn = ctx.admin().await;
    let pid = conn.backend_pid().unwrap();
    conn.batch_execute("SELECT 'nothing sent after this'").await.unwrap();
    let marker = last_statement(&admin, pid).await;
    let long = Duration::from_secs(200 * 365 * 86400);

    for on in [false, true] {
        for bad in BADS {
            let t = apply(locker.try_acquire(bad.name()), bad);
            invalid(&format!("try_acquire {bad:?}"), if on { t.on(&conn) } else { t }.await, bad.names());
            let a = apply(locker.acquire(bad.name()), bad);
            invalid(&format!("acquire {bad:?}"), if on { a.on(&conn) } else { a }.await, bad.names());
            let r = apply(locker.acquire(bad.name()), bad);
            let r = if on { r.on(&conn) } else { r };
            invalid(&format!("run {bad:?}"), r.run(async |_| Ok(())).await, bad.names());
        }
        let w = locker.acquire("x").wait(long);
        invalid("acquire 200-year wait", if on { w.on(&conn) } else { w }.await, "wait");
        let w = locker.acquire("x").attempts(0);
        invalid(
            "run zero attempts",
            if on { w.on(&conn) } else { w }.run(async |_| Ok(())).await,
            "attempts",
        );
        let k = slow.try_acquire("x").ttl(secs(2));
        invalid(
            "keepalive_interval over the ttl",
            if on { k.on(&conn) } else { k }.await,
            "keepalive_interval",
        );
    }
    invalid("Locker dsn", Locker::new("host=localhost port=notaport"), "dsn");
    invalid(
        "Locker keepalive_interval",
        Locker::builder(&ctx.dsn).keepalive_interval(Duration::ZERO).build(),
        "keepalive_interval",
    );
    invalid("Locker attempts", Locker::builder(&ctx.dsn).attempts(0).build(), "attempts");
    invalid("Locker schema", Locker::builder(&ctx.dsn).schema("").build(), "schema");
    invalid("Pool dsn", Pool::new("host=localhost port=notaport"), "dsn");
    invalid(
        "Pool max_size",
        Pool::builder(Config::from_str(&ctx.dsn).unwrap()).max_size(0).build(),
        "max_size",
    );
    invalid("seconds negative", fenced_lock::args::seconds("wait", -1.0), "wait");
    invalid("seconds NaN", fenced_lock::args::seconds("ttl", f64::NAN), "ttl");
    invalid("permits negative", fenced_lock::args::permits(-1), "permits");

    // Refused before sending too, as usage errors.
    let pooled = Locker::factory({
        let (opened, dsn) = (opened.clone(), ctx.dsn.clone());
        move |_| {
            opened.fetch_add(1, Ordering::SeqCst);
            let dsn = dsn.clone();
            async move { Connection::connect(&Config::from_str(&dsn).unwrap()).await }
        }
    })
    .transaction_pooling(true)
    .build()
    .unwrap();
    match pooled.try_acquire("x").session_bound(true).await {
        Err(Error::Usage(m)) => assert!(m.contains("transaction_pooling") && m.contains("session"), "{m}"),
        other => panic!("{other:?}"),
    }
    match pooled.acquire("x").session_bound(true).on(&conn).await {
        Err(Error::Usage(_)) => {}
        other => panic!("{other:?}"),
    }

    assert_eq!(opened.load(Ordering::SeqCst), 0, "a connection was opened for a refused call");
    assert_eq!(last_statement(&admin, pid).await, marker, "something was sent on the given connection");
    // A plain lease behind transaction pooling is right.
    let plain = pooled.try_acquire(unique("plain")).await.unwrap().unwrap();
    assert!(plain.release().await.unwrap());
}

/// A `RAISE` of each code through the real driver path: the variant, and the
/// server's SQLSTATE, message, detail and hint carried.
async fn each_sqlstate_of_the_contract_maps_to_its_error_type(ctx: Arc<Ctx>) {
    let conn = ctx.admin().await;
    type Is = fn(&Error) -> bool;
    let cases: [(&str, Is); 8] = [
        ("FL001", |e| matches!(e, Error::StaleToken(_))),
        ("FL002", |e| matches!(e, Error::MissingToken(_))),
        ("FL003", |e| matches!(e, Error::ModeConflict(_))),
        ("55P03", |e| matches!(e, Error::WaitTimeout(_))),
        ("25006", |e| matches!(e, Error::ReadOnly(_))),
        ("42501", |e| matches!(e, Error::NotAllowed(_))),
        ("22023", |e| matches!(e, Error::InvalidArgument(_))),
        ("40001", |e| matches!(e, Error::Database(_))),
    ];
    for (code, is) in cases {
        let sql = format!(
            "DO $$ BEGIN RAISE EXCEPTION 'message of {code}' USING ERRCODE = '{code}', DETAIL = 'detail {code}', \
             HINT = 'hint {code}'; END $$"
        );
        let e = Error::from(conn.batch_execute(&sql).await.unwrap_err());
        assert!(is(&e), "{code} mapped to {e:?}");
        assert_eq!(e.sqlstate(), Some(code));
        assert_eq!(e.sql().unwrap().message(), format!("message of {code}"));
        assert_eq!(e.detail(), Some(format!("detail {code}").as_str()));
        assert_eq!(e.hint(), Some(format!("hint {code}").as_str()));
        assert!(e.sql().unwrap().from_server());
    }
}

/// Each code of the table, raised by the server for its real cause.
async fn each_sqlstate_raised_by_the_server_for_its_cause_comes_back_as_its_error_type(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let locker = ctx.locker();
    let id = new_doc(&ctx).await;
    let name = format!("doc:{id}");

    // FL001: a write with a token that is not live.
    let lease = locker.acquire(&name).await.unwrap();
    let stale = lease.token();
    assert!(lease.release().await.unwrap());
    let e = Error::from(
        admin.execute("UPDATE docs SET fence_token = $1 WHERE id = $2", &[&stale, &id]).await.unwrap_err(),
    );
    assert!(matches!(e, Error::StaleToken(_)) && e.is_stale_token(), "{e:?}");
    assert!(e.detail().unwrap().contains("presented token"), "{e}");

    // FL002: a write without a token.
    let e = Error::from(
        admin.execute("UPDATE docs SET fence_token = NULL WHERE id = $1", &[&id]).await.unwrap_err(),
    );
    assert!(matches!(e, Error::MissingToken(_)), "{e:?}");

    // 55P03: the wait ran out.
    let held = locker.acquire(&name).await.unwrap();
    let t0 = Instant::now();
    match locker.acquire(&name).wait(ms(300)).await {
        Err(e @ Error::WaitTimeout(_)) => assert_eq!(e.sqlstate(), Some("55P03")),
        other => panic!("{other:?}"),
    }
    assert!(t0.elapsed() >= ms(300));

    // 25006: a lease change in a read-only transaction.
    let mut ro = Config::from_str(&ctx.dsn).unwrap();
    ro.options("-c default_transaction_read_only=on");
    let ro = Connection::connect(&ro).await.unwrap();
    match locker.try_acquire(unique("ro")).on(&ro).await {
        Err(e @ Error::ReadOnly(_)) => assert_eq!(e.sqlstate(), Some("25006")),
        other => panic!("{other:?}"),
    }

    // 42501: a role without EXECUTE.
    match Locker::new(&ctx.noexec_dsn).unwrap().try_acquire(unique("noexec")).await {
        Err(e @ Error::NotAllowed(_)) => assert_eq!(e.sqlstate(), Some("42501")),
        other => panic!("{other:?}"),
    }

    // 22023 from the server: what only it can judge.
    for (what, r) in [
        ("a 513-byte name", locker.try_acquire("n".repeat(513)).await),
        ("a ttl above fenced_lock.max_ttl", locker.try_acquire(unique("maxttl")).ttl(secs(2 * 86400)).await),
    ] {
        match r {
            Err(Error::InvalidArgument(e)) => {
                assert!(e.from_server(), "{what}");
                assert_eq!(e.sqlstate(), "22023");
            }
            other => panic!("{what}: {other:?}"),
        }
    }

    // No SQLSTATE: nothing listens there.
    match Locker::new("postgresql://postgres@127.0.0.1:1/postgres?connect_timeout=5")
        .unwrap()
        .try_acquire("x")
        .await
    {
        Err(e @ Error::Connection(_)) => assert!(e.sqlstate().is_none() && e.is_connection()),
        other => panic!("{other:?}"),
    }
    assert!(held.release().await.unwrap());
}

async fn fl003_from_the_server_is_a_mode_conflict(ctx: Arc<Ctx>) {
    ctx.at_least((0, 3, 0), "FL003 (mode conflict)");
    let locker = ctx.locker();
    let name = unique("fl003");
    let three = locker.try_acquire(&name).permits(3).await.unwrap().unwrap();
    match locker.try_acquire(&name).permits(2).await {
        Err(e @ Error::ModeConflict(_)) => assert_eq!(e.sqlstate(), Some("FL003")),
        other => panic!("another permit count on a live name: {other:?}"),
    }
    assert!(three.release().await.unwrap());
}

// -------------------------------------------------------------------- main

type Boxed = Pin<Box<dyn Future<Output = ()>>>;

macro_rules! tests {
    ($($name:ident: $bound:expr),* $(,)?) => {
        vec![$(Test { name: stringify!($name), bound: secs($bound), f: |c| -> Boxed { Box::pin($name(c)) } }),*]
    };
}

fn main() -> ExitCode {
    let tests = tests![
        four_inventory_processes_one_sigstopped_past_its_ttl_sell_the_stock_of_100_each_sale_counted_once: 150,
        sigstop_past_the_ttl_signals_lost_within_a_second_of_sigcont_and_the_write_is_refused_with_fl001: 60,
        keepalive_keeps_a_critical_section_of_three_ttls_alive: 30,
        keepalive_renews_while_the_applications_runtime_is_blocked: 30,
        a_guarded_transaction_open_for_three_ttls_keeps_its_lease_and_its_commit_is_accepted: 30,
        keepalive_reconnects_after_its_connection_is_terminated_and_the_lease_stays_live: 30,
        a_session_bound_lease_whose_connection_is_terminated_ends_and_is_signalled_lost_at_the_next_renew: 30,
        a_network_cut_of_the_keepalives_connection_is_survived_on_a_new_connection: 30,
        release_stops_the_keepalive_and_its_connection_is_gone_from_the_server_when_release_returns: 60,
        release_waits_for_a_renew_in_flight_and_is_sent_only_after_it: 30,
        releasing_twice_sends_one_release_and_the_second_returns_false_without_a_round_trip: 20,
        a_release_inside_a_transaction_is_part_of_it_and_takes_effect_at_commit: 20,
        a_release_in_a_failed_transaction_rolls_it_back_first: 20,
        a_release_whose_connection_is_gone_is_sent_on_a_new_connection: 20,
        a_lost_lease_is_never_released: 20,
        a_release_whose_future_is_dropped_still_completes: 20,
        dropping_a_live_lease_releases_it_in_the_background: 20,
        leaving_the_scope_by_a_panic_releases_the_lease: 20,
        an_acquire_that_waited_longer_than_its_ttl_is_not_lost_when_granted: 30,
        try_acquire_returns_none_while_the_lock_is_held_and_the_given_connection_stays_usable: 20,
        an_acquire_on_a_connection_inside_a_transaction_is_refused_and_sends_nothing: 20,
        keepalive_off_the_lease_is_lost_at_its_deadline_and_a_manual_renew_moves_it: 20,
        shared_leases_and_permits_live_together_as_the_server_allows: 20,
        shared_leases_are_waited_for_renewed_and_released_like_exclusive_ones: 30,
        a_permit_is_waited_for_renewed_released_and_taken_by_the_retry_helper: 30,
        shared_and_permits_are_sent_only_when_they_are_not_the_default: 20,
        the_extensions_schema_can_be_named: 20,
        a_pool_gives_each_lease_two_connections_and_reuses_the_leases_connection: 30,
        the_retry_helper_reruns_from_the_acquire_after_fl001_and_returns_the_value: 30,
        the_retry_helper_gives_up_after_its_attempts_with_the_last_fl001: 30,
        the_retry_helper_returns_any_other_error_at_once_after_the_release: 20,
        every_bad_argument_of_every_call_is_an_invalid_argument_error_and_sends_nothing: 30,
        each_sqlstate_of_the_contract_maps_to_its_error_type: 20,
        each_sqlstate_raised_by_the_server_for_its_cause_comes_back_as_its_error_type: 30,
        fl003_from_the_server_is_a_mode_conflict: 20,
    ];
    // The longest first, so that they overlap the many short ones.
    let tests: &'static [Test] = Box::leak(tests.into_iter().rev().collect::<Vec<_>>().into_boxed_slice());
    support::main(tests)
}
