//! The waiter registry behind `fenced_lock_waiters`: one slot per backend,
//! in which a waiting `fenced_lock_acquire` publishes what it waits for
//! (docs/design.md, "Observability").
//!
//! A waiter cannot publish through a table: its transaction is still open.
//! So the slots live in a dynamic shared memory segment that the first
//! backend to need it creates, pins for the life of the server, and
//! announces in `pg_dynshmem/fenced_lock.registry` (its handle and a random
//! cookie that the segment's header repeats, so that a stale file left by a
//! crash is recognized). This needs no `shared_preload_libraries`.
//!
//! Each backend writes only its own slot (indexed by its PGPROC number),
//! under a sequence counter that readers check before and after copying a
//! slot (a seqlock), so nobody ever waits for anybody.

use crate::locktags::{LockTag, Mode};
use crate::mode::LeaseMode;
use pgrx::pg_sys;
use std::cell::Cell;
use std::sync::atomic::{fence, AtomicU32, Ordering};

// "FLREGIS3": 0.3.0 added the mode to each slot. A backend of this library
// never attaches a segment of another layout (a server not restarted since
// an older library created it): it makes its own.
const MAGIC: u64 = 0x464C_5245_4749_5333;
const FILE: &str = "pg_dynshmem/fenced_lock.registry";
const NAME_CAP: usize = crate::errors::MAX_NAME_BYTES;
const HOLDER_CAP: usize = crate::errors::MAX_HOLDER_BYTES;

#[repr(C)]
struct Header {
    magic: u64,
    cookie: u64,
    slots: u32,
    _pad: u32,
}

/// What a slot's backend is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Stage {
    Empty = 0,
    /// queued behind the head of the line
    Queued = 1,
    /// at the head of the line, watching the lease
    Head = 2,
}

#[repr(C)]
struct Slot {
    /// odd while its backend rewrites the slot
    seq: AtomicU32,
    stage: u32,
    pid: i32,
    database: u32,
    owner: u32,
    name_len: u32,
    /// -1 for a NULL holder
    holder_len: i32,
    /// what it asked for: `shared` and `permits`, as stored in a record
    shared: u32,
    permits: i32,
    _pad: u32,
    waiting_since: i64,
    name: [u8; NAME_CAP],
    holder: [u8; HOLDER_CAP],
}

/// A copy of one published waiter.
#[derive(Debug, Clone)]
pub struct Waiter {
    pub stage: Stage,
    pub pid: i32,
    pub database: pg_sys::Oid,
    pub owner: pg_sys::Oid,
    pub name: String,
    pub holder: Option<String>,
    pub waiting_since: i64,
    pub mode: LeaseMode,
}

thread_local! {
    /// The attached segment's header, once attached (mapped for the backend's life).
    static SEGMENT: Cell<*mut Header> = const { Cell::new(std::ptr::null_mut()) };
    /// This backend has published something in its slot.
    static PUBLISHED: Cell<bool> = const { Cell::new(false) };
}

fn slot_count() -> u32 {
    // SAFETY: MaxBackends is fixed once the server runs; every client backend
    // and background worker has a PGPROC number below it.
    unsafe { pg_sys::MaxBackends as u32 }
}

fn segment_size(slots: u32) -> usize {
    std::mem::size_of::<Header>() + slots as usize * std::mem::size_of::<Slot>()
}

/// # Safety
/// `header` is an attached registry segment.
unsafe fn slot(header: *mut Header, i: u32) -> *mut Slot {
    // SAFETY: the slots follow the header, `slots` of them.
    unsafe { (header.add(1) as *mut Slot).add(i as usize) }
}

/// (handle, cookie) from the announcement file, if it is there.
fn read_file() -> Option<(u32, u64)> {
    let bytes = std::fs::read(FILE).ok()?;
    let bytes: [u8; 16] = bytes.get(..16)?.try_into().ok()?;
    Some((
        u32::from_le_bytes(bytes[0..4].try_into().ok()?),
        u64::from_le_bytes(bytes[8..16].try_into().ok()?),
    ))
}

fn write_file(handle: u32, cookie: u64) -> std::io::Result<()> {
    let mut bytes = [0u8; 16];
    bytes[0..4].copy_from_slice(&handle.to_le_bytes());
    bytes[8..16].copy_from_slice(&cookie.to_le_bytes());
    let tmp = format!("{FILE}.tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, FILE)
}

/// Attach the segment the file names, if it is a live registry segment.
fn attach_announced() -> Option<*mut Header> {
    let (handle, cookie) = read_file()?;
    // SAFETY: dsm_attach returns NULL for a handle that names no live
    // segment; a live segment of someone else's is told apart by its header
    // (at least a Header long, since every DSM segment is page-sized or more).
    unsafe {
        let seg = pg_sys::dsm_attach(handle);
        if seg.is_null() {
            return None;
        }
        let header = pg_sys::dsm_segment_address(seg) as *mut Header;
        if pg_sys::dsm_segment_map_length(seg) >= segment_size(0)
            && (*header).magic == MAGIC
            && (*header).cookie == cookie
            && pg_sys::dsm_segment_map_length(seg) >= segment_size((*header).slots)
        {
            pg_sys::dsm_pin_mapping(seg);
            Some(header)
        } else {
            pg_sys::dsm_detach(seg);
            None
        }
    }
}

/// Create, pin and announce a new segment. Called under the registry lock.
fn create() -> Option<*mut Header> {
    let slots = slot_count();
    // SAFETY: a new segment, zeroed (every slot Empty) before it is announced.
    unsafe {
        let seg = pg_sys::dsm_create(segment_size(slots), 0);
        let header = pg_sys::dsm_segment_address(seg) as *mut Header;
        std::ptr::write_bytes(header as *mut u8, 0, segment_size(slots));
        let mut cookie = 0u64;
        if !pg_sys::pg_strong_random(&mut cookie as *mut u64 as *mut std::ffi::c_void, 8) {
            cookie = pg_sys::GetCurrentTimestamp() as u64 ^ ((pg_sys::MyProcPid as u64) << 32);
        }
        *header = Header { magic: MAGIC, cookie, slots, _pad: 0 };
        pg_sys::dsm_pin_segment(seg);
        pg_sys::dsm_pin_mapping(seg);
        if write_file(pg_sys::dsm_segment_handle(seg), cookie).is_err() {
            pgrx::warning!("fenced_lock: could not write {FILE}; fenced_lock_waiters will miss waiters");
        }
        Some(header)
    }
}

/// The registry segment, attached (and created if nobody has yet).
fn segment() -> Option<*mut Header> {
    let known = SEGMENT.with(|s| s.get());
    if !known.is_null() {
        return Some(known);
    }
    let header = attach_announced().or_else(|| {
        let lock = LockTag::registry();
        lock.lock(Mode::Exclusive);
        let header = attach_announced().or_else(create);
        lock.unlock(Mode::Exclusive);
        header
    })?;
    SEGMENT.with(|s| s.set(header));
    Some(header)
}

fn my_slot() -> Option<*mut Slot> {
    let header = segment()?;
    let i = crate::compat::my_proc_number();
    // SAFETY: `header` is attached; `i` is checked against its slot count.
    unsafe { (i < (*header).slots).then(|| slot(header, i)) }
}

/// Rewrite this backend's slot.
fn publish(write: impl FnOnce(&mut Slot)) {
    let Some(s) = my_slot() else { return };
    // SAFETY: only this backend writes its slot; readers retry while the
    // counter is odd or has moved.
    unsafe {
        (*s).seq.fetch_add(1, Ordering::AcqRel);
        fence(Ordering::Release);
        write(&mut *s);
        (*s).seq.fetch_add(1, Ordering::Release);
    }
    PUBLISHED.with(|p| p.set(true));
}

/// This backend starts waiting for `name`, in `mode`.
pub fn enter(name: &str, holder: Option<&str>, owner: pg_sys::Oid, waiting_since: i64, mode: LeaseMode) {
    publish(|s| {
        s.stage = Stage::Queued as u32;
        s.shared = mode.shared() as u32;
        s.permits = mode.permits();
        // SAFETY: plain accessors.
        unsafe {
            s.pid = pg_sys::MyProcPid;
            s.database = pg_sys::MyDatabaseId.into();
        }
        s.owner = owner.into();
        s.waiting_since = waiting_since;
        let n = name.len().min(NAME_CAP);
        s.name[..n].copy_from_slice(&name.as_bytes()[..n]);
        s.name_len = n as u32;
        match holder {
            Some(h) => {
                let n = h.len().min(HOLDER_CAP);
                s.holder[..n].copy_from_slice(&h.as_bytes()[..n]);
                s.holder_len = n as i32;
            }
            None => s.holder_len = -1,
        }
    });
}

/// This backend reached the head of the line.
pub fn at_head() {
    publish(|s| s.stage = Stage::Head as u32);
}

/// This backend no longer waits (granted, timed out, cancelled, failed).
pub fn leave() {
    if PUBLISHED.with(|p| p.replace(false)) {
        publish(|s| s.stage = Stage::Empty as u32);
        PUBLISHED.with(|p| p.set(false));
    }
}

/// A consistent copy of every published waiter.
pub fn waiters() -> Vec<Waiter> {
    let Some(header) = segment() else { return Vec::new() };
    let mut out = Vec::new();
    // SAFETY: the segment stays mapped; each slot is copied with volatile
    // reads and kept only if its counter was even and unchanged around them.
    unsafe {
        for i in 0..(*header).slots {
            let s = slot(header, i);
            for _ in 0..100 {
                let before = (*s).seq.load(Ordering::Acquire);
                if before % 2 == 1 {
                    std::hint::spin_loop();
                    continue;
                }
                let copy: Slot = std::ptr::read_volatile(s);
                fence(Ordering::Acquire);
                if (*s).seq.load(Ordering::Relaxed) != before {
                    continue;
                }
                if let Some(w) = waiter_of(&copy) {
                    out.push(w);
                }
                break;
            }
        }
    }
    out
}

fn waiter_of(s: &Slot) -> Option<Waiter> {
    let stage = match s.stage {
        1 => Stage::Queued,
        2 => Stage::Head,
        _ => return None,
    };
    let name = String::from_utf8_lossy(&s.name[..(s.name_len as usize).min(NAME_CAP)]).into_owned();
    let holder = (s.holder_len >= 0)
        .then(|| String::from_utf8_lossy(&s.holder[..(s.holder_len as usize).min(HOLDER_CAP)]).into_owned());
    Some(Waiter {
        stage,
        pid: s.pid,
        database: pg_sys::Oid::from(s.database),
        owner: pg_sys::Oid::from(s.owner),
        name,
        holder,
        waiting_since: s.waiting_since,
        mode: LeaseMode::stored(s.shared != 0, s.permits),
    })
}

/// Rank waiters of one name: the head first, then the others in the order
/// the lock manager will serve them (`pids_ahead(pid)` lists the pids queued
/// before `pid`). Returns (index into `waiters`, position).
pub fn positions(waiters: &[&Waiter], pids_ahead: impl Fn(i32) -> Vec<i32>) -> Vec<(usize, i32)> {
    let heads = waiters.iter().filter(|w| w.stage == Stage::Head).count() as i32;
    let queued: Vec<i32> = waiters.iter().filter(|w| w.stage == Stage::Queued).map(|w| w.pid).collect();
    waiters
        .iter()
        .enumerate()
        .map(|(i, w)| match w.stage {
            Stage::Head => (i, 1),
            _ => {
                let ahead =
                    pids_ahead(w.pid).iter().filter(|p| **p != w.pid && queued.contains(p)).count() as i32;
                (i, heads + ahead + 1)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(pid: i32, stage: Stage) -> Waiter {
        Waiter {
            stage,
            pid,
            database: pg_sys::Oid::from(1),
            owner: pg_sys::Oid::from(10),
            name: "n".into(),
            holder: None,
            waiting_since: 0,
            mode: LeaseMode::Exclusive,
        }
    }

    #[test]
    fn the_head_is_first_and_the_queue_follows_the_lock_managers_order() {
        let all = [w(30, Stage::Queued), w(10, Stage::Head), w(20, Stage::Queued)];
        let refs: Vec<&Waiter> = all.iter().collect();
        // 20 was queued before 30; 99 is some other process in the lock's queue
        let ahead = |pid| if pid == 30 { vec![20, 99] } else { vec![] };
        let mut got = positions(&refs, ahead);
        got.sort();
        assert_eq!(got, vec![(0, 3), (1, 1), (2, 2)]);
    }

    #[test]
    fn without_a_head_the_first_in_line_is_served_next() {
        let all = [w(20, Stage::Queued), w(30, Stage::Queued)];
        let refs: Vec<&Waiter> = all.iter().collect();
        let got = positions(&refs, |pid| if pid == 30 { vec![20] } else { vec![] });
        assert_eq!(got, vec![(0, 1), (1, 2)]);
    }

    #[test]
    fn a_slot_is_large_enough_for_the_longest_name_and_holder() {
        // SAFETY: a Slot is plain integers and byte arrays: all zeroes is a valid (empty) slot.
        let mut s: Slot = unsafe { std::mem::zeroed() };
        s.stage = Stage::Queued as u32;
        s.name_len = NAME_CAP as u32;
        s.holder_len = -1;
        let got = waiter_of(&s).unwrap();
        assert_eq!(got.name.len(), NAME_CAP);
        assert_eq!(got.holder, None);
    }
}
