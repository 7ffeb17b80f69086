//! Lock + unlock pairs: N clients, each its own connection and its own task,
//! each on names of its own (a pool of 1000), so clients never contend and
//! what is measured is the server's cost of a grant and a release.

use crate::{cpu_s, percentile, pg_connect, window, window_async, Line, Opts, Res};
use etcd_client::LockOptions;
use redis::IntoConnectionInfo;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;
use tokio_postgres::Statement;

/// Pairs per client before the clock starts: connection, prepared
/// statements, PL/pgSQL plan caches and Redis' script cache are warm.
const WARMUP: u64 = 20;

/// Compare-and-delete: release the key only if it still holds our value.
const CAS_DELETE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// acquire(name) -> token (NULL: not granted), release(name, token) -> bool
    Lease,
    /// two statements on the name, each writing one row
    Rows,
    /// pg_advisory_lock(client, n), pg_advisory_unlock(client, n) -> bool
    Advisory,
}

/// (shape, acquire, release) of each `pairs-pg --kind`.
fn pg_kind(kind: &str) -> Res<(Shape, &'static str, &'static str)> {
    Ok(match kind {
        "fenced" => {
            (Shape::Lease, "SELECT fenced_lock_try_acquire($1, '30 s')", "SELECT fenced_lock_release($1, $2)")
        }
        "plpgsql" => (
            Shape::Lease,
            "SELECT plpgsql_lease.try_acquire($1, '30 s')",
            "SELECT plpgsql_lease.release($1, $2)",
        ),
        // One durable commit per pair: the row is inserted and flushed (the
        // session runs with synchronous_commit off, the statement turns it on
        // for its own transaction), then deleted in a commit that is not
        // waited for. The floor for a grant that is flushed and a release
        // that is not.
        "floor1" => (
            Shape::Rows,
            "INSERT INTO bench_floor (name, token) \
             SELECT $1::text, 1 FROM (SELECT set_config('synchronous_commit', 'on', true)) durable",
            "DELETE FROM bench_floor WHERE name = $1",
        ),
        // Two durable commits per pair: insert the row, delete it.
        "floor2" => (
            Shape::Rows,
            "INSERT INTO bench_floor (name, token) VALUES ($1, 1)",
            "DELETE FROM bench_floor WHERE name = $1",
        ),
        "advisory" => {
            (Shape::Advisory, "SELECT pg_advisory_lock($1, $2)", "SELECT pg_advisory_unlock($1, $2)")
        }
        _ => return Err(format!("unknown --kind {kind}").into()),
    })
}

/// What a client task connects to; cloned into every task.
#[derive(Clone)]
enum Target {
    Pg { dsn: String, kind: String },
    Redis { port: u16 },
    Etcd { endpoint: String },
}

/// One client's connection.
enum Driver {
    Pg { db: tokio_postgres::Client, shape: Shape, acquire: Statement, release: Statement },
    Redis { con: redis::aio::MultiplexedConnection, sha: String },
    Etcd { etcd: Box<etcd_client::Client> },
}

impl Target {
    async fn connect(&self) -> Res<Driver> {
        Ok(match self {
            Target::Pg { dsn, kind } => {
                let (shape, acquire, release) = pg_kind(kind)?;
                let db = pg_connect(dsn).await?;
                if kind == "floor1" {
                    db.batch_execute("SET synchronous_commit = off").await?;
                }
                let (acquire, release) = (db.prepare(acquire).await?, db.prepare(release).await?);
                Driver::Pg { db, shape, acquire, release }
            }
            Target::Redis { port } => {
                // redis-rs leaves Nagle on by default; the PostgreSQL and gRPC
                // clients turn it off, so do the same here.
                let info = format!("redis://127.0.0.1:{port}/")
                    .into_connection_info()?
                    .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
                let mut con = redis::Client::open(info)?.get_multiplexed_async_connection().await?;
                let sha = redis::cmd("SCRIPT").arg("LOAD").arg(CAS_DELETE).query_async(&mut con).await?;
                Driver::Redis { con, sha }
            }
            Target::Etcd { endpoint } => Driver::Etcd {
                etcd: Box::new(etcd_client::Client::connect([endpoint.as_str()], None).await?),
            },
        })
    }
}

impl Driver {
    /// Take name `n` of client `c` (30 s ttl), then let it go; `i` makes the
    /// Redis value unique per pair.
    async fn pair(&mut self, c: u32, n: u32, i: u64) -> Res<()> {
        let name = format!("pair:{c}:{n}");
        match self {
            Driver::Pg { db, shape: Shape::Lease, acquire, release } => {
                let tok: Option<i64> = db.query_one(acquire, &[&name]).await?.get(0);
                let tok = tok.ok_or("not granted")?;
                let ok: bool = db.query_one(release, &[&name, &tok]).await?.get(0);
                ok.then_some(()).ok_or("release refused")?;
            }
            Driver::Pg { db, shape: Shape::Rows, acquire, release } => {
                let ins = db.execute(acquire, &[&name]).await?;
                let del = db.execute(release, &[&name]).await?;
                (ins == 1 && del == 1).then_some(()).ok_or("row not inserted or deleted")?;
            }
            Driver::Pg { db, shape: Shape::Advisory, acquire, release } => {
                let (c, n) = (c as i32, n as i32);
                db.execute(acquire, &[&c, &n]).await?;
                let ok: bool = db.query_one(release, &[&c, &n]).await?.get(0);
                ok.then_some(()).ok_or("unlock refused")?;
            }
            Driver::Redis { con, sha } => {
                let val = format!("{c}:{i}");
                let set: Option<String> = redis::cmd("SET")
                    .arg(&name)
                    .arg(&val)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(con)
                    .await?;
                let del: i64 =
                    redis::cmd("EVALSHA").arg(&*sha).arg(1).arg(&name).arg(&val).query_async(con).await?;
                (set.is_some() && del == 1).then_some(()).ok_or("not set or not deleted")?;
            }
            Driver::Etcd { etcd } => {
                // The Lock RPC's lock lives as long as its lease: one lease per pair.
                let lease = etcd.lease_grant(30, None).await?.id();
                let key = etcd.lock(name, Some(LockOptions::new().with_lease(lease))).await?.key().to_vec();
                etcd.unlock(key).await?;
                etcd.lease_revoke(lease).await?;
            }
        }
        Ok(())
    }
}

/// A small xorshift: names at random from the client's pool, no dependency.
struct Rng(u64);

impl Rng {
    fn pick(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as u32 + 1
    }
}

struct ClientRun {
    lat_ms: Vec<f64>,
    errors: u64,
    last_error: Option<String>,
    finished: Instant,
    /// the connection, kept open until the measured window has closed
    _conn: Option<Box<dyn std::any::Any + Send>>,
}

/// Every client's setup done (ready), then the clock starts (go): between the
/// two, the measured window opens.
struct Start<B> {
    ready: B,
    go: B,
}

async fn client(
    target: Target,
    c: u32,
    start: Arc<Start<Barrier>>,
    seconds: f64,
    count: u64,
) -> Res<ClientRun> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (u64::from(c) + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    let setup = async {
        let mut d = target.connect().await?;
        for i in 0..WARMUP {
            d.pair(c, rng.pick(1000), i).await?;
        }
        Res::Ok(d)
    }
    .await;
    start.ready.wait().await; // even after a failed setup, so that nobody waits forever
    start.go.wait().await;
    let mut d = setup?;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut run =
        ClientRun { lat_ms: Vec::new(), errors: 0, last_error: None, finished: Instant::now(), _conn: None };
    let mut i = WARMUP;
    while if count > 0 { i - WARMUP < count } else { Instant::now() < deadline } {
        let t0 = Instant::now();
        match d.pair(c, rng.pick(1000), i).await {
            Ok(()) => run.lat_ms.push(t0.elapsed().as_secs_f64() * 1e3),
            Err(e) => {
                run.errors += 1;
                run.last_error = Some(e.to_string());
                if run.errors >= 100 {
                    break; // broken, not slow: stop and let the caller see it
                }
            }
        }
        i += 1;
    }
    run.finished = Instant::now();
    run._conn = Some(Box::new(d));
    Ok(run)
}

pub async fn run(cmd: &str, o: &Opts) -> Res<()> {
    let (target, kind) = match cmd {
        "pairs-pg" => {
            let kind = o.str("kind")?.to_string();
            pg_kind(&kind)?;
            (Target::Pg { dsn: o.str("dsn")?.into(), kind: kind.clone() }, kind)
        }
        "pairs-redis" => (Target::Redis { port: o.num("port", 6390)? }, "redis".into()),
        _ => (Target::Etcd { endpoint: o.str_or("endpoint", "http://127.0.0.1:2390").into() }, "etcd".into()),
    };
    let clients: u32 = o.num("clients", 1)?;
    let seconds: f64 = o.num("seconds", 4.0)?;
    let count: u64 = o.num("count", 0)?;

    let n = clients as usize + 1;
    let start = Arc::new(Start { ready: Barrier::new(n), go: Barrier::new(n) });
    let tasks: Vec<_> = (0..clients)
        .map(|c| tokio::spawn(client(target.clone(), c, start.clone(), seconds, count)))
        .collect();
    start.ready.wait().await;
    window_async("start")?;
    let cpu0 = cpu_s();
    start.go.wait().await;
    let t0 = Instant::now();
    let mut runs = Vec::new();
    for t in tasks {
        runs.push(t.await??);
    }
    let cpu = cpu_s() - cpu0;
    window_async("end")?;
    report(&kind, clients, t0, &runs, cpu);
    Ok(())
}

/// The JSON line of a pairs run: pairs/s over the time to the last client's
/// end, p50/p99 of a pair, count and errors.
fn report(kind: &str, clients: u32, t0: Instant, runs: &[ClientRun], cpu: f64) {
    let elapsed = runs.iter().map(|r| r.finished).max().unwrap_or(t0) - t0;
    let mut lat: Vec<f64> = runs.iter().flat_map(|r| r.lat_ms.iter().copied()).collect();
    lat.sort_by(f64::total_cmp);
    let errors: u64 = runs.iter().map(|r| r.errors).sum();
    let mut line = Line::default()
        .s("kind", kind)
        .raw("clients", clients)
        .n("seconds", elapsed.as_secs_f64())
        .raw("count", lat.len())
        .raw("warmup", WARMUP * u64::from(clients))
        .raw("window_ops", lat.len())
        .raw("total_ops", lat.len() as u64 + WARMUP * u64::from(clients))
        .n("client_cpu_s", cpu)
        .n("per_s", lat.len() as f64 / elapsed.as_secs_f64())
        .n("p50_ms", percentile(&lat, 50.0))
        .n("p99_ms", percentile(&lat, 99.0))
        .raw("errors", errors);
    if let Some(e) = runs.iter().find_map(|r| r.last_error.as_deref()) {
        line = line.s("error", e);
    }
    line.print();
}

/// `pairs-redis --client sync`: the lightest Redis client there is in Rust,
/// so that the Redis rows are not held back by their client: each client an
/// OS thread with a blocking connection (redis-rs, no runtime, no
/// multiplexer), the same two commands as above.
pub fn run_redis_sync(o: &Opts) -> Res<()> {
    let port: u16 = o.num("port", 6390)?;
    let clients: u32 = o.num("clients", 1)?;
    let seconds: f64 = o.num("seconds", 4.0)?;
    let count: u64 = o.num("count", 0)?;
    let n = clients as usize + 1;
    let start = Arc::new(Start { ready: std::sync::Barrier::new(n), go: std::sync::Barrier::new(n) });
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let start = start.clone();
            std::thread::spawn(move || redis_sync_client(port, c, &start, seconds, count))
        })
        .collect();
    start.ready.wait();
    window("start")?;
    let cpu0 = cpu_s();
    start.go.wait();
    let t0 = Instant::now();
    let runs: Vec<ClientRun> =
        threads.into_iter().map(|t| t.join().expect("client thread panicked")).collect::<Res<_>>()?;
    let cpu = cpu_s() - cpu0;
    window("end")?;
    report("redis-sync", clients, t0, &runs, cpu);
    Ok(())
}

fn redis_sync_client(
    port: u16,
    c: u32,
    start: &Start<std::sync::Barrier>,
    seconds: f64,
    count: u64,
) -> Res<ClientRun> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (u64::from(c) + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    let pair = |con: &mut redis::Connection, sha: &str, n: u32, i: u64| -> Res<()> {
        let (name, val) = (format!("pair:{c}:{n}"), format!("{c}:{i}"));
        let set: Option<String> =
            redis::cmd("SET").arg(&name).arg(&val).arg("NX").arg("PX").arg(30_000).query(con)?;
        let del: i64 = redis::cmd("EVALSHA").arg(sha).arg(1).arg(&name).arg(&val).query(con)?;
        (set.is_some() && del == 1).then_some(()).ok_or_else(|| "not set or not deleted".into())
    };
    let setup = (|| {
        let info = format!("redis://127.0.0.1:{port}/")
            .into_connection_info()?
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let mut con = redis::Client::open(info)?.get_connection()?;
        let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(CAS_DELETE).query(&mut con)?;
        for i in 0..WARMUP {
            pair(&mut con, &sha, rng.pick(1000), i)?;
        }
        Res::Ok((con, sha))
    })();
    start.ready.wait(); // even after a failed setup, so that nobody waits forever
    start.go.wait();
    let (mut con, sha) = setup?;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut run =
        ClientRun { lat_ms: Vec::new(), errors: 0, last_error: None, finished: Instant::now(), _conn: None };
    let mut i = WARMUP;
    while if count > 0 { i - WARMUP < count } else { Instant::now() < deadline } {
        let t0 = Instant::now();
        match pair(&mut con, &sha, rng.pick(1000), i) {
            Ok(()) => run.lat_ms.push(t0.elapsed().as_secs_f64() * 1e3),
            Err(e) => {
                run.errors += 1;
                run.last_error = Some(e.to_string());
                if run.errors >= 100 {
                    break;
                }
            }
        }
        i += 1;
    }
    run.finished = Instant::now();
    run._conn = Some(Box::new(con));
    Ok(run)
}
