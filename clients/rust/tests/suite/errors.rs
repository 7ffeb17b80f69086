//! Bad arguments refused before sending, and every SQLSTATE mapped to
//! its error type.

use super::*;

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

pub async fn every_bad_argument_of_every_call_is_an_invalid_argument_error_and_sends_nothing(ctx: Arc<Ctx>) {
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
pub async fn each_sqlstate_of_the_contract_maps_to_its_error_type(ctx: Arc<Ctx>) {
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
pub async fn each_sqlstate_raised_by_the_server_for_its_cause_comes_back_as_its_error_type(ctx: Arc<Ctx>) {
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

pub async fn fl003_from_the_server_is_a_mode_conflict(ctx: Arc<Ctx>) {
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
