//! The conformance example `inventory` (clients/README.md): sell up to N
//! units of an item, each sale through the retry helper on lock
//! `inventory:ID` (acquire, read the stock, write stock - 1 with the token,
//! release).
//!
//! inventory --dsn DSN --item ID --sales N --ttl SECONDS

#[path = "support/mod.rs"]
mod support;

use std::process::ExitCode;

use fenced_lock::{Error, Lease, Locker, Pool};
use support::{emit, emit_error, js, CommandLine};

const USAGE_TEXT: &str = "usage: inventory --dsn DSN --item ID --sales N --ttl SECONDS";

struct Args {
    dsn: String,
    item: i32,
    sales: u64,
    ttl: f64,
}

fn parse() -> Result<Args, String> {
    let cl = CommandLine::parse(&["dsn", "item", "sales", "ttl"], &[])?;
    Ok(Args {
        dsn: cl.required("dsn")?.to_string(),
        item: cl.number("item", cl.required("item")?)?,
        sales: cl.number("sales", cl.required("sales")?)?,
        ttl: cl.number("ttl", cl.required("ttl")?)?,
    })
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(m) => {
            eprintln!("inventory: {m}\n{USAGE_TEXT}");
            return ExitCode::from(support::USAGE);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    match rt.block_on(sell(args)) {
        Ok(()) => ExitCode::from(support::DONE),
        Err(e) => {
            emit_error(&e);
            ExitCode::from(support::FAILED)
        }
    }
}

/// One sale: the stock written, or `None` when there was none left.
async fn sell_one(lease: &Lease, item: i32) -> Result<Option<i32>, Error> {
    let stock: i32 =
        lease.client().query_one("SELECT stock FROM inventory WHERE item_id = $1", &[&item]).await?.get(0);
    if stock == 0 {
        return Ok(None);
    }
    // FL001 here means the lease was lost since the acquire: nothing was
    // written, and the retry helper starts again from the acquire.
    lease
        .client()
        .execute(
            "UPDATE inventory SET stock = $1, fence_token = $2 WHERE item_id = $3",
            &[&(stock - 1), &lease.token(), &item],
        )
        .await?;
    Ok(Some(stock - 1))
}

async fn sell(a: Args) -> Result<(), Error> {
    // The lease's connection is reused from sale to sale; the keepalive's
    // is the pool's second slot (opened per lease, closed at its release).
    let locker = Locker::from_pool(Pool::new(&a.dsn)?).build()?;
    let ttl = fenced_lock::args::seconds("ttl", a.ttl)?;
    let name = format!("inventory:{}", a.item);
    // A holder naming this process: an operator (or a test) can tell from
    // fenced_lock_leases which process holds the lock.
    let holder = format!("inventory-{}", std::process::id());
    let mut sold = 0u64;
    while sold < a.sales {
        let sale = locker
            .acquire(name.as_str())
            .ttl(ttl)
            .holder(holder.as_str())
            .run(async |lease| sell_one(lease, a.item).await)
            .await?;
        match sale {
            Some(stock) => {
                sold += 1;
                emit(&[("event", js("sold")), ("stock", stock.to_string())]);
            }
            None => {
                emit(&[("event", js("sold_out"))]);
                break;
            }
        }
    }
    emit(&[("event", js("done")), ("sold", sold.to_string())]);
    Ok(())
}
