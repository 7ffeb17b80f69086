//! Client for [fenced_lock](https://github.com/fenced-lock/fenced_lock), the
//! PostgreSQL extension of leased named locks with fencing tokens, over
//! tokio-postgres.
//!
//! - [`Locker`] takes leases, from a connection string, a [`Pool`] or a
//!   factory of [`Connection`]s.
//! - A [`Lease`] carries the fencing token, renews itself in the background
//!   (keepalive, on its own connection and thread), signals
//!   [`Lease::lost`] (a `CancellationToken`) the moment it can no longer be
//!   trusted, and releases when dropped.
//! - [`Acquire::run`] (the retry helper) re-runs the whole
//!   acquire-read-write-release when the database refuses a write with
//!   `FL001`.
//! - [`Error`] has one variant per SQLSTATE the extension raises.
//!
//! ```no_run
//! use std::time::Duration;
//! use fenced_lock::{Error, Locker};
//!
//! # async fn f() -> Result<(), Error> {
//! let locker = Locker::new("postgresql://app@db.internal/shop")?;
//! let lease = locker.acquire("inventory:1").ttl(Duration::from_secs(10)).await?;
//! let stock: i32 = lease.client()
//!     .query_one("SELECT stock FROM inventory WHERE item_id = 1", &[]).await?.get(0);
//! lease.client()
//!     .execute("UPDATE inventory SET stock = $1, fence_token = $2 WHERE item_id = 1",
//!              &[&(stock - 1), &lease.token()]).await?;  // FL001 if the lease was lost
//! lease.release().await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

// The modules stand in layers, each using only those below it: locker (the
// Locker and its acquires) on top; lease (a granted lease and its release);
// keepalive (the task that renews a lease); source (where the connections
// come from) and request (an acquire's arguments and their checks); pool;
// connection; and at the bottom tap, status, args and error.
pub mod args;
mod connection;
mod error;
mod keepalive;
mod lease;
mod locker;
mod pool;
mod request;
mod source;
mod status;
mod tap;

pub use connection::{Connection, RawStream, Socket, Transaction};
pub use error::{sqlstate, Error, SqlError};
pub use lease::Lease;
pub use locker::{Acquire, Locker, LockerBuilder, Try, Wait};
pub use pool::{Pool, PoolBuilder};
pub use source::{Purpose, KEEPALIVE_APPLICATION_NAME};
pub use status::{LeaseState, LeaseStatus};
pub use tap::{Tap, TransactionStatus};

/// The driver, re-exported: the types of [`Connection`]'s client.
pub use tokio_postgres;
/// The lost signal's type, re-exported.
pub use tokio_util::sync::CancellationToken;

// The README's example is compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme {}
