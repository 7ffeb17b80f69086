//! Every difference between PostgreSQL majors 13 to 18 that fenced_lock
//! meets, in one place, so that the rest of the code reads the same on every
//! major. Each function says what changed and in which release.

use pgrx::pg_sys;
use std::ffi::CStr;

/// Does this backend hold `tag` in `mode`? (17 added `orstronger`.)
pub fn lock_held_by_me(tag: &pg_sys::LOCKTAG, mode: pg_sys::LOCKMODE) -> bool {
    // SAFETY: a lookup in this backend's local lock table.
    unsafe {
        #[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15", feature = "pg16"))]
        {
            pg_sys::LockHeldByMe(tag, mode)
        }
        #[cfg(any(feature = "pg17", feature = "pg18"))]
        {
            pg_sys::LockHeldByMe(tag, mode, false)
        }
    }
}

/// The PGPROC of the backend running `vxid`, or NULL. (17 replaced
/// `BackendId`/`BackendIdGetProc` with `ProcNumber`/`ProcNumberGetProc`.)
///
/// # Safety
/// `vxid` comes from the lock manager (GetLockConflicts).
pub unsafe fn vxid_proc(vxid: &pg_sys::VirtualTransactionId) -> *mut pg_sys::PGPROC {
    // SAFETY: both return NULL for an unused slot.
    unsafe {
        #[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15", feature = "pg16"))]
        {
            BackendIdGetProc(vxid.backendId)
        }
        #[cfg(any(feature = "pg17", feature = "pg18"))]
        {
            ProcNumberGetProc(vxid.procNumber)
        }
    }
}

#[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15", feature = "pg16"))]
unsafe extern "C-unwind" {
    // storage/sinvaladt.h; not in pgrx's bindings.
    fn BackendIdGetProc(backend_id: std::ffi::c_int) -> *mut pg_sys::PGPROC;
}

#[cfg(any(feature = "pg17", feature = "pg18"))]
unsafe extern "C-unwind" {
    // storage/procarray.h; not in pgrx's bindings.
    fn ProcNumberGetProc(proc_number: std::ffi::c_int) -> *mut pg_sys::PGPROC;
}

/// This backend's local transaction id. (17 moved `lxid` into `vxid`.)
pub fn current_lxid() -> pg_sys::LocalTransactionId {
    // SAFETY: MyProc is set for the life of a backend.
    unsafe {
        #[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15", feature = "pg16"))]
        {
            (*pg_sys::MyProc).lxid
        }
        #[cfg(any(feature = "pg17", feature = "pg18"))]
        {
            (*pg_sys::MyProc).vxid.lxid
        }
    }
}

/// The timeline WAL is being written on now; call only outside recovery.
/// (15 added `GetWALInsertionTimeLine`; before it, `ThisTimeLineID` holds it
/// once `RecoveryInProgress()` has returned false in this backend.)
pub fn insert_timeline() -> u32 {
    // SAFETY: the caller checked that recovery is over.
    unsafe {
        #[cfg(any(feature = "pg13", feature = "pg14"))]
        {
            // RecoveryInProgress() initializes ThisTimeLineID (InitXLOGAccess)
            // the first time it sees that recovery has ended.
            let in_recovery = pg_sys::RecoveryInProgress();
            debug_assert!(!in_recovery);
            pg_sys::ThisTimeLineID
        }
        #[cfg(not(any(feature = "pg13", feature = "pg14")))]
        {
            pg_sys::GetWALInsertionTimeLine()
        }
    }
}

/// Refuse settings in our prefix that we do not define. 15 added
/// `MarkGUCPrefixReserved`, which makes `SET fenced_lock.typo` an error; 13
/// and 14 only have `EmitWarningsOnPlaceholders`, which warns about such
/// settings that exist when the library loads and lets later ones through
/// (docs/reference.md, "Settings", says so).
pub fn reserve_guc_prefix(prefix: &CStr) {
    // SAFETY: called from _PG_init after our settings are defined.
    unsafe {
        #[cfg(any(feature = "pg13", feature = "pg14"))]
        {
            pg_sys::EmitWarningsOnPlaceholders(prefix.as_ptr());
        }
        #[cfg(not(any(feature = "pg13", feature = "pg14")))]
        {
            pg_sys::MarkGUCPrefixReserved(prefix.as_ptr());
        }
    }
}

/// The `reset_source` of the setting (or placeholder) called `name`. (16
/// changed `get_guc_variables` to return its length.)
pub fn guc_reset_source(name: &CStr) -> Option<pg_sys::GucSource::Type> {
    // SAFETY: get_guc_variables returns the backend's array of valid entries,
    // placeholders included.
    unsafe {
        #[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15"))]
        let (vars, n) = (pg_sys::get_guc_variables(), pg_sys::GetNumConfigOptions() as usize);
        #[cfg(not(any(feature = "pg13", feature = "pg14", feature = "pg15")))]
        let (vars, n) = {
            let mut n: std::ffi::c_int = 0;
            let vars = pg_sys::get_guc_variables(&mut n);
            (vars, n as usize)
        };
        (0..n).map(|i| *vars.add(i)).find_map(|v| {
            (CStr::from_ptr((*v).name).to_bytes().eq_ignore_ascii_case(name.to_bytes()))
                .then(|| (*v).reset_source)
        })
    }
}

/// `timestamptz < timestamptz`, for index scans. (13 names it `F_TIMESTAMP_LT`:
/// timestamptz_lt is the same C function as timestamp_lt.)
pub const TIMESTAMPTZ_LT: u32 = {
    #[cfg(feature = "pg13")]
    {
        pg_sys::F_TIMESTAMP_LT
    }
    #[cfg(not(feature = "pg13"))]
    {
        pg_sys::F_TIMESTAMPTZ_LT
    }
};

/// Has this backend's client gone away (its socket closed)? 14 added
/// `pq_check_connection`, behind `client_connection_check_interval`; on 13
/// we look at the socket ourselves, the way 14 does.
pub fn client_gone() -> bool {
    // SAFETY: MyProcPort is the backend's client connection (NULL in a
    // background process, which has no client to lose).
    unsafe {
        if pg_sys::MyProcPort.is_null() {
            return false;
        }
        #[cfg(feature = "pg13")]
        {
            let mut byte = 0u8;
            // pgrx binds 13's Port as an opaque struct; `pgsocket sock` is
            // its first member (libpq/libpq-be.h), an int on Linux.
            let sock = *(pg_sys::MyProcPort as *const std::ffi::c_int);
            let r =
                libc_recv(sock, &mut byte as *mut u8 as *mut std::ffi::c_void, 1, MSG_PEEK | MSG_DONTWAIT);
            r == 0
        }
        #[cfg(not(feature = "pg13"))]
        {
            !pq_check_connection()
        }
    }
}

#[cfg(feature = "pg13")]
const MSG_PEEK: std::ffi::c_int = 0x02;
#[cfg(feature = "pg13")]
const MSG_DONTWAIT: std::ffi::c_int = 0x40;

#[cfg(feature = "pg13")]
unsafe extern "C" {
    #[link_name = "recv"]
    fn libc_recv(
        sock: std::ffi::c_int,
        buf: *mut std::ffi::c_void,
        len: usize,
        flags: std::ffi::c_int,
    ) -> isize;
}

#[cfg(not(feature = "pg13"))]
unsafe extern "C-unwind" {
    // libpq/libpq.h; not in pgrx's bindings.
    fn pq_check_connection() -> bool;
}

/// This backend's PGPROC number. (17 made it a global, `MyProcNumber`.)
pub fn my_proc_number() -> u32 {
    // SAFETY: set for the life of a backend.
    unsafe {
        #[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15", feature = "pg16"))]
        {
            (*pg_sys::MyProc).pgprocno as u32
        }
        #[cfg(any(feature = "pg17", feature = "pg18"))]
        {
            pg_sys::MyProcNumber as u32
        }
    }
}

/// Leave with PostgreSQL's own FATAL "connection to client lost", as its
/// connection check does, rolling back whatever this transaction did. Only
/// returns if interrupts are held off, which our waits never do.
pub fn leave_because_client_gone() {
    // SAFETY: the flags ProcessInterrupts acts on; it raises FATAL.
    unsafe {
        pg_sys::ClientConnectionLost = 1;
        pg_sys::InterruptPending = 1;
    }
    pgrx::check_for_interrupts!();
}

/// Is the relation's `vacuum_truncate` storage parameter set to false, so
/// that VACUUM never shrinks it? (18 distinguishes "set" from the default.)
///
/// # Safety
/// `rel` is an open relation of a table.
pub unsafe fn vacuum_truncate_disabled(rel: pg_sys::Relation) -> bool {
    // SAFETY: rd_options of a heap table is NULL or a StdRdOptions.
    unsafe {
        let options = (*rel).rd_options as *const pg_sys::StdRdOptions;
        if options.is_null() {
            return false;
        }
        #[cfg(feature = "pg18")]
        {
            (*options).vacuum_truncate_set && !(*options).vacuum_truncate
        }
        #[cfg(not(feature = "pg18"))]
        {
            !(*options).vacuum_truncate
        }
    }
}

/// Fetch the tuple at `tuple.t_self` if `snapshot` sees it; on success the
/// buffer stays pinned in `*buffer`. (15 added `keep_buf` to `heap_fetch`.)
///
/// # Safety
/// `rel` is open and locked; the tid is within the relation.
pub unsafe fn heap_fetch(
    rel: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    tuple: &mut pg_sys::HeapTupleData,
    buffer: &mut pg_sys::Buffer,
) -> bool {
    // SAFETY: as the caller promises.
    unsafe {
        #[cfg(any(feature = "pg13", feature = "pg14"))]
        {
            pg_sys::heap_fetch(rel, snapshot, tuple, buffer)
        }
        #[cfg(not(any(feature = "pg13", feature = "pg14")))]
        {
            pg_sys::heap_fetch(rel, snapshot, tuple, buffer, false)
        }
    }
}

/// Update the heap tuple at `otid` to `tup`; true if the new version needs
/// index entries (the update was not HOT). (16 made `simple_heap_update`
/// say so; before, the new tuple's HEAP_ONLY flag tells.) Only for tables
/// whose indexes are all btrees, none of them summarizing.
///
/// # Safety
/// `rel` is open with RowExclusiveLock and `otid` is a tuple of it.
pub unsafe fn simple_heap_update(
    rel: pg_sys::Relation,
    otid: pg_sys::ItemPointer,
    tup: pg_sys::HeapTuple,
) -> bool {
    // SAFETY: as the caller promises.
    unsafe {
        #[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15"))]
        {
            pg_sys::simple_heap_update(rel, otid, tup);
            (*(*tup).t_data).t_infomask2 & pg_sys::HEAP_ONLY_TUPLE as u16 == 0
        }
        #[cfg(not(any(feature = "pg13", feature = "pg14", feature = "pg15")))]
        {
            let mut update_indexes = pg_sys::TU_UpdateIndexes::TU_None;
            pg_sys::simple_heap_update(rel, otid, tup, &mut update_indexes);
            update_indexes == pg_sys::TU_UpdateIndexes::TU_All
        }
    }
}

/// Insert an index entry. (14 added `indexUnchanged`: false, this is a new
/// row version.)
///
/// # Safety
/// `index` and `heap` are open with RowExclusiveLock; the arrays hold one
/// entry per index column.
pub unsafe fn index_insert(
    index: pg_sys::Relation,
    values: *mut pg_sys::Datum,
    isnull: *mut bool,
    tid: pg_sys::ItemPointer,
    heap: pg_sys::Relation,
    unique: pg_sys::IndexUniqueCheck::Type,
    info: *mut pg_sys::IndexInfo,
) {
    // SAFETY: as the caller promises.
    unsafe {
        #[cfg(feature = "pg13")]
        pg_sys::index_insert(index, values, isnull, tid, heap, unique, info);
        #[cfg(not(feature = "pg13"))]
        pg_sys::index_insert(index, values, isnull, tid, heap, unique, false, info);
    }
}
