//! What a lease and its keepalive share: where the lease stands, its
//! deadline, and the lost signal.

use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

pub(crate) const LIVE: u8 = 0;
pub(crate) const RELEASING: u8 = 1;
pub(crate) const RELEASED: u8 = 2;
pub(crate) const LOST: u8 = 3;
pub(crate) const ABANDONED: u8 = 4;

/// Where a lease stands, as the client knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Granted, and (as far as the client knows) not ended.
    Live,
    /// Released by this client (see [`crate::Lease::release`]).
    Released,
    /// Lost: a renew said it had ended, or its deadline passed before a
    /// renew succeeded. Stop the work; do not write.
    Lost,
    /// Dropped without a release by [`crate::Lease::abandon`]; it ends at
    /// its ttl.
    Abandoned,
}

/// A snapshot of a lease's state, from [`crate::Lease::status`] or
/// [`crate::Lease::watch`].
#[derive(Debug, Clone)]
pub struct LeaseStatus {
    /// Live, released, lost or abandoned.
    pub state: LeaseState,
    /// Successful renews so far (the keepalive's, [`crate::Lease::renew`]'s,
    /// and the one an acquire sends after a long wait in line).
    pub renewals: u64,
    /// The client's deadline: when the last successful renew (or the
    /// acquire) was sent, plus the ttl, on this process' monotonic clock. Never later
    /// than the server's expiry.
    pub deadline: Instant,
    /// The keepalive's last failure, cleared by its next success.
    pub keepalive_error: Option<String>,
}

/// One lease's state, shared by the [`crate::Lease`] and its keepalive task.
pub(crate) struct LeaseCore {
    pub(crate) name: String,
    pub(crate) token: i64,
    pub(crate) ttl: Duration,
    pub(crate) interval: Duration,
    pub(crate) keepalive: bool,
    pub(crate) state: AtomicU8,
    pub(crate) lost: CancellationToken,
    /// Cancelled by a release or an abandon: the keepalive sends nothing
    /// more and ends.
    pub(crate) stop: CancellationToken,
    pub(crate) status: watch::Sender<LeaseStatus>,
    /// The instant the deadline counts from (the acquire's or the last
    /// successful renew's send).
    base: Mutex<Instant>,
    pub(crate) deadline_moved: Notify,
    /// One renew at a time: the keepalive's or the caller's.
    pub(crate) renew_lock: tokio::sync::Mutex<()>,
    pub(crate) keepalive_pid: AtomicI32,
}

impl LeaseCore {
    pub(crate) fn new(
        name: String,
        token: i64,
        ttl: Duration,
        interval: Duration,
        keepalive: bool,
        base: Instant,
    ) -> LeaseCore {
        let (status, _) = watch::channel(LeaseStatus {
            state: LeaseState::Live,
            renewals: 0,
            deadline: base + ttl,
            keepalive_error: None,
        });
        LeaseCore {
            name,
            token,
            ttl,
            interval,
            keepalive,
            state: AtomicU8::new(LIVE),
            lost: CancellationToken::new(),
            stop: CancellationToken::new(),
            status,
            base: Mutex::new(base),
            deadline_moved: Notify::new(),
            renew_lock: tokio::sync::Mutex::new(()),
            keepalive_pid: AtomicI32::new(0),
        }
    }

    /// When the acquire or the last successful renew was sent.
    pub(crate) fn base(&self) -> Instant {
        *self.base.lock().unwrap()
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.base() + self.ttl
    }

    pub(crate) fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    /// From `from` to `to`, if the lease is still at `from`.
    pub(crate) fn advance(&self, from: u8, to: u8) -> bool {
        self.state.compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    pub(crate) fn publish(&self, f: impl FnOnce(&mut LeaseStatus)) {
        self.status.send_modify(f);
    }

    /// At once, exactly once, and only while live (or while a release waits
    /// for the keepalive).
    pub(crate) fn signal_lost(&self) -> bool {
        for from in [LIVE, RELEASING] {
            if self.advance(from, LOST) {
                self.publish(|s| s.state = LeaseState::Lost);
                self.lost.cancel();
                return true;
            }
        }
        false
    }

    /// A renew sent at `sent` succeeded: the deadline counts from there.
    pub(crate) fn renewed(&self, sent: Instant) {
        {
            let mut base = self.base.lock().unwrap();
            if sent > *base {
                *base = sent;
            }
        }
        let deadline = self.deadline();
        self.publish(|s| {
            s.renewals += 1;
            s.deadline = deadline;
            s.keepalive_error = None;
        });
        self.deadline_moved.notify_waiters();
    }

    pub(crate) fn finish(&self, state: u8, public: LeaseState) {
        self.state.store(state, Ordering::Release);
        self.publish(|s| s.state = public);
    }
}
