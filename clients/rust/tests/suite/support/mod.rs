//! The suite's harness: the database it works in, bounded runs of each
//! test on a thread of its own (each with its own current-thread runtime,
//! as an application would have), child processes that are always killed,
//! and small helpers.

#![allow(dead_code)]

mod netcut;
mod proc;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fenced_lock::tokio_postgres::Config;
use fenced_lock::{Connection, Locker};
pub use netcut::{heal_all_cuts, NetCut};
use proc::kill_all_children;
pub use proc::{Proc, J};

pub const DB: &str = "fl_client_rust";
pub const APP_ROLE: &str = "fl_client_rust_app";
pub const NOEXEC_ROLE: &str = "fl_client_rust_noexec";
const PASSWORD: &str = "fl_client_rust";

/// What every test gets.
pub struct Ctx {
    /// Superuser, database `postgres` (FL_DSN).
    pub admin_dsn: String,
    /// Superuser, the suite's database.
    pub dsn: String,
    /// The application role (EXECUTE on the functions, writes to the tables).
    pub app_dsn: String,
    /// A role that may connect and nothing else.
    pub noexec_dsn: String,
    /// The extension's version in the suite's database.
    pub version: (u32, u32, u32),
    examples: PathBuf,
}

/// A test asks to be skipped, with the reason (reported, not a failure).
pub struct Skip(pub String);

/// A panic a test causes on purpose (not printed).
pub struct Intended(pub &'static str);

pub fn skip(reason: impl Into<String>) -> ! {
    std::panic::panic_any(Skip(reason.into()))
}

impl Ctx {
    pub fn example(&self, name: &str) -> PathBuf {
        self.examples.join(name)
    }

    pub fn locker(&self) -> Locker {
        Locker::new(&self.dsn).expect("locker")
    }

    pub async fn admin(&self) -> Connection {
        connect(&self.dsn).await
    }

    pub fn at_least(&self, v: (u32, u32, u32), what: &str) {
        if self.version < v {
            skip(format!(
                "{what} needs fenced_lock {}.{}.{}; the server has {}.{}.{}",
                v.0, v.1, v.2, self.version.0, self.version.1, self.version.2
            ));
        }
    }
}

pub async fn connect(dsn: &str) -> Connection {
    Connection::connect(&Config::from_str(dsn).expect("dsn")).await.expect("connect")
}

fn with_user_and_db(dsn: &str, user: Option<&str>, db: &str) -> String {
    // postgresql://[user[:password]@]host[:port]/dbname[?params]
    let (scheme, rest) = dsn.split_once("://").expect("FL_DSN must be a postgresql:// URL");
    let (auth, hostpart) = match rest.rsplit_once('@') {
        Some((a, h)) => (Some(a), h),
        None => (None, rest),
    };
    let (hostport, params) = match hostpart.split_once('/') {
        Some((h, tail)) => (h, tail.split_once('?').map(|(_, p)| format!("?{p}")).unwrap_or_default()),
        None => (hostpart, String::new()),
    };
    let auth = match user {
        Some(u) => format!("{u}:{PASSWORD}@"),
        None => auth.map(|a| format!("{a}@")).unwrap_or_default(),
    };
    format!("{scheme}://{auth}{hostport}/{db}{params}")
}

pub fn setup() -> Result<Arc<Ctx>, String> {
    let admin_dsn =
        std::env::var("FL_DSN").map_err(|_| "FL_DSN is not set (a superuser postgresql:// URL)")?;
    let examples = match std::env::var_os("FL_EXAMPLES_DIR") {
        Some(d) => PathBuf::from(d),
        // target/<profile>/deps/suite-* -> target/<profile>/examples
        None => std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("examples"),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let admin = connect(&with_user_and_db(&admin_dsn, None, "postgres")).await;
        drop_database(&admin).await;
        admin.batch_execute(&format!("CREATE DATABASE {DB}")).await.map_err(|e| e.to_string())?;
        for role in [APP_ROLE, NOEXEC_ROLE] {
            admin
                .batch_execute(&format!(
                    "DO $$ BEGIN CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'; \
                     EXCEPTION WHEN duplicate_object THEN ALTER ROLE {role} LOGIN PASSWORD '{PASSWORD}'; END $$"
                ))
                .await
                .map_err(|e| e.to_string())?;
        }
        let dsn = with_user_and_db(&admin_dsn, None, DB);
        let db = connect(&dsn).await;
        db.batch_execute(&format!(
            "CREATE EXTENSION fenced_lock;
             CREATE TABLE inventory (item_id int PRIMARY KEY, stock int NOT NULL, fence_token bigint);
             CREATE TRIGGER inventory_fence BEFORE INSERT OR UPDATE OR DELETE ON inventory
               FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('inventory:{{item_id}}', 'fence_token');
             CREATE TABLE docs (id int PRIMARY KEY, body text, fence_token bigint);
             CREATE TRIGGER docs_fence BEFORE INSERT OR UPDATE OR DELETE ON docs
               FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('doc:{{id}}', 'fence_token');
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO {APP_ROLE};
             GRANT SELECT, INSERT, UPDATE ON inventory, docs TO {APP_ROLE};
             GRANT CONNECT ON DATABASE {DB} TO {APP_ROLE}, {NOEXEC_ROLE};"
        ))
        .await
        .map_err(|e| e.to_string())?;
        let v: String = db
            .query_one("SELECT extversion FROM pg_extension WHERE extname = 'fenced_lock'", &[])
            .await
            .map_err(|e| e.to_string())?
            .get(0);
        let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        Ok(Arc::new(Ctx {
            app_dsn: with_user_and_db(&admin_dsn, Some(APP_ROLE), DB),
            noexec_dsn: with_user_and_db(&admin_dsn, Some(NOEXEC_ROLE), DB),
            dsn,
            admin_dsn,
            version,
            examples,
        }))
    })
}

async fn drop_database(admin: &Connection) {
    let _ = admin
        .execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", &[&DB])
        .await;
    for _ in 0..50 {
        match admin.batch_execute(&format!("DROP DATABASE IF EXISTS {DB}")).await {
            Ok(()) => return,
            // A session that was just terminated may not have gone yet.
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

pub fn teardown(ctx: &Ctx) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let admin = connect(&with_user_and_db(&ctx.admin_dsn, None, "postgres")).await;
        drop_database(&admin).await;
        for role in [APP_ROLE, NOEXEC_ROLE] {
            let _ = admin.batch_execute(&format!("DROP ROLE IF EXISTS {role}")).await;
        }
    });
}

pub type TestFn = fn(Arc<Ctx>) -> Pin<Box<dyn Future<Output = ()>>>;

pub struct Test {
    pub name: &'static str,
    pub bound: Duration,
    pub f: TestFn,
}

enum Outcome {
    Passed,
    Skipped(String),
    Failed(String),
}

fn run_one(ctx: Arc<Ctx>, t: &Test) -> Outcome {
    let f = t.f;
    let bound = t.bound;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move { tokio::time::timeout(bound, f(ctx)).await })
    }));
    match r {
        Ok(Ok(())) => Outcome::Passed,
        Ok(Err(_)) => Outcome::Failed(format!("did not finish within its bound of {bound:?}")),
        Err(p) => {
            if let Some(Skip(reason)) = p.downcast_ref::<Skip>() {
                Outcome::Skipped(reason.clone())
            } else if let Some(s) = p.downcast_ref::<String>() {
                Outcome::Failed(s.clone())
            } else if let Some(s) = p.downcast_ref::<&str>() {
                Outcome::Failed(s.to_string())
            } else {
                Outcome::Failed("panicked".into())
            }
        }
    }
}

/// Runs the tests whose names contain one of the filters (all without
/// filters), `jobs` at a time; tears everything down; returns the exit code.
pub fn main(tests: &'static [Test]) -> std::process::ExitCode {
    let mut filters = Vec::new();
    let mut jobs = 4usize;
    let mut list = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--list" => list = true,
            "--jobs" | "--test-threads" => {
                jobs = args.next().and_then(|j| j.parse().ok()).unwrap_or(jobs).max(1)
            }
            a if a.starts_with("--test-threads=") => jobs = a[15..].parse().unwrap_or(jobs).max(1),
            // libtest options cargo may pass along: nothing to do here.
            a if a.starts_with('-') => {}
            f => filters.push(f.to_string()),
        }
    }
    let chosen: Vec<&'static Test> = tests
        .iter()
        .filter(|t| filters.is_empty() || filters.iter().any(|f| t.name.contains(f.as_str())))
        .collect();
    if list {
        for t in &chosen {
            println!("{}: test", t.name);
        }
        return std::process::ExitCode::SUCCESS;
    }
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        if p.downcast_ref::<Skip>().is_none() && p.downcast_ref::<Intended>().is_none() {
            default_hook(info);
        }
    }));
    if std::env::var_os("FL_DSN").is_none() {
        // `cargo test` without a server: say so (test.sh requires FL_DSN).
        println!("suite skipped: FL_DSN is not set (a superuser postgresql:// URL of database postgres)");
        return std::process::ExitCode::SUCCESS;
    }
    heal_all_cuts();
    let ctx = match setup() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("suite setup failed: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    println!(
        "running {} tests against fenced_lock {}.{}.{} ({} at a time)",
        chosen.len(),
        ctx.version.0,
        ctx.version.1,
        ctx.version.2,
        jobs
    );
    let started = Instant::now();
    let queue = Arc::new(Mutex::new(chosen.clone()));
    let results = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..jobs)
        .map(|_| {
            let (queue, results, ctx) = (queue.clone(), results.clone(), ctx.clone());
            std::thread::spawn(move || loop {
                let Some(t) = queue.lock().unwrap().pop() else { break };
                let t0 = Instant::now();
                let outcome = std::thread::Builder::new()
                    .name(t.name.to_string())
                    .spawn({
                        let ctx = ctx.clone();
                        move || run_one(ctx, t)
                    })
                    .unwrap()
                    .join()
                    .unwrap_or(Outcome::Failed("test thread died".into()));
                let took = t0.elapsed().as_secs_f64();
                match &outcome {
                    Outcome::Passed => println!("test {} ... ok ({took:.1} s)", t.name),
                    Outcome::Skipped(r) => println!("test {} ... skipped: {r}", t.name),
                    Outcome::Failed(m) => println!("test {} ... FAILED ({took:.1} s): {m}", t.name),
                }
                results.lock().unwrap().push((t.name, outcome));
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    kill_all_children();
    heal_all_cuts();
    teardown(&ctx);
    let results = results.lock().unwrap();
    let failed: Vec<_> =
        results.iter().filter(|(_, o)| matches!(o, Outcome::Failed(_))).map(|(n, _)| *n).collect();
    let skipped = results.iter().filter(|(_, o)| matches!(o, Outcome::Skipped(_))).count();
    println!(
        "\nsuite: {} passed, {} failed, {} skipped in {:.1} s",
        results.len() - failed.len() - skipped,
        failed.len(),
        skipped,
        started.elapsed().as_secs_f64()
    );
    if failed.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        println!("failed: {}", failed.join(", "));
        std::process::ExitCode::FAILURE
    }
}

/// Polls `cond` every 20 ms until it holds; panics after `within`.
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !cond().await {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Is `token` the live lease of `name`, asked on `c`.
pub async fn live(c: &Connection, name: &str, token: i64) -> bool {
    c.query_one("SELECT fenced_lock_validate($1, $2)", &[&name, &token]).await.unwrap().get(0)
}

/// Does backend `pid` exist (in pg_stat_activity).
pub async fn backend_exists(c: &Connection, pid: i32) -> bool {
    c.query_one("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", &[&pid])
        .await
        .unwrap()
        .get::<_, i64>(0)
        > 0
}

/// When the statement backend `pid` runs started, while it waits for a
/// heavyweight lock (a renew held up by another open change of the lease).
pub async fn waiting_on_a_lock_since(c: &Connection, pid: i32) -> Option<String> {
    c.query_opt(
        "SELECT query_start::text FROM pg_stat_activity \
         WHERE pid = $1 AND state = 'active' AND wait_event_type = 'Lock'",
        &[&pid],
    )
    .await
    .unwrap()
    .map(|r| r.get(0))
}

/// The text of the last statement of backend `pid`, and when it started.
pub async fn last_statement(c: &Connection, pid: i32) -> (String, String) {
    let r = c
        .query_one("SELECT query, query_start::text FROM pg_stat_activity WHERE pid = $1", &[&pid])
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

/// A unique lock name for this test.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}:{}:{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// A unique row id (docs.id, inventory.item_id).
pub fn unique_id() -> i32 {
    use std::sync::atomic::{AtomicI32, Ordering};
    static N: AtomicI32 = AtomicI32::new(1000);
    N.fetch_add(1, Ordering::Relaxed)
}
