//! The retry helper, in-process and as four `inventory` processes.

use super::*;

pub async fn the_retry_helper_reruns_from_the_acquire_after_fl001_and_returns_the_value(ctx: Arc<Ctx>) {
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

pub async fn the_retry_helper_gives_up_after_its_attempts_with_the_last_fl001(ctx: Arc<Ctx>) {
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

pub async fn the_retry_helper_returns_any_other_error_at_once_after_the_release(ctx: Arc<Ctx>) {
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

pub async fn four_inventory_processes_one_sigstopped_past_its_ttl_sell_the_stock_of_100_each_sale_counted_once(
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
