//! The keepalive: sections kept alive, pauses, terminated and cut
//! connections, session-bound leases.

use super::*;

pub async fn keepalive_keeps_a_critical_section_of_three_ttls_alive(ctx: Arc<Ctx>) {
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

pub async fn a_guarded_transaction_open_for_three_ttls_keeps_its_lease_and_its_commit_is_accepted(
    ctx: Arc<Ctx>,
) {
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

pub async fn keepalive_renews_while_the_applications_runtime_is_blocked(ctx: Arc<Ctx>) {
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

pub async fn sigstop_past_the_ttl_signals_lost_within_a_second_of_sigcont_and_the_write_is_refused_with_fl001(
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

pub async fn keepalive_reconnects_after_its_connection_is_terminated_and_the_lease_stays_live(ctx: Arc<Ctx>) {
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

pub async fn a_network_cut_of_the_keepalives_connection_is_survived_on_a_new_connection(ctx: Arc<Ctx>) {
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

pub async fn a_session_bound_lease_whose_connection_is_terminated_ends_and_is_signalled_lost_at_the_next_renew(
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

pub async fn a_renew_held_up_on_the_server_is_given_up_and_retried_and_the_lease_is_not_lost_while_it_is_live(
    ctx: Arc<Ctx>,
) {
    let admin = ctx.admin().await;
    let name = unique("heldup");
    // Renews every 500 ms, each given up after 500 ms held up on the server.
    let locker = Locker::builder(&ctx.dsn).keepalive_interval(ms(500)).build().unwrap();
    let ttl = secs(4);
    let lease = locker.acquire(&name).ttl(ttl).await.unwrap();
    eventually("a first renew", secs(5), || async { lease.status().renewals >= 1 }).await;
    let kpid = lease.keepalive_backend_pid().unwrap();
    let expires_at = async || -> String {
        admin
            .query_one("SELECT expires_at::text FROM fenced_lock_leases WHERE token = $1", &[&lease.token()])
            .await
            .unwrap()
            .get(0)
    };
    // Another session's renew of the lease, left open: it holds up every
    // renew of the keepalive until that transaction ends.
    let blocker = ctx.admin().await;
    let tx = blocker.transaction().await.unwrap();
    let renewed: bool =
        tx.query_one("SELECT fenced_lock_renew($1, $2)", &[&name, &lease.token()]).await.unwrap().get(0);
    assert!(renewed);
    eventually("the keepalive's renew waits on the server", secs(5), || async {
        waiting_on_a_lock_since(&admin, kpid).await.is_some()
    })
    .await;
    let renewals = lease.status().renewals;
    let before = expires_at().await;
    // Held up for three of its bounds, well inside the 4 s deadline.
    let mut attempts = std::collections::BTreeSet::new();
    let until = Instant::now() + ms(1600);
    while Instant::now() < until {
        attempts.extend(waiting_on_a_lock_since(&admin, kpid).await);
        assert!(!lease.is_lost(), "lost while held up: {:?}", lease.status());
        tokio::time::sleep(ms(50)).await;
    }
    let status = lease.status();
    assert_eq!(status.renewals, renewals, "a renew went through while held up");
    let error = status.keepalive_error.unwrap_or_default();
    assert!(error.contains("held up"), "no held-up renew reported: {error:?}");
    assert!(attempts.len() >= 2, "the held-up renew was not given up and sent again: {attempts:?}");
    tx.rollback().await.unwrap();
    let t0 = Instant::now();
    eventually("a renew once the blocking transaction is gone", secs(3), || async {
        lease.status().renewals > renewals
    })
    .await;
    println!(
        "    {} renew attempts held up in 1.6 s (bound 500 ms); renewed {:.0} ms after the blocker's rollback",
        attempts.len(),
        t0.elapsed().as_secs_f64() * 1000.0
    );
    let status = lease.status();
    assert_eq!(status.state, LeaseState::Live, "{status:?}");
    assert!(status.keepalive_error.is_none(), "{status:?}");
    // Seen from the server: the lease is live, and its expiry moved.
    assert!(live(&admin, &name, lease.token()).await);
    let after = expires_at().await;
    let moved: bool = admin
        .query_one("SELECT $1::text::timestamptz > $2::text::timestamptz", &[&after, &before])
        .await
        .unwrap()
        .get(0);
    assert!(moved, "expires_at did not move: {before} -> {after}");
    assert!(lease.release().await.unwrap());
}
