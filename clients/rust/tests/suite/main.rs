//! The Rust client's suite, against a real server (FL_DSN): one test per
//! promise of clients/README.md, named after it. Faults are real: the
//! conformance examples run as child processes and get SIGSTOP/SIGCONT;
//! backends are ended with pg_terminate_backend. Timings are printed, and
//! bounded generously where they are a promise of the contract.
//!
//! Run by test.sh (`cargo test --test suite -- [FILTER...] [--jobs N]`). The
//! tests are in one module per part of the contract; `main` lists them all.

mod acquire;
mod errors;
mod keepalive;
mod release;
mod retry;
mod support;

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced_lock::tokio_postgres::Config;
use fenced_lock::{Connection, Error, Lease, LeaseState, Locker, Pool, TransactionStatus};
use support::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A docs row, inserted with a token of its own lock (the guard wants one).
async fn new_doc(ctx: &Ctx) -> i32 {
    let id = unique_id();
    let lease = ctx.locker().try_acquire(format!("doc:{id}")).await.unwrap().unwrap();
    lease
        .client()
        .execute("INSERT INTO docs (id, body, fence_token) VALUES ($1, 'new', $2)", &[&id, &lease.token()])
        .await
        .unwrap();
    assert!(lease.release().await.unwrap());
    id
}

/// An inventory row with `stock`.
async fn new_item(ctx: &Ctx, stock: i32) -> i32 {
    let id = unique_id();
    let lease = ctx.locker().try_acquire(format!("inventory:{id}")).await.unwrap().unwrap();
    lease
        .client()
        .execute("INSERT INTO inventory VALUES ($1, $2, $3)", &[&id, &stock, &lease.token()])
        .await
        .unwrap();
    assert!(lease.release().await.unwrap());
    id
}

async fn stock(admin: &Connection, item: i32) -> i32 {
    admin.query_one("SELECT stock FROM inventory WHERE item_id = $1", &[&item]).await.unwrap().get(0)
}

async fn ended_by(admin: &Connection, token: i64) -> Option<String> {
    admin
        .query_opt("SELECT ended_by FROM fenced_lock_history WHERE token = $1", &[&token])
        .await
        .unwrap()
        .and_then(|r| r.get(0))
}

/// The retry helper's unit of work in these tests: one sale.
async fn sell_one(lease: &Lease, item: i32) -> Result<Option<i32>, Error> {
    let s: i32 =
        lease.client().query_one("SELECT stock FROM inventory WHERE item_id = $1", &[&item]).await?.get(0);
    if s == 0 {
        return Ok(None);
    }
    lease
        .client()
        .execute(
            "UPDATE inventory SET stock = $1, fence_token = $2 WHERE item_id = $3",
            &[&(s - 1), &lease.token(), &item],
        )
        .await?;
    Ok(Some(s - 1))
}

// -------------------------------------------------------------------- main

type Boxed = Pin<Box<dyn Future<Output = ()>>>;

macro_rules! tests {
    ($($module:ident::$name:ident: $bound:expr),* $(,)?) => {
        vec![$(Test {
            name: stringify!($name),
            bound: secs($bound),
            f: |c| -> Boxed { Box::pin($module::$name(c)) },
        }),*]
    };
}

fn main() -> ExitCode {
    let tests = tests![
        retry::four_inventory_processes_one_sigstopped_past_its_ttl_sell_the_stock_of_100_each_sale_counted_once: 150,
        keepalive::sigstop_past_the_ttl_signals_lost_within_a_second_of_sigcont_and_the_write_is_refused_with_fl001: 60,
        keepalive::keepalive_keeps_a_critical_section_of_three_ttls_alive: 30,
        keepalive::keepalive_renews_while_the_applications_runtime_is_blocked: 30,
        keepalive::a_guarded_transaction_open_for_three_ttls_keeps_its_lease_and_its_commit_is_accepted: 30,
        keepalive::keepalive_reconnects_after_its_connection_is_terminated_and_the_lease_stays_live: 30,
        keepalive::a_session_bound_lease_whose_connection_is_terminated_ends_and_is_signalled_lost_at_the_next_renew: 30,
        keepalive::a_renew_held_up_on_the_server_is_given_up_and_retried_and_the_lease_is_not_lost_while_it_is_live: 30,
        keepalive::a_network_cut_of_the_keepalives_connection_is_survived_on_a_new_connection: 30,
        release::release_stops_the_keepalive_and_its_connection_is_gone_from_the_server_when_release_returns: 60,
        release::release_waits_for_a_renew_in_flight_and_is_sent_only_after_it: 30,
        release::a_release_in_the_holders_own_transaction_that_proclaimed_waits_for_the_held_up_renew_only_about_its_bound: 30,
        release::releasing_twice_sends_one_release_and_the_second_returns_false_without_a_round_trip: 20,
        release::a_release_inside_a_transaction_is_part_of_it_and_takes_effect_at_commit: 20,
        release::a_release_in_a_failed_transaction_rolls_it_back_first: 20,
        release::a_release_whose_connection_is_gone_is_sent_on_a_new_connection: 20,
        release::a_lost_lease_is_never_released: 20,
        release::a_release_whose_future_is_dropped_still_completes: 20,
        release::dropping_a_live_lease_releases_it_in_the_background: 20,
        release::leaving_the_scope_by_a_panic_releases_the_lease: 20,
        acquire::an_acquire_that_waited_longer_than_its_ttl_is_not_lost_when_granted: 30,
        acquire::a_waiting_acquire_whose_wait_takes_most_of_the_ttl_is_renewed_before_it_returns_and_its_deadline_counts_from_that_renew: 30,
        acquire::try_acquire_returns_none_while_the_lock_is_held_and_the_given_connection_stays_usable: 20,
        acquire::an_acquire_on_a_connection_inside_a_transaction_is_refused_and_sends_nothing: 20,
        acquire::keepalive_off_the_lease_is_lost_at_its_deadline_and_a_manual_renew_moves_it: 20,
        acquire::shared_leases_and_permits_live_together_as_the_server_allows: 20,
        acquire::shared_leases_are_waited_for_renewed_and_released_like_exclusive_ones: 30,
        acquire::a_permit_is_waited_for_renewed_released_and_taken_by_the_retry_helper: 30,
        acquire::shared_and_permits_are_sent_only_when_they_are_not_the_default: 20,
        acquire::the_extensions_schema_can_be_named: 20,
        acquire::a_pool_gives_each_lease_two_connections_and_reuses_the_leases_connection: 30,
        retry::the_retry_helper_reruns_from_the_acquire_after_fl001_and_returns_the_value: 30,
        retry::the_retry_helper_gives_up_after_its_attempts_with_the_last_fl001: 30,
        retry::the_retry_helper_returns_any_other_error_at_once_after_the_release: 20,
        errors::every_bad_argument_of_every_call_is_an_invalid_argument_error_and_sends_nothing: 30,
        errors::each_sqlstate_of_the_contract_maps_to_its_error_type: 20,
        errors::each_sqlstate_raised_by_the_server_for_its_cause_comes_back_as_its_error_type: 30,
        errors::fl003_from_the_server_is_a_mode_conflict: 20,
    ];
    // The longest first, so that they overlap the many short ones.
    let tests: &'static [Test] = Box::leak(tests.into_iter().rev().collect::<Vec<_>>().into_boxed_slice());
    support::main(tests)
}
