//! The conformance example `hold` (clients/README.md): acquire with
//! keepalive, report every renew and a loss, hold, optionally write with
//! the token, release.
//!
//! hold --dsn DSN --name NAME --ttl SECONDS --hold SECONDS [--wait SECONDS]
//!      [--write TABLE:ID] [--session-bound] [--shared] [--permits N] [--holder TEXT]

#[path = "support/mod.rs"]
mod support;

use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use fenced_lock::{Error, LeaseState, Locker};
use support::{emit, emit_error, js, CommandLine};

const USAGE_TEXT: &str = "usage: hold --dsn DSN --name NAME --ttl SECONDS --hold SECONDS [--wait SECONDS] \
                          [--write TABLE:ID] [--session-bound] [--shared] [--permits N] [--holder TEXT]";

struct Args {
    dsn: String,
    name: String,
    ttl: f64,
    hold: f64,
    wait: Option<f64>,
    write: Option<(String, i64)>,
    session_bound: bool,
    shared: bool,
    permits: i64,
    holder: Option<String>,
}

fn parse() -> Result<Args, String> {
    let cl = CommandLine::parse(
        &["dsn", "name", "ttl", "hold", "wait", "write", "permits", "holder"],
        &["session-bound", "shared"],
    )?;
    let write = match cl.optional("write") {
        None => None,
        Some(w) => {
            let (table, id) = w.rsplit_once(':').ok_or_else(|| format!("--write {w:?} is not TABLE:ID"))?;
            // The table name goes into the statement as it is: only a plain
            // (optionally schema-qualified) identifier.
            let plain = !table.is_empty()
                && table.split('.').all(|p| {
                    !p.is_empty()
                        && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                        && !p.starts_with(|c: char| c.is_ascii_digit())
                });
            if !plain {
                return Err(format!("--write: {table:?} is not a table name"));
            }
            Some((table.to_string(), cl.number::<i64>("write", id)?))
        }
    };
    Ok(Args {
        dsn: cl.required("dsn")?.to_string(),
        name: cl.required("name")?.to_string(),
        ttl: cl.number("ttl", cl.required("ttl")?)?,
        hold: cl.number("hold", cl.required("hold")?)?,
        wait: cl.optional("wait").map(|w| cl.number("wait", w)).transpose()?,
        write,
        session_bound: cl.switch("session-bound"),
        shared: cl.switch("shared"),
        permits: cl.optional("permits").map(|p| cl.number("permits", p)).transpose()?.unwrap_or(1),
        holder: cl.optional("holder").map(str::to_string),
    })
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(m) => {
            eprintln!("hold: {m}\n{USAGE_TEXT}");
            return ExitCode::from(support::USAGE);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    match rt.block_on(hold(args)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            emit_error(&e);
            ExitCode::from(support::FAILED)
        }
    }
}

async fn hold(a: Args) -> Result<u8, Error> {
    let locker = Locker::new(&a.dsn)?;
    let ttl = fenced_lock::args::seconds("ttl", a.ttl)?;
    let hold = fenced_lock::args::seconds("hold", a.hold)?;
    let mut acquire = locker
        .acquire(a.name.as_str())
        .ttl(ttl)
        .session_bound(a.session_bound)
        .shared(a.shared)
        .permits(fenced_lock::args::permits(a.permits)?);
    if let Some(w) = a.wait {
        acquire = acquire.wait(fenced_lock::args::seconds("wait", w)?);
    }
    if let Some(h) = &a.holder {
        acquire = acquire.holder(h.as_str());
    }
    let lease = acquire.await?;
    let token = lease.token();
    emit(&[("event", js("acquired")), ("token", token.to_string())]);

    // One "renewed" line per successful renew, in order, from the lease's
    // status channel; "lost" from the lost signal, the moment it fires.
    let printed = Arc::new(Mutex::new(0u64));
    let print_renewals = {
        let printed = printed.clone();
        move |renewals: u64| {
            let mut p = printed.lock().unwrap();
            while *p < renewals {
                *p += 1;
                emit(&[("event", js("renewed")), ("token", token.to_string())]);
            }
        }
    };
    let mut status = lease.watch();
    let renewed = {
        let print = print_renewals.clone();
        tokio::spawn(async move {
            while status.changed().await.is_ok() {
                let renewals = status.borrow_and_update().renewals;
                print(renewals);
            }
        })
    };
    let lost = lease.lost();
    let lost_line = tokio::spawn(async move {
        lost.cancelled().await;
        emit(&[("event", js("lost")), ("token", token.to_string())]);
    });

    // Not cut short by a loss: the write below must reach the database.
    tokio::time::sleep(hold).await;

    if let Some((table, id)) = &a.write {
        let sql = format!("UPDATE {table} SET fence_token = $1 WHERE id = {id}");
        match lease.client().execute(sql.as_str(), &[&token]).await.map_err(Error::from) {
            Ok(_) => emit(&[("event", js("write")), ("ok", "true".into())]),
            Err(e) => {
                let sqlstate = e.sqlstate().map(js).unwrap_or_else(|| "null".into());
                eprintln!("write refused: {e}");
                emit(&[("event", js("write")), ("ok", "false".into()), ("sqlstate", sqlstate)]);
            }
        }
    }

    let released = if lease.is_lost() { None } else { Some(lease.release().await) };
    print_renewals(lease.status().renewals);
    renewed.abort();
    if lease.status().state == LeaseState::Lost {
        let _ = lost_line.await;
        return Ok(support::LOST);
    }
    lost_line.abort();
    let released = released.expect("released unless lost")?;
    emit(&[("event", js("released")), ("token", token.to_string()), ("released", released.to_string())]);
    Ok(support::DONE)
}
