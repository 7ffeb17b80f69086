//! The heavyweight locks that order everything on one lock name, and the
//! lock tags they are taken on (docs/design.md, "Lock protocol").
//!
//! Every tag is an advisory lock tag whose last field (`locktag_field4`) is a
//! value SQL's advisory lock functions never use (they use 1 for a bigint key
//! and 2 for two int4 keys), so no role can take, squat on or collide with
//! these locks from SQL, and the application's own advisory locks live in
//! other key spaces entirely.
//!
//! | lock | tag (field1, field2, field3, field4) | taken by |
//! |---|---|---|
//! | name lock | (db, `NAME_SPACE`, hashtext(name), `KIND`) | a grant, exclusive, while it decides and writes (given back before commit) |
//! | lease lock | (db, token >> 32, token & 0xffffffff, `LEASE_KIND`) | guard and assert `RowShare`; renew and proclaim `ShareUpdateExclusive`; every end of the lease `Exclusive` |
//! | queue lock | (db, `QUEUE_SPACE`, hashtext(name), `KIND`) | waiters of `fenced_lock_acquire`, FIFO |
//! | epoch lock | (db, `EPOCH_SPACE`, 0, `KIND`) | the once-per-timeline token jump |
//! | registry lock | (0, `REGISTRY_SPACE`, 0, `KIND`) | creating the shared waiter registry |
//! | session lock | (db, token >> 32, token & 0xffffffff, `SESSION_KIND`) | the session holding a session-bound lease |
//!
//! A hash collision between two names merely serializes them: the lease
//! record decides who holds what, never a lock.

use crate::compat;
use pgrx::pg_sys;

/// 'FL' followed by a purpose number.
pub const NAME_SPACE: u32 = 0x464C_0001;
pub const QUEUE_SPACE: u32 = 0x464C_0002;
pub const EPOCH_SPACE: u32 = 0x464C_0003;
pub const REGISTRY_SPACE: u32 = 0x464C_0004;
/// `locktag_field4` of every tag but session locks ('FL'); SQL uses only 1 and 2.
pub const KIND: u16 = 0x464C;
/// `locktag_field4` of session locks ('FM').
pub const SESSION_KIND: u16 = 0x464D;
/// `locktag_field4` of lease locks ('FN').
pub const LEASE_KIND: u16 = 0x464E;

#[derive(Clone, Copy)]
pub struct LockTag {
    tag: pg_sys::LOCKTAG,
}

/// The lock manager's modes we use. Of these, `RowShare` conflicts only
/// with `Exclusive`; `ShareUpdateExclusive` with itself, `Shared` and
/// `Exclusive`; `Shared` with `ShareUpdateExclusive` and `Exclusive`;
/// `Exclusive` with all four.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    RowShare,
    RowExclusive,
    ShareUpdateExclusive,
    Shared,
    Exclusive,
}

impl Mode {
    fn lockmode(self) -> pg_sys::LOCKMODE {
        (match self {
            Mode::RowShare => pg_sys::RowShareLock,
            Mode::RowExclusive => pg_sys::RowExclusiveLock,
            Mode::ShareUpdateExclusive => pg_sys::ShareUpdateExclusiveLock,
            Mode::Shared => pg_sys::ShareLock,
            Mode::Exclusive => pg_sys::ExclusiveLock,
        }) as pg_sys::LOCKMODE
    }
}

/// `hashtext(name)` as PostgreSQL computes it for a deterministic collation.
pub fn name_hash(name: &str) -> u32 {
    // SAFETY: hash_bytes reads exactly `len` bytes.
    unsafe { hash_bytes(name.as_ptr(), name.len() as std::ffi::c_int) }
}

fn database() -> u32 {
    // SAFETY: MyDatabaseId is set for the whole life of a backend.
    unsafe { pg_sys::MyDatabaseId }.into()
}

impl LockTag {
    fn new(field1: u32, field2: u32, field3: u32, field4: u16) -> LockTag {
        LockTag {
            tag: pg_sys::LOCKTAG {
                locktag_field1: field1,
                locktag_field2: field2,
                locktag_field3: field3,
                locktag_field4: field4,
                locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
                locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
            },
        }
    }

    /// Orders lease transitions of `name` with guarded writes under it.
    pub fn name(name: &str) -> LockTag {
        LockTag::new(database(), NAME_SPACE, name_hash(name), KIND)
    }

    /// The line waiters of `name` queue in.
    pub fn queue(name: &str) -> LockTag {
        LockTag::new(database(), QUEUE_SPACE, name_hash(name), KIND)
    }

    /// Serializes the token sequence's jump to a new epoch.
    pub fn epoch() -> LockTag {
        LockTag::new(database(), EPOCH_SPACE, 0, KIND)
    }

    /// Serializes the creation of the cluster-wide waiter registry.
    pub fn registry() -> LockTag {
        LockTag::new(0, REGISTRY_SPACE, 0, KIND)
    }

    /// Held (exclusive, session-level) by the session a session-bound lease
    /// `token` belongs to, for as long as that session lives.
    pub fn session(token: i64) -> LockTag {
        LockTag::new(database(), (token as u64 >> 32) as u32, token as u64 as u32, SESSION_KIND)
    }

    /// Orders everything done under lease `token`: its guarded writes, its
    /// renewals and its end.
    pub fn lease(token: i64) -> LockTag {
        LockTag::new(database(), (token as u64 >> 32) as u32, token as u64 as u32, LEASE_KIND)
    }

    /// The lock every transaction holds on its own id until it ends; taking
    /// it in `Shared` mode waits for that transaction (as
    /// `XactLockTableWait` does).
    pub fn transaction(xid: pg_sys::TransactionId) -> LockTag {
        let mut tag = LockTag::new(xid.into_inner(), 0, 0, 0);
        tag.tag.locktag_type = pg_sys::LockTagType::LOCKTAG_TRANSACTION as u8;
        tag.tag.locktag_lockmethodid = pg_sys::DEFAULT_LOCKMETHOD as u8;
        tag
    }

    /// Take the lock until the end of the transaction, waiting as long as
    /// needed (bounded by `lock_timeout`, cancel and deadlock detection).
    pub fn lock(&self, mode: Mode) {
        // SAFETY: a valid advisory locktag; transaction-level (not session) lock.
        unsafe {
            pg_sys::LockAcquire(&self.tag, mode.lockmode(), false, false);
        }
    }

    /// Take the lock only if it is free now (transaction-level).
    pub fn try_lock(&self, mode: Mode) -> bool {
        // SAFETY: as in `lock`; dontWait makes it return instead of sleeping.
        let r = unsafe { pg_sys::LockAcquire(&self.tag, mode.lockmode(), false, true) };
        r != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
    }

    /// Give back one hold of the transaction-level lock taken earlier.
    pub fn unlock(&self, mode: Mode) {
        // SAFETY: we hold this lock in this mode (taken by `lock`/`try_lock`).
        unsafe {
            pg_sys::LockRelease(&self.tag, mode.lockmode(), false);
        }
    }

    /// Take the lock for the rest of the session (survives commit and abort).
    pub fn lock_for_session(&self, mode: Mode) {
        // SAFETY: a valid advisory locktag; sessionLock = true.
        unsafe {
            pg_sys::LockAcquire(&self.tag, mode.lockmode(), true, false);
        }
    }

    /// Give back a session-level hold; false if this session did not hold it.
    pub fn unlock_for_session(&self, mode: Mode) -> bool {
        // SAFETY: LockRelease warns and returns false for a lock not held.
        unsafe { pg_sys::LockRelease(&self.tag, mode.lockmode(), true) }
    }

    /// Does this backend hold the lock in `mode` (at either level)?
    pub fn held_by_me(&self, mode: Mode) -> bool {
        compat::lock_held_by_me(&self.tag, mode.lockmode())
    }

    /// Is the lock held by another backend in a mode that conflicts with
    /// `mode`? Answered by taking it without waiting and giving it back at
    /// once, so it never blocks and leaves nothing behind.
    pub fn held_by_others(&self, mode: Mode) -> bool {
        if self.try_lock(mode) {
            self.unlock(mode);
            false
        } else {
            true
        }
    }

    /// Set the latch of every other backend that holds this lock, so that a
    /// head waiter sleeping on its latch re-checks the lease at once.
    pub fn wake_holders(&self) {
        // SAFETY: GetLockConflicts returns a palloc'd array terminated by an
        // invalid vxid; a proc that has moved on to another transaction only
        // gets a spurious wakeup.
        unsafe {
            let mut count: i32 = 0;
            let vxids = pg_sys::GetLockConflicts(&self.tag, Mode::Exclusive.lockmode(), &mut count);
            for i in 0..count as usize {
                let proc_ = compat::vxid_proc(&*vxids.add(i));
                if !proc_.is_null() && proc_ != pg_sys::MyProc {
                    pg_sys::SetLatch(&mut (*proc_).procLatch);
                }
            }
        }
    }
}

unsafe extern "C-unwind" {
    // common/hashfn.h: the hash behind hashtext(); not in pgrx's bindings.
    fn hash_bytes(k: *const u8, keylen: std::ffi::c_int) -> u32;
}
