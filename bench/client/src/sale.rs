//! The end-to-end critical section (bench/e2e.py): the job users run. Each
//! worker is an OS thread with its own blocking connections (libpq, and the
//! row's lock service) and loops: take the item's lock, read its stock,
//! write stock - 1, let the lock go. One in `--pause-one-in` critical
//! sections sleeps `--pause-ms` between its read and its write, as a GC
//! pause would, so that a lease can run out under a holder that keeps going.
//!
//!   sale --row fenced3|fenced1|redis|redis_fence|etcd|plpgsql|forupdate
//!        --dsn D [--redis-port 6390] [--etcd http://127.0.0.1:2390]
//!        --workers N --items K (--seconds S | --count C per worker)
//!        [--ttl-ms 30000] [--pause-one-in 0] [--pause-ms 1500] [--max-pauses 0]
//!
//! A sale is acknowledged when its write committed; a write refused because
//! the lock was lost (FL001, or the app-side fence matching no row) is not a
//! sale: the worker takes the lock again, reads again and writes again. The
//! JSON line gives the acknowledged sales of every item, which e2e.py checks
//! against the stock the table has left.

use crate::pq::{Pg, PgError};
use crate::{cpu_s, percentile, window, Line, Opts, Res};
use redis::IntoConnectionInfo;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

/// Sales per worker before the clock starts: connections, prepared
/// statements, PL/pgSQL plan caches and Redis' script cache are warm.
const WARMUP: u64 = 3;
/// How often a client polls a lock that is held (Redis, the PL/pgSQL table).
const POLL: Duration = Duration::from_millis(1);

/// Compare-and-delete: release the key only if it still holds our value.
const CAS_DELETE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
/// The lock and its fencing token in one round trip (one AOF fsync): SET NX
/// PX, and if granted, the next value of a counter that only grows.
const LOCK_AND_TOKEN: &str = "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
                              return redis.call('incr', KEYS[2]) else return false end";

#[derive(Clone, Copy, PartialEq)]
enum Row {
    Fenced3,
    Fenced1,
    Redis,
    RedisFence,
    Etcd,
    Plpgsql,
    ForUpdate,
}

impl Row {
    fn parse(s: &str) -> Res<Row> {
        Ok(match s {
            "fenced3" => Row::Fenced3,
            "fenced1" => Row::Fenced1,
            "redis" => Row::Redis,
            "redis_fence" => Row::RedisFence,
            "etcd" => Row::Etcd,
            "plpgsql" => Row::Plpgsql,
            "forupdate" => Row::ForUpdate,
            _ => return Err(format!("unknown --row {s}").into()),
        })
    }
}

#[derive(Clone)]
struct Cfg {
    row: Row,
    name: String,
    dsn: String,
    redis_port: u16,
    etcd: String,
    items: u32,
    seconds: f64,
    count: u64,
    ttl_ms: u64,
    pause_one_in: u32,
    pause_ms: u64,
    max_pauses: u64,
}

/// What the worker threads share.
struct Shared {
    cfg: Cfg,
    /// every worker's setup and warm-up done; then the clock starts
    ready: Barrier,
    go: Barrier,
    pauses: AtomicU64,
    /// etcd: each worker's lease, kept alive by the keep-alive thread unless
    /// the worker is in its pause (a paused process renews nothing).
    leases: Vec<Mutex<Slot>>,
}

#[derive(Default, Clone, Copy)]
struct Slot {
    lease: i64,
    paused: bool,
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(n)) as u32
    }
}

enum Outcome {
    Sold,
    /// the write was refused: the lock had been lost
    FencedOff,
}

/// The row's lock service, besides PostgreSQL.
enum Peer {
    None,
    Redis { con: redis::Connection, del: String, lock: String },
    Etcd { rt: tokio::runtime::Runtime, client: Box<etcd_client::Client> },
}

struct Worker {
    id: usize,
    sh: Arc<Shared>,
    pg: Pg,
    peer: Peer,
    rng: Rng,
    seq: u64,
    ttl: String,
    fenced_off: u64,
    late_releases: u64,
    pauses: u64,
}

fn pg_err(e: PgError) -> crate::Error {
    Box::new(e)
}

impl Worker {
    fn connect(id: usize, sh: Arc<Shared>) -> Res<Worker> {
        let cfg = &sh.cfg;
        let mut pg = Pg::connect(&cfg.dsn)?;
        let t = &cfg.name;
        let (read, write) = match cfg.row {
            Row::ForUpdate => (
                format!("SELECT stock FROM {t} WHERE item = $1 FOR UPDATE"),
                format!("UPDATE {t} SET stock = $1 WHERE item = $2"),
            ),
            Row::Fenced3 | Row::Fenced1 => (
                format!("SELECT stock FROM {t} WHERE item = $1"),
                format!("UPDATE {t} SET stock = $1, fence = $2 WHERE item = $3"),
            ),
            Row::RedisFence => (
                format!("SELECT stock FROM {t} WHERE item = $1"),
                format!("UPDATE {t} SET stock = $1, fence = $2 WHERE item = $3 AND fence < $2"),
            ),
            _ => (
                format!("SELECT stock FROM {t} WHERE item = $1"),
                format!("UPDATE {t} SET stock = $1 WHERE item = $2"),
            ),
        };
        pg.prepare("read", &read)?;
        pg.prepare("write", &write)?;
        match cfg.row {
            Row::Fenced3 | Row::Fenced1 => {
                pg.prepare("acquire", "SELECT fenced_lock_acquire($1, $2::interval, '60 s')")?;
                pg.prepare("release", "SELECT fenced_lock_release($1, $2)")?;
            }
            Row::Plpgsql => {
                pg.prepare("acquire", "SELECT plpgsql_lease.try_acquire($1, $2::interval)")?;
                pg.prepare("release", "SELECT plpgsql_lease.release($1, $2)")?;
            }
            _ => {}
        }
        let peer = match cfg.row {
            Row::Redis | Row::RedisFence => {
                // redis-rs leaves Nagle on by default; libpq turns it off.
                let info = format!("redis://127.0.0.1:{}/", cfg.redis_port)
                    .into_connection_info()?
                    .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
                let mut con = redis::Client::open(info)?.get_connection()?;
                let del = redis::cmd("SCRIPT").arg("LOAD").arg(CAS_DELETE).query(&mut con)?;
                let lock = redis::cmd("SCRIPT").arg("LOAD").arg(LOCK_AND_TOKEN).query(&mut con)?;
                Peer::Redis { con, del, lock }
            }
            Row::Etcd => {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                let mut client =
                    Box::new(rt.block_on(etcd_client::Client::connect([cfg.etcd.as_str()], None))?);
                let lease = rt.block_on(client.lease_grant(etcd_ttl(cfg.ttl_ms), None))?.id();
                sh.leases[id].lock().unwrap().lease = lease;
                Peer::Etcd { rt, client }
            }
            _ => Peer::None,
        };
        let seed = 0x9E37_79B9_7F4A_7C15 ^ (id as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let ttl = format!("{} ms", cfg.ttl_ms);
        Ok(Worker {
            id,
            sh,
            pg,
            peer,
            rng: Rng(seed),
            seq: 0,
            ttl,
            fenced_off: 0,
            late_releases: 0,
            pauses: 0,
        })
    }

    /// Whether this critical section is the one in `pause_one_in` that stalls.
    fn pause_now(&mut self, measured: bool) -> bool {
        let cfg = &self.sh.cfg;
        if !measured || cfg.pause_one_in == 0 || self.rng.below(cfg.pause_one_in) != 0 {
            return false;
        }
        if cfg.max_pauses > 0 && self.sh.pauses.fetch_add(1, Relaxed) >= cfg.max_pauses {
            return false;
        }
        true
    }

    fn pause(&mut self) {
        self.pauses += 1;
        let slot = &self.sh.leases[self.id];
        slot.lock().unwrap().paused = true;
        std::thread::sleep(Duration::from_millis(self.sh.cfg.pause_ms));
        slot.lock().unwrap().paused = false;
    }

    fn read(&mut self, item: &str) -> Res<i64> {
        self.pg.exec("read", &[Some(item)])?.i64(0)?.ok_or_else(|| format!("no item {item}").into())
    }

    /// The guarded or fenced write; Ok(false) if it was refused because the
    /// lock was lost.
    fn write(&mut self, stock: i64, token: Option<i64>, item: &str) -> Res<bool> {
        let s = (stock - 1).to_string();
        let res = match token {
            Some(t) => self.pg.exec("write", &[Some(&s), Some(&t.to_string()), Some(item)]),
            None => self.pg.exec("write", &[Some(&s), Some(item)]),
        };
        match res {
            Ok(r) if r.affected == 1 => Ok(true),
            Ok(_) if self.sh.cfg.row == Row::RedisFence => Ok(false), // a larger token wrote since
            Ok(r) => Err(format!("the write changed {} rows", r.affected).into()),
            Err(e) if e.sqlstate == "FL001" => Ok(false),
            Err(e) => Err(pg_err(e)),
        }
    }

    /// A release that finds the lease gone: expected only after a pause.
    fn released(&mut self, ok: bool, paused: bool) -> Res<()> {
        if !ok {
            if !paused && self.sh.cfg.ttl_ms >= 10_000 {
                return Err("release refused".into());
            }
            self.late_releases += 1;
        }
        Ok(())
    }

    fn attempt(&mut self, item: u32, measured: bool) -> Res<Outcome> {
        let row = self.sh.cfg.row;
        let it = item.to_string();
        let pause = self.pause_now(measured);
        match row {
            Row::Fenced3 | Row::Plpgsql => {
                let name = format!("{}:{item}", self.sh.cfg.name);
                let tok = loop {
                    let t = self.pg.exec("acquire", &[Some(&name), Some(&self.ttl)])?.i64(0)?;
                    match t {
                        Some(t) => break t,
                        None if row == Row::Plpgsql => std::thread::sleep(POLL),
                        None => return Err("fenced_lock_acquire: the 60 s wait ran out".into()),
                    }
                };
                let stock = self.read(&it)?;
                if pause {
                    self.pause();
                }
                let wrote = self.write(stock, (row == Row::Fenced3).then_some(tok), &it)?;
                let ok =
                    self.pg.exec("release", &[Some(&name), Some(&tok.to_string())])?.bool(0) == Some(true);
                if !wrote {
                    return Ok(Outcome::FencedOff);
                }
                self.released(ok, pause)?;
            }
            Row::Fenced1 => {
                let name = format!("{}:{item}", self.sh.cfg.name);
                self.pg.simple("BEGIN")?;
                let tok = self.pg.exec("acquire", &[Some(&name), Some(&self.ttl)])?.i64(0)?;
                let tok = tok.ok_or("fenced_lock_acquire: the 60 s wait ran out")?;
                let stock = self.read(&it)?;
                if pause {
                    self.pause();
                }
                if !self.write(stock, Some(tok), &it)? {
                    self.pg.simple("ROLLBACK")?;
                    return Ok(Outcome::FencedOff);
                }
                let ok =
                    self.pg.exec("release", &[Some(&name), Some(&tok.to_string())])?.bool(0) == Some(true);
                match self.pg.simple("COMMIT") {
                    Ok(_) => {}
                    Err(e) if e.sqlstate == "FL001" => return Ok(Outcome::FencedOff),
                    Err(e) => return Err(pg_err(e)),
                }
                self.released(ok, pause)?;
            }
            Row::ForUpdate => {
                self.pg.simple("BEGIN")?;
                let stock = self.read(&it)?;
                if pause {
                    self.pause();
                }
                self.write(stock, None, &it)?;
                self.pg.simple("COMMIT")?;
            }
            Row::Redis | Row::RedisFence => {
                self.seq += 1;
                let (key, val) =
                    (format!("{}:{item}", self.sh.cfg.name), format!("{}:{}", self.id, self.seq));
                let ttl_ms = self.sh.cfg.ttl_ms;
                let Peer::Redis { con, del, lock } = &mut self.peer else { unreachable!() };
                let tok = loop {
                    let got: Option<i64> = if row == Row::Redis {
                        let set: Option<String> = redis::cmd("SET")
                            .arg(&key)
                            .arg(&val)
                            .arg("NX")
                            .arg("PX")
                            .arg(ttl_ms)
                            .query(con)?;
                        set.map(|_| 0)
                    } else {
                        redis::cmd("EVALSHA")
                            .arg(&*lock)
                            .arg(2)
                            .arg(&key)
                            .arg("sale:fence")
                            .arg(&val)
                            .arg(ttl_ms)
                            .query(con)?
                    };
                    match got {
                        Some(t) => break t,
                        None => std::thread::sleep(POLL),
                    }
                };
                let del = del.clone();
                let stock = self.read(&it)?;
                if pause {
                    self.pause();
                }
                let wrote = self.write(stock, (row == Row::RedisFence).then_some(tok), &it)?;
                let Peer::Redis { con, .. } = &mut self.peer else { unreachable!() };
                let n: i64 = redis::cmd("EVALSHA").arg(&del).arg(1).arg(&key).arg(&val).query(con)?;
                if !wrote {
                    return Ok(Outcome::FencedOff);
                }
                self.released(n == 1, pause)?;
            }
            Row::Etcd => {
                let name = format!("{}/{item}", self.sh.cfg.name);
                let key = loop {
                    let lease = self.sh.leases[self.id].lock().unwrap().lease;
                    let Peer::Etcd { rt, client } = &mut self.peer else { unreachable!() };
                    let opts = etcd_client::LockOptions::new().with_lease(lease);
                    match rt.block_on(client.lock(name.as_str(), Some(opts))) {
                        Ok(r) => break r.key().to_vec(),
                        // The lease ran out (a pause outlasted it): a new one, as a
                        // concurrency.Session would after losing its lease.
                        Err(e) if lease_ran_out(&e) => {
                            let id =
                                rt.block_on(client.lease_grant(etcd_ttl(self.sh.cfg.ttl_ms), None))?.id();
                            self.sh.leases[self.id].lock().unwrap().lease = id;
                        }
                        Err(e) => return Err(e.into()),
                    }
                };
                let stock = self.read(&it)?;
                if pause {
                    self.pause();
                }
                self.write(stock, None, &it)?;
                let Peer::Etcd { rt, client } = &mut self.peer else { unreachable!() };
                rt.block_on(client.unlock(key))?;
            }
        }
        Ok(Outcome::Sold)
    }

    /// One sale: attempts until a write is acknowledged.
    fn sale(&mut self, item: u32, measured: bool) -> Res<()> {
        loop {
            match self.attempt(item, measured)? {
                Outcome::Sold => return Ok(()),
                Outcome::FencedOff => self.fenced_off += 1,
            }
        }
    }
}

/// etcd leases are whole seconds.
/// etcd's answer for a lease that ran out (a pause outlasted it).
fn lease_ran_out(e: &etcd_client::Error) -> bool {
    e.to_string().contains("lease not found")
}

fn etcd_ttl(ttl_ms: u64) -> i64 {
    ttl_ms.div_ceil(1000).max(1) as i64
}

struct WorkerRun {
    lat_ms: Vec<f64>,
    acks: Vec<u64>,
    fenced_off: u64,
    late_releases: u64,
    pauses: u64,
    error: Option<String>,
    finished: Instant,
    /// the worker and its connections, kept until the measured window has closed
    _keep: Option<Worker>,
}

fn worker(id: usize, sh: Arc<Shared>) -> WorkerRun {
    let items = sh.cfg.items;
    let mut run = WorkerRun {
        lat_ms: Vec::new(),
        acks: vec![0; items as usize],
        fenced_off: 0,
        late_releases: 0,
        pauses: 0,
        error: None,
        finished: Instant::now(),
        _keep: None,
    };
    let setup = Worker::connect(id, sh.clone()).and_then(|mut w| {
        for _ in 0..WARMUP {
            let item = w.rng.below(items) + 1;
            w.sale(item, false)?;
            run.acks[item as usize - 1] += 1;
        }
        Ok(w)
    });
    sh.ready.wait(); // even after a failed setup, so that nobody waits forever
    sh.go.wait();
    let mut w = match setup {
        Ok(w) => w,
        Err(e) => {
            run.error = Some(e.to_string());
            return run;
        }
    };
    let deadline = Instant::now() + Duration::from_secs_f64(sh.cfg.seconds);
    let mut n = 0u64;
    while if sh.cfg.count > 0 { n < sh.cfg.count } else { Instant::now() < deadline } {
        let item = w.rng.below(items) + 1;
        let t0 = Instant::now();
        if let Err(e) = w.sale(item, true) {
            run.error = Some(e.to_string());
            break;
        }
        run.lat_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        run.acks[item as usize - 1] += 1;
        n += 1;
    }
    run.finished = Instant::now();
    (run.fenced_off, run.late_releases, run.pauses) = (w.fenced_off, w.late_releases, w.pauses);
    run._keep = Some(w);
    run
}

/// etcd: renew every worker's lease a third of its TTL before it would run
/// out, except a worker's that is in its pause; until `stop` hangs up.
fn keep_alive(sh: Arc<Shared>, stop: mpsc::Receiver<()>) -> Res<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut client = rt.block_on(etcd_client::Client::connect([sh.cfg.etcd.as_str()], None))?;
    let every = Duration::from_millis((sh.cfg.ttl_ms / 3).max(100));
    while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(every) {
        for slot in &sh.leases {
            let s = *slot.lock().unwrap();
            if s.lease != 0 && !s.paused {
                let kept = rt.block_on(async {
                    let (mut keeper, mut stream) = client.lease_keep_alive(s.lease).await?;
                    keeper.keep_alive().await?;
                    stream.message().await
                });
                match kept {
                    Ok(_) => {}
                    // The lease ran out before this round reached it (a pause
                    // just ended): its worker takes a new one at its next lock.
                    Err(e) if lease_ran_out(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(())
}

pub fn run(o: &Opts) -> Res<()> {
    let row = Row::parse(o.str("row")?)?;
    let cfg = Cfg {
        row,
        name: o.str("name")?.to_string(),
        dsn: o.str("dsn")?.to_string(),
        redis_port: o.num("redis-port", 6390)?,
        etcd: o.str_or("etcd", "http://127.0.0.1:2390").to_string(),
        items: o.num("items", 1)?,
        seconds: o.num("seconds", 5.0)?,
        count: o.num("count", 0)?,
        ttl_ms: o.num("ttl-ms", 30_000)?,
        pause_one_in: o.num("pause-one-in", 0)?,
        pause_ms: o.num("pause-ms", 1500)?,
        max_pauses: o.num("max-pauses", 0)?,
    };
    let workers: usize = o.num("workers", 1)?;
    if cfg.items == 0 || workers == 0 {
        return Err("--items and --workers must be at least 1".into());
    }
    let sh = Arc::new(Shared {
        cfg,
        ready: Barrier::new(workers + 1),
        go: Barrier::new(workers + 1),
        pauses: AtomicU64::new(0),
        leases: (0..workers).map(|_| Mutex::new(Slot::default())).collect(),
    });
    let (stop, stopped) = mpsc::channel();
    let keeper = (row == Row::Etcd).then(|| {
        let sh = sh.clone();
        std::thread::spawn(move || keep_alive(sh, stopped))
    });
    let threads: Vec<_> = (0..workers)
        .map(|id| {
            let sh = sh.clone();
            std::thread::spawn(move || worker(id, sh))
        })
        .collect();
    sh.ready.wait();
    window("start")?;
    let cpu0 = cpu_s();
    sh.go.wait();
    let t0 = Instant::now();
    let runs: Vec<WorkerRun> = threads.into_iter().map(|t| t.join().expect("worker panicked")).collect();
    let cpu = cpu_s() - cpu0;
    window("end")?;
    drop(stop);
    if let Some(k) = keeper {
        k.join().expect("keep-alive panicked")?;
    }
    let elapsed = runs.iter().map(|r| r.finished).max().unwrap_or(t0).saturating_duration_since(t0);
    if let Some(e) = runs.iter().find_map(|r| r.error.as_deref()) {
        return Err(format!("a worker failed: {e}").into());
    }
    let mut lat: Vec<f64> = runs.iter().flat_map(|r| r.lat_ms.iter().copied()).collect();
    lat.sort_by(f64::total_cmp);
    let mut acks = vec![0u64; sh.cfg.items as usize];
    for r in &runs {
        for (a, b) in acks.iter_mut().zip(&r.acks) {
            *a += b;
        }
    }
    let acks_json = format!("[{}]", acks.iter().map(u64::to_string).collect::<Vec<_>>().join(","));
    Line::default()
        .s("kind", "sale")
        .s("row", o.str("row")?)
        .raw("workers", workers)
        .raw("items", sh.cfg.items)
        .n("seconds", elapsed.as_secs_f64())
        .raw("count", lat.len())
        .n("per_s", lat.len() as f64 / elapsed.as_secs_f64())
        .n("p50_ms", percentile(&lat, 50.0))
        .n("p99_ms", percentile(&lat, 99.0))
        .raw("fenced_off", runs.iter().map(|r| r.fenced_off).sum::<u64>())
        .raw("late_releases", runs.iter().map(|r| r.late_releases).sum::<u64>())
        .raw("pauses", runs.iter().map(|r| r.pauses).sum::<u64>())
        .raw("warmup", WARMUP * workers as u64)
        .raw("window_ops", lat.len())
        .raw("total_ops", lat.len() as u64 + WARMUP * workers as u64)
        .n("client_cpu_s", cpu)
        .raw("acks", acks_json)
        .raw("errors", 0)
        .print();
    Ok(())
}
