//! Small helpers about the transaction we are in. The transaction-end
//! dispatch that tells each module a transaction is ending lives at the top
//! of the house, in `lib.rs`; this file knows no other module but `errors`.

use crate::errors::{sqlstate, FlError};
use pgrx::pg_sys;
use pgrx::PgTryBuilder;

/// The id of the current subtransaction (1 at top level).
pub fn current_subid() -> pg_sys::SubTransactionId {
    // SAFETY: plain accessor.
    unsafe { pg_sys::GetCurrentSubTransactionId() }
}

/// Are we inside an explicit transaction block (BEGIN ... COMMIT)?
pub fn in_transaction_block() -> bool {
    // SAFETY: plain accessor of the transaction state.
    unsafe { pg_sys::IsTransactionBlock() }
}

/// Lease changes write: refuse them, clearly, where nothing can be written.
pub fn check_writable(function: &str) -> Result<(), FlError> {
    // SAFETY: plain accessors of the backend's state.
    let (in_recovery, read_only) = unsafe { (pg_sys::RecoveryInProgress(), pg_sys::XactReadOnly) };
    if in_recovery {
        Err(FlError::new(
            sqlstate::READ_ONLY_SQL_TRANSACTION,
            format!("{function}: cannot change a lease on a standby server (recovery is in progress)"),
        )
        .hint("Connect to the primary, for example with target_session_attrs=read-write in the connection string."))
    } else if read_only {
        Err(FlError::new(
            sqlstate::READ_ONLY_SQL_TRANSACTION,
            format!("{function}: cannot change a lease in a read-only transaction"),
        )
        .hint("Run it in a read-write transaction."))
    } else {
        Ok(())
    }
}

/// Run `work` in a subtransaction, as a PL/pgSQL exception block would: kept
/// (part of the caller's transaction) when it returns `Ok(Some(_))`, rolled
/// back when it returns `Ok(None)` or `Err(_)`, and rolled back when a
/// PostgreSQL error ends it (the error then goes on up).
pub fn in_subtransaction<T>(work: impl FnOnce() -> Result<Option<T>, FlError>) -> Result<Option<T>, FlError> {
    // SAFETY: the standard internal-subtransaction dance (PL/pgSQL's
    // exec_stmt_block): remember the memory context and resource owner, and
    // restore both whichever way the subtransaction ends.
    unsafe {
        let context = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(context);
        let restore = move || {
            pg_sys::MemoryContextSwitchTo(context);
            pg_sys::CurrentResourceOwner = owner;
        };
        let work = std::panic::AssertUnwindSafe(work);
        let outcome = PgTryBuilder::new(move || {
            let work = work;
            (work.0)()
        })
        .catch_others(move |error| {
            restore();
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
            restore();
            error.rethrow()
        })
        .execute();
        match outcome {
            Ok(Some(kept)) => {
                pg_sys::ReleaseCurrentSubTransaction();
                restore();
                Ok(Some(kept))
            }
            other => {
                restore();
                pg_sys::RollbackAndReleaseCurrentSubTransaction();
                restore();
                other
            }
        }
    }
}

/// Run `work` in a transaction of its own while the backend exits, as
/// PostgreSQL's own temp-table cleanup does: end whatever transaction the
/// session was in, start one, commit it. An error rolls that transaction back
/// and is logged; the session is ending, so nothing else can be done.
pub fn in_own_transaction(work: impl FnOnce() -> Result<(), FlError>) {
    // SAFETY: called from a before_shmem_exit callback of a backend, while
    // it is still connected to its database.
    unsafe {
        pg_sys::AbortOutOfAnyTransaction();
        pg_sys::StartTransactionCommand();
    }
    let work = std::panic::AssertUnwindSafe(work);
    let outcome = PgTryBuilder::new(move || {
        let work = work;
        (work.0)().map_err(|e| e.to_string())
    })
    .catch_others(|e| Err(format!("{e:?}")))
    .execute();
    match outcome {
        // SAFETY: the transaction started above.
        Ok(()) => unsafe { pg_sys::CommitTransactionCommand() },
        Err(problem) => {
            pgrx::log!("fenced_lock: could not end the leases of an ending session: {problem}");
            // SAFETY: as above; rolls back what `work` did.
            unsafe { pg_sys::AbortCurrentTransaction() };
        }
    }
}
