//! flbench: the compiled client behind bench/ (see bench/README.md), so that
//! fenced_lock and every peer are driven the same way and the figures measure
//! the servers, not the client. Every subcommand prints one JSON line.
//!
//!   pairs-pg     --dsn D --kind fenced|plpgsql|floor1|floor2|advisory
//!   pairs-redis  --port P [--client async|sync]
//!   pairs-etcd   --endpoint http://127.0.0.1:2390
//!                (all three: --clients N --seconds S, or --count C pairs per client)
//!   sale         --row R --dsn D ... (the end-to-end critical section, src/sale.rs)
//!   handoff      --dsn D --waiters N --trials T [--method queue|backoff]
//!   idle-cpu     --dsn D --waiters N --seconds S [--method queue|backoff]
//!   session-kill --dsn D --trials T
//!   hold         --dsn D --name X     (session-kill's holder process)

mod pairs;
mod pq;
mod sale;
mod waiting;

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Res<T> = Result<T, Error>;

/// The `--key value` options after the subcommand.
pub struct Opts(HashMap<String, String>);

impl Opts {
    fn parse(args: &[String]) -> Res<Self> {
        let mut m = HashMap::new();
        let mut it = args.iter();
        while let Some(k) = it.next() {
            let key = k.strip_prefix("--").ok_or_else(|| format!("expected --option, got {k}"))?;
            let v = it.next().ok_or_else(|| format!("--{key} needs a value"))?;
            m.insert(key.to_string(), v.clone());
        }
        Ok(Opts(m))
    }

    pub fn str(&self, key: &str) -> Res<&str> {
        self.0.get(key).map(String::as_str).ok_or_else(|| format!("missing --{key}").into())
    }

    pub fn str_or<'a>(&'a self, key: &str, default: &'a str) -> &'a str {
        self.0.get(key).map_or(default, String::as_str)
    }

    pub fn num<T: std::str::FromStr>(&self, key: &str, default: T) -> Res<T> {
        match self.0.get(key) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| format!("bad --{key} {v}").into()),
        }
    }
}

/// Nearest-rank percentile of sorted values (the definition benchlib.py uses).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let k = ((p / 100.0 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[k - 1]
}

/// Wall clock in seconds since the epoch: the same clock as the server's
/// clock_timestamp() on this machine, so the two can be subtracted.
pub fn epoch_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// One JSON object on one line, built field by field.
#[derive(Default)]
pub struct Line(Vec<String>);

impl Line {
    pub fn s(mut self, k: &str, v: &str) -> Self {
        let esc: String = v
            .chars()
            .flat_map(|c| match c {
                '"' | '\\' => vec!['\\', c],
                c if (c as u32) < 0x20 => format!("\\u{:04x}", c as u32).chars().collect(),
                c => vec![c],
            })
            .collect();
        self.0.push(format!("\"{k}\": \"{esc}\""));
        self
    }

    pub fn n(mut self, k: &str, v: f64) -> Self {
        // JSON has no NaN: a missing figure is null.
        let v = if v.is_finite() { format!("{v}") } else { "null".into() };
        self.0.push(format!("\"{k}\": {v}"));
        self
    }

    pub fn raw(mut self, k: &str, v: impl std::fmt::Display) -> Self {
        self.0.push(format!("\"{k}\": {v}"));
        self
    }

    pub fn print(self) {
        println!("{{{}}}", self.0.join(", "));
    }
}

/// The measured window (FLBENCH_WINDOW=1, set by bench/costs.py): say on
/// stdout where it starts and where it ends, and each time wait for a line on
/// stdin, the bench's word that it has read the servers' counters. The costs
/// then cover the measured operations only, not the connections, the warm-up
/// or the exit. Without the variable it does nothing.
pub fn window(edge: &str) -> Res<()> {
    use std::io::{BufRead, Write};
    if std::env::var_os("FLBENCH_WINDOW").is_none() {
        return Ok(());
    }
    println!("window {edge}");
    std::io::stdout().flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(())
}

/// The same from async code: the runtime's other tasks go on meanwhile.
pub fn window_async(edge: &str) -> Res<()> {
    tokio::task::block_in_place(|| window(edge))
}

#[repr(C)]
struct Rusage {
    utime: [i64; 2],
    stime: [i64; 2],
    rest: [i64; 14],
}

extern "C" {
    fn getrusage(who: i32, usage: *mut Rusage) -> i32;
}

/// CPU time (user + system) of this process so far, every thread, in s.
pub fn cpu_s() -> f64 {
    let mut u = Rusage { utime: [0; 2], stime: [0; 2], rest: [0; 14] };
    // SAFETY: RUSAGE_SELF (0) into a struct of the kernel's layout on
    // 64-bit Linux (two timevals, fourteen longs).
    if unsafe { getrusage(0, &mut u) } != 0 {
        return f64::NAN;
    }
    let tv = |t: [i64; 2]| t[0] as f64 + t[1] as f64 / 1e6;
    tv(u.utime) + tv(u.stime)
}

/// A PostgreSQL connection whose protocol task runs on its own.
pub async fn pg_connect(dsn: &str) -> Res<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            eprintln!("flbench: connection: {e}");
        }
    });
    Ok(client)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cmd = args.first().map_or("", String::as_str);
    let res = match Opts::parse(args.get(1..).unwrap_or_default()) {
        Err(e) => Err(e),
        Ok(o) => match cmd {
            "pairs-redis" if o.str_or("client", "async") == "sync" => pairs::run_redis_sync(&o),
            "pairs-pg" | "pairs-redis" | "pairs-etcd" => pairs::run(cmd, &o).await,
            // Blocking threads of its own, off the runtime's workers.
            "sale" => {
                tokio::task::spawn_blocking(move || sale::run(&o)).await.unwrap_or_else(|e| Err(e.into()))
            }
            "handoff" => waiting::handoff(&o).await,
            "idle-cpu" => waiting::idle_cpu(&o).await,
            "session-kill" => waiting::session_kill(&o).await,
            "hold" => waiting::hold(&o).await,
            _ => {
                Err("usage: flbench pairs-pg|pairs-redis|pairs-etcd|sale|handoff|idle-cpu|session-kill|hold \
                      --option value ... (see src/main.rs)"
                    .into())
            }
        },
    };
    if let Err(e) = res {
        eprintln!("flbench {cmd}: {e}");
        std::process::exit(1);
    }
}
