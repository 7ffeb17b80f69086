//! One relcache invalidation callback for the whole library: modules that
//! cache something about a relation (the store's objects, the guard's
//! resolved triggers) register a plain function here and are told the
//! relation's OID (`InvalidOid`: forget everything).

use pgrx::pg_sys;
use pgrx::pg_sys::Datum;
use std::cell::RefCell;

thread_local! {
    static LISTENERS: RefCell<Vec<fn(pg_sys::Oid)>> = const { RefCell::new(Vec::new()) };
}

/// Call `listener` on every relcache invalidation in this backend. Called
/// from `_PG_init` only.
pub fn on_invalidation(listener: fn(pg_sys::Oid)) {
    let first = LISTENERS.with(|l| {
        let mut l = l.borrow_mut();
        l.push(listener);
        l.len() == 1
    });
    if first {
        // SAFETY: registered once per backend, from _PG_init.
        unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(invalidated), Datum::from(0)) };
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn invalidated(_arg: Datum, relid: pg_sys::Oid) {
    let listeners = LISTENERS.with(|l| l.borrow().clone());
    for listener in listeners {
        listener(relid);
    }
}
