//! Release: no renew after it, inside a transaction, on a gone
//! connection, twice, on drop and panic; a lost lease never released.

use super::*;

pub async fn release_stops_the_keepalive_and_its_connection_is_gone_from_the_server_when_release_returns(
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

pub async fn release_waits_for_a_renew_in_flight_and_is_sent_only_after_it(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let name = unique("inflight");
    // A renew held up on the server is given up after min(interval, 1 s):
    // with an interval of 1 s, the renew below is still in flight when the
    // blocker commits.
    let locker = Locker::builder(&ctx.dsn).keepalive_interval(secs(1)).build().unwrap();
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
        waiting_on_a_lock_since(&admin, kpid).await.is_some()
    })
    .await;
    let release = lease.release();
    tokio::pin!(release);
    assert!(tokio::time::timeout(ms(300), &mut release).await.is_err(), "release did not wait for the renew");
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

pub async fn a_release_in_the_holders_own_transaction_that_proclaimed_waits_for_the_held_up_renew_only_about_its_bound(
    ctx: Arc<Ctx>,
) {
    ctx.at_least((0, 3, 0), "fenced_lock_proclaim");
    let admin = ctx.admin().await;
    let name = unique("proclaimed");
    // A renew held up on the server is given up after min(interval, 1 s).
    let locker = Locker::builder(&ctx.dsn).keepalive_interval(ms(300)).build().unwrap();
    let ttl = secs(20);
    let lease = locker.acquire(&name).ttl(ttl).await.unwrap();
    eventually("a first renew", secs(5), || async { lease.status().renewals >= 1 }).await;
    let kpid = lease.keepalive_backend_pid().unwrap();
    // A leader proclaims, and releases before it commits: its own open
    // transaction holds up the keepalive's renew, and the release waits for
    // that renew.
    let tx = lease.transaction().await.unwrap();
    let proclaimed: bool = tx
        .query_one("SELECT fenced_lock_proclaim($1, $2, 'leader at 10.0.0.7')", &[&name, &lease.token()])
        .await
        .unwrap()
        .get(0);
    assert!(proclaimed);
    eventually("the keepalive's renew waits for the holder's transaction", secs(5), || async {
        waiting_on_a_lock_since(&admin, kpid).await.is_some()
    })
    .await;
    let t0 = Instant::now();
    let released = tokio::time::timeout(secs(10), lease.release())
        .await
        .expect("the release waited for the held-up renew as if until the deadline")
        .unwrap();
    let took = t0.elapsed();
    println!(
        "    release in the proclaiming transaction returned after {:.0} ms (renew bound 300 ms, ttl 20 s)",
        took.as_secs_f64() * 1000.0
    );
    assert!(released);
    assert!(took < secs(5), "release took {took:?}: bounded by the renew's 300 ms, not the 20 s deadline");
    assert!(!lease.is_lost(), "{:?}", lease.status());
    assert!(!backend_exists(&admin, kpid).await, "keepalive connection still open after release");
    assert!(live(&admin, &name, lease.token()).await, "the release took effect before the commit");
    tx.commit().await.unwrap();
    assert_eq!(ended_by(&admin, lease.token()).await.as_deref(), Some("release"));
    let leaders: i64 =
        admin.query_one("SELECT count(*) FROM fenced_lock_leader($1)", &[&name]).await.unwrap().get(0);
    assert_eq!(leaders, 0, "a leader is still proclaimed after the release committed");
}

pub async fn releasing_twice_sends_one_release_and_the_second_returns_false_without_a_round_trip(
    ctx: Arc<Ctx>,
) {
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

pub async fn a_release_inside_a_transaction_is_part_of_it_and_takes_effect_at_commit(ctx: Arc<Ctx>) {
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

pub async fn a_release_in_a_failed_transaction_rolls_it_back_first(ctx: Arc<Ctx>) {
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

pub async fn a_release_whose_connection_is_gone_is_sent_on_a_new_connection(ctx: Arc<Ctx>) {
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

pub async fn a_release_whose_future_is_dropped_still_completes(ctx: Arc<Ctx>) {
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

pub async fn a_lost_lease_is_never_released(ctx: Arc<Ctx>) {
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

pub async fn dropping_a_live_lease_releases_it_in_the_background(ctx: Arc<Ctx>) {
    let admin = ctx.admin().await;
    let name = unique("drop");
    let lease = ctx.locker().acquire(&name).ttl(secs(30)).await.unwrap();
    let token = lease.token();
    drop(lease);
    eventually("released after the drop", secs(5), || async { !live(&admin, &name, token).await }).await;
    assert_eq!(ended_by(&admin, token).await.as_deref(), Some("release"));
}

pub async fn leaving_the_scope_by_a_panic_releases_the_lease(ctx: Arc<Ctx>) {
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
