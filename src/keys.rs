//! The transaction-level advisory locks that order everything on one name.
//!
//! Keys are advisory lock tags `(database, space, hashtext(name), KEY_KIND)`.
//! `KEY_KIND` is a value of the tag's last field that SQL's advisory lock
//! functions never use (they use 1 for a bigint key and 2 for two int4 keys),
//! so no role can take, squat on or collide with these locks from SQL; the
//! application's own advisory locks live in other key spaces entirely. A hash
//! collision between two names merely serializes them: the lease row decides
//! who holds what, never the lock.
//!
//! In `pg_locks` these show as `locktype = 'advisory'`, `classid = space`,
//! `objid = hashtext(name)`, `objsubid = 17996` (`KEY_KIND`).
//!
//! - FENCE: lease transitions (acquire, renew, release, force) take it
//!   exclusive; the guard and `fenced_lock_assert` take it shared. A takeover
//!   therefore waits for every in-flight guarded write of the old lease.
//! - QUEUE: waiters of `fenced_lock_acquire` line up on it, FIFO, asleep in the
//!   lock manager; only its holder (the head waiter) watches the lease.
//! - EPOCH: serializes the once-per-timeline jump of the token sequence.

use pgrx::pg_sys;

/// 'FL' followed by a purpose number.
pub const FENCE_SPACE: u32 = 0x464C_0001;
pub const QUEUE_SPACE: u32 = 0x464C_0002;
pub const EPOCH_SPACE: u32 = 0x464C_0003;
/// The advisory tag's last field for our locks ('FL'); SQL uses only 1 and 2.
pub const KEY_KIND: u16 = 0x464C;

#[derive(Clone, Copy)]
pub struct Key {
    tag: pg_sys::LOCKTAG,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Shared,
    Exclusive,
}

impl Mode {
    fn lockmode(self) -> pg_sys::LOCKMODE {
        match self {
            Mode::Shared => pg_sys::ShareLock as pg_sys::LOCKMODE,
            Mode::Exclusive => pg_sys::ExclusiveLock as pg_sys::LOCKMODE,
        }
    }
}

/// `hashtext(name)` as PostgreSQL computes it for a deterministic collation.
pub fn name_hash(name: &str) -> u32 {
    // SAFETY: hash_bytes reads exactly `len` bytes.
    unsafe { hash_bytes(name.as_ptr(), name.len() as std::ffi::c_int) }
}

impl Key {
    fn new(space: u32, id: u32) -> Key {
        // SAFETY: reading MyDatabaseId, set for the whole life of a backend.
        let db = unsafe { pg_sys::MyDatabaseId };
        Key {
            tag: pg_sys::LOCKTAG {
                locktag_field1: db.into(),
                locktag_field2: space,
                locktag_field3: id,
                locktag_field4: KEY_KIND,
                locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
                locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
            },
        }
    }

    pub fn fence(name: &str) -> Key {
        Key::new(FENCE_SPACE, name_hash(name))
    }

    pub fn queue(name: &str) -> Key {
        Key::new(QUEUE_SPACE, name_hash(name))
    }

    pub fn epoch() -> Key {
        Key::new(EPOCH_SPACE, 0)
    }

    /// Take the lock until the end of the transaction, waiting as long as
    /// needed (bounded by `lock_timeout`, cancel and deadlock detection).
    pub fn lock(&self, mode: Mode) {
        // SAFETY: a valid advisory locktag; transaction-level (not session) lock.
        unsafe {
            pg_sys::LockAcquire(&self.tag, mode.lockmode(), false, false);
        }
    }

    /// Take the lock only if it is free now.
    pub fn try_lock(&self, mode: Mode) -> bool {
        // SAFETY: as in `lock`; dontWait makes it return instead of sleeping.
        let r = unsafe { pg_sys::LockAcquire(&self.tag, mode.lockmode(), false, true) };
        r != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
    }

    /// Give back one hold of the lock taken earlier in this transaction.
    pub fn unlock(&self, mode: Mode) {
        // SAFETY: we hold this lock in this mode (taken by `lock`/`try_lock`).
        unsafe {
            pg_sys::LockRelease(&self.tag, mode.lockmode(), false);
        }
    }

    /// Set the latch of every other backend that holds this lock, so that a
    /// head waiter sleeping on its latch re-checks the lease at once.
    pub fn wake_holders(&self) {
        // SAFETY: GetLockConflicts returns a palloc'd array terminated by an
        // invalid vxid; BackendIdGetProc returns NULL for unused slots. A proc
        // that has moved on to another transaction only gets a spurious wakeup.
        unsafe {
            let mut count: i32 = 0;
            let vxids = pg_sys::GetLockConflicts(&self.tag, Mode::Exclusive.lockmode(), &mut count);
            for i in 0..count as usize {
                let vxid = *vxids.add(i);
                let proc_ = BackendIdGetProc(vxid.backendId);
                if !proc_.is_null() && proc_ != pg_sys::MyProc {
                    pg_sys::SetLatch(&mut (*proc_).procLatch);
                }
            }
        }
    }
}

unsafe extern "C-unwind" {
    // storage/sinvaladt.h; not in pgrx's bindings.
    fn BackendIdGetProc(backend_id: std::ffi::c_int) -> *mut pg_sys::PGPROC;
    // common/hashfn.h: the hash behind hashtext(); not in pgrx's bindings.
    fn hash_bytes(k: *const u8, keylen: std::ffi::c_int) -> u32;
}
