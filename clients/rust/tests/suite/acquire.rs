//! Acquiring: waiting, trying, on a given connection, keepalive off,
//! shared leases and permits, the schema, pools.

use super::*;

pub async fn an_acquire_that_waited_longer_than_its_ttl_is_not_lost_when_granted(ctx: Arc<Ctx>) {
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

pub async fn a_waiting_acquire_whose_wait_takes_most_of_the_ttl_is_renewed_before_it_returns_and_its_deadline_counts_from_that_renew(
    ctx: Arc<Ctx>,
) {
    let admin = ctx.admin().await;
    let name = unique("longwait");
    let locker = ctx.locker();
    let ttl = secs(2);
    // How far the server's expiry is past the grant's: none for a lease
    // granted at once (the control), the renew's delay after a renew.
    let past_grant = async |token: i64| -> (bool, String) {
        let r = admin
            .query_one(
                "SELECT expires_at > acquired_at + $2::text::interval, \
                        (expires_at - acquired_at - $2::text::interval)::text \
                 FROM fenced_lock_leases WHERE token = $1",
                &[&token, &"2 seconds"],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    let first = locker.acquire(&name).ttl(ttl).await.unwrap();
    assert!(!past_grant(first.token()).await.0, "the control: a lease granted at once is not renewed");
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(ms(1600)).await;
        assert!(first.release().await.unwrap());
    });
    let t0 = Instant::now();
    let lease = locker.acquire(&name).ttl(ttl).await.unwrap();
    let returned = Instant::now();
    let status = lease.status();
    // Before the keepalive's first renew, an interval (667 ms) after the
    // confirming one.
    let (moved, by) = past_grant(lease.token()).await;
    let (last, _) = last_statement(&admin, lease.connection().backend_pid().unwrap()).await;
    releaser.await.unwrap();
    let waited = returned - t0;
    println!(
        "    waited {:.0} ms on a 2 s ttl; expires_at {by} past the grant's; deadline {:.0} ms after the return",
        waited.as_secs_f64() * 1000.0,
        status.deadline.saturating_duration_since(returned).as_secs_f64() * 1000.0
    );
    assert!(waited >= ms(1400), "did not wait ({waited:?})");
    assert_eq!(status.state, LeaseState::Live, "{status:?}");
    assert_eq!(status.renewals, 1, "no renew before the acquire returned: {status:?}");
    assert!(last.contains("fenced_lock_renew"), "the last statement on the lease's connection: {last}");
    assert!(moved, "the server's expiry did not move past the grant's ({by})");
    // Counted from that renew's send: past what the acquire's send gives
    // (t0 + ttl), never past what the return would.
    assert!(status.deadline > t0 + ttl + ms(1000), "deadline not moved by the renew: {status:?}");
    assert!(status.deadline <= returned + ttl);
    // Not lost after the acquire's own deadline would have passed.
    tokio::time::sleep_until((t0 + ttl + ms(400)).into()).await;
    assert!(!lease.is_lost(), "lost right after the long wait: {:?}", lease.status());
    assert!(live(&admin, &name, lease.token()).await);
    assert!(lease.release().await.unwrap());
}

pub async fn try_acquire_returns_none_while_the_lock_is_held_and_the_given_connection_stays_usable(
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

pub async fn an_acquire_on_a_connection_inside_a_transaction_is_refused_and_sends_nothing(ctx: Arc<Ctx>) {
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

pub async fn keepalive_off_the_lease_is_lost_at_its_deadline_and_a_manual_renew_moves_it(ctx: Arc<Ctx>) {
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

pub async fn shared_leases_and_permits_live_together_as_the_server_allows(ctx: Arc<Ctx>) {
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

pub async fn shared_leases_are_waited_for_renewed_and_released_like_exclusive_ones(ctx: Arc<Ctx>) {
    ctx.at_least((0, 3, 0), "shared leases");
    let admin = ctx.admin().await;
    let locker = Locker::builder(&ctx.dsn).keepalive_interval(ms(200)).build().unwrap();
    let name = unique("shared-acquire");
    let a = locker.acquire(&name).ttl(secs(2)).shared(true).wait(secs(5)).await.unwrap();
    let b = locker.acquire(&name).ttl(secs(2)).shared(true).session_bound(true).await.unwrap();
    assert!(a.shared() && b.shared() && a.token() != b.token());
    assert_eq!(mode_of(&admin, a.token()).await, ("shared".to_string(), None));
    let bound: bool = admin
        .query_one("SELECT session_bound FROM fenced_lock_leases WHERE token = $1", &[&b.token()])
        .await
        .unwrap()
        .get(0);
    assert!(bound, "the session-bound shared lease is not recorded as such");
    // Without keepalive, a shared lease is renewed by hand.
    let c = locker.try_acquire(&name).ttl(secs(2)).shared(true).keepalive(false).await.unwrap().unwrap();
    assert!(c.renew().await.unwrap());
    assert_eq!(c.status().renewals, 1);
    assert!(c.release().await.unwrap());
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

pub async fn a_permit_is_waited_for_renewed_released_and_taken_by_the_retry_helper(ctx: Arc<Ctx>) {
    ctx.at_least((0, 3, 0), "permits");
    let admin = ctx.admin().await;
    let locker = Locker::builder(&ctx.dsn).keepalive_interval(ms(200)).build().unwrap();
    let name = unique("permit-acquire");
    let p1 = locker.acquire(&name).ttl(secs(2)).permits(2).await.unwrap();
    let holder = format!("{name}:worker-2");
    let p2 = locker
        .try_acquire(&name)
        .ttl(secs(2))
        .permits(2)
        .holder(&holder)
        .await
        .unwrap()
        .expect("the second permit");
    assert_eq!(p1.permits(), 2);
    assert_eq!(mode_of(&admin, p1.token()).await, ("permit".to_string(), Some(2)));
    // Its holder asking again gets its permit back, renewed (the retry-safe
    // acquire); left without a release, it is the same permit as p2.
    let again =
        locker.try_acquire(&name).ttl(secs(2)).permits(2).holder(&holder).keepalive(false).await.unwrap();
    let again = again.expect("the holder's own permit back");
    assert_eq!(again.token(), p2.token());
    assert!(again.renew().await.unwrap());
    again.abandon().await;
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

pub async fn shared_and_permits_are_sent_only_when_they_are_not_the_default(ctx: Arc<Ctx>) {
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

pub async fn the_extensions_schema_can_be_named(ctx: Arc<Ctx>) {
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

pub async fn a_pool_gives_each_lease_two_connections_and_reuses_the_leases_connection(ctx: Arc<Ctx>) {
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
