//! A thin layer over PostgreSQL's SPI for the few fixed statements that write
//! the lease state: plans prepared once per backend, always run against the
//! *latest* committed state.
//!
//! Why the latest snapshot: lease transitions of a name are serialized by its
//! name lock (see `locktags.rs`), not by MVCC. Once that lock is held, the
//! latest snapshot shows the record the transition read, whatever the caller's
//! isolation level; a REPEATABLE READ snapshot could hide it (RI triggers run
//! their statements the same way).

use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;

/// One fixed statement: its text and the types of its parameters.
pub struct Statement {
    pub sql: &'static str,
    pub args: &'static [pg_sys::Oid],
}

thread_local! {
    static PLANS: RefCell<HashMap<usize, pg_sys::SPIPlanPtr>> = RefCell::new(HashMap::new());
}

/// An open SPI connection; closed when dropped (unless an error is unwinding,
/// in which case PostgreSQL's abort processing closes it).
pub struct Connection {
    _private: (),
}

impl Connection {
    pub fn open() -> Connection {
        // SAFETY: SPI_connect only fails when called outside a transaction,
        // which SQL-callable functions never are.
        let rc = unsafe { pg_sys::SPI_connect() };
        assert_eq!(rc, pg_sys::SPI_OK_CONNECT as i32, "SPI_connect failed");
        Connection { _private: () }
    }

    fn plan(&self, stmt: &'static Statement) -> pg_sys::SPIPlanPtr {
        let key = stmt as *const Statement as usize;
        if let Some(p) = PLANS.with(|p| p.borrow().get(&key).copied()) {
            return p;
        }
        let sql = CString::new(stmt.sql).expect("statement text has no NUL");
        // SAFETY: we are connected; argtypes points at `args.len()` Oids that
        // SPI_prepare copies. SPI_keepplan moves the plan out of the SPI
        // procedure context so it outlives this connection; the plan cache
        // revalidates it after DDL on the objects it uses.
        let plan = unsafe {
            let p = pg_sys::SPI_prepare(
                sql.as_ptr(),
                stmt.args.len() as i32,
                stmt.args.as_ptr() as *mut pg_sys::Oid,
            );
            if p.is_null() {
                panic!("fenced_lock: could not prepare statement: {}", stmt.sql);
            }
            pg_sys::SPI_keepplan(p);
            p
        };
        PLANS.with(|p| p.borrow_mut().insert(key, plan));
        plan
    }

    /// Run `stmt` with `args` (`None` is SQL NULL) against the latest
    /// snapshot; returns how many rows it affected.
    pub fn run(&self, stmt: &'static Statement, args: &[Option<Datum>]) -> usize {
        assert_eq!(args.len(), stmt.args.len(), "wrong argument count for {}", stmt.sql);
        let plan = self.plan(stmt);
        let mut values: Vec<Datum> = args.iter().map(|a| a.unwrap_or(Datum::from(0))).collect();
        let nulls: Vec<std::ffi::c_char> =
            args.iter().map(|a| if a.is_some() { b' ' } else { b'n' } as std::ffi::c_char).collect();
        // SAFETY: values/nulls have one entry per plan parameter. The latest
        // snapshot is copied by SPI when it pushes it as the active snapshot.
        let rc = unsafe {
            pg_sys::SPI_execute_snapshot(
                plan,
                values.as_mut_ptr(),
                nulls.as_ptr(),
                pg_sys::GetLatestSnapshot(),
                std::ptr::null_mut(), // no crosscheck snapshot
                false,                // not read-only: every statement here writes
                true,                 // fire triggers (e.g. an audit trigger an operator adds)
                0,
            )
        };
        if rc < 0 {
            panic!("fenced_lock: statement failed ({rc}): {}", stmt.sql);
        }
        // Make this write visible to the next statement and to later reads.
        // SAFETY: we are inside a transaction.
        unsafe { pg_sys::CommandCounterIncrement() };
        // SAFETY: SPI_processed is set by the call above.
        unsafe { pg_sys::SPI_processed as usize }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            // SAFETY: we connected in `open`.
            unsafe { pg_sys::SPI_finish() };
        }
    }
}
