//! A byte stream wrapper that follows the PostgreSQL wire protocol in both
//! directions without changing a byte, to know what tokio-postgres does not
//! tell: the transaction status of the last `ReadyForQuery`, whether every
//! request sent has had its `ReadyForQuery` back (only then is that status
//! the connection's), and the backend's pid.
//!
//! Its shutdown also waits (bounded) for the server to close its end. The
//! backend clears its `pg_stat_activity` entry before it closes the socket,
//! so when a closed connection's driver task has finished, the session is
//! gone on the server too: "the keepalive connection is closed before
//! release returns" then holds from the server's point of view.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// How long a shutdown waits for the server to close its end.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(2);

const SSL_REQUEST: u32 = 80877103;
const GSSENC_REQUEST: u32 = 80877104;

/// What the tap has seen, shared with the [`crate::Connection`].
#[derive(Debug, Default)]
pub(crate) struct TapState {
    /// b'I', b'T' or b'E' from the last ReadyForQuery; 0 before the first.
    status: AtomicU8,
    /// ReadyForQuery messages the requests sent so far will produce.
    expected: AtomicU64,
    /// ReadyForQuery messages received.
    received: AtomicU64,
    pid: AtomicI32,
    eof: AtomicBool,
    changed: Notify,
    /// `ROLLBACK` queries written, and how many must have been written
    /// before the status is the connection's: a dropped transaction queues
    /// its ROLLBACK in the driver's channel, where the tap cannot see it
    /// until the driver writes it.
    rollbacks_written: AtomicU64,
    rollback_target: AtomicU64,
}

/// The connection's transaction status, as of the last reply to the last
/// request sent on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionStatus {
    /// Not in a transaction block.
    Idle,
    /// Inside a transaction block.
    InTransaction,
    /// Inside a failed transaction block (only ROLLBACK works).
    Failed,
    /// The connection is closed.
    Closed,
}

impl TapState {
    pub(crate) fn backend_pid(&self) -> Option<i32> {
        match self.pid.load(Ordering::Acquire) {
            0 => None,
            p => Some(p),
        }
    }

    pub(crate) fn closed(&self) -> bool {
        self.eof.load(Ordering::Acquire)
    }

    pub(crate) fn mark_closed(&self) {
        self.eof.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    fn settled(&self) -> bool {
        self.rollbacks_written.load(Ordering::Acquire) >= self.rollback_target.load(Ordering::Acquire)
            && self.received.load(Ordering::Acquire) >= self.expected.load(Ordering::Acquire)
    }

    /// Called just before a `ROLLBACK` is queued without being awaited.
    pub(crate) fn expect_rollback(&self) {
        let target = self.rollbacks_written.load(Ordering::Acquire) + 1;
        self.rollback_target.fetch_max(target, Ordering::AcqRel);
    }

    fn status_now(&self) -> TransactionStatus {
        match self.status.load(Ordering::Acquire) {
            b'T' => TransactionStatus::InTransaction,
            b'E' => TransactionStatus::Failed,
            _ => TransactionStatus::Idle,
        }
    }

    /// The status once every request sent so far has been answered (a
    /// ROLLBACK queued by a dropped transaction, for one).
    pub(crate) async fn settled_status(&self) -> TransactionStatus {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.closed() {
                return TransactionStatus::Closed;
            }
            if self.settled() {
                return self.status_now();
            }
            changed.await;
        }
    }

    /// The status if it is known without waiting.
    pub(crate) fn status_if_settled(&self) -> Option<TransactionStatus> {
        if self.closed() {
            Some(TransactionStatus::Closed)
        } else if self.settled() {
            Some(self.status_now())
        } else {
            None
        }
    }
}

/// Follows the frontend's messages: counts those that end in a
/// ReadyForQuery, and notices an SSL or GSS request (answered by one byte).
#[derive(Default)]
struct FrontendParser {
    started: bool,
    header: [u8; 8],
    header_len: usize,
    body_left: usize,
    /// The start of a Query's text, to recognize a queued ROLLBACK.
    query: Option<([u8; 9], usize)>,
}

const ROLLBACK: &[u8; 9] = b"ROLLBACK\0";

/// Follows the backend's messages: ReadyForQuery and BackendKeyData.
#[derive(Default)]
struct BackendParser {
    one_byte_answers: u32,
    header: [u8; 5],
    header_len: usize,
    body_left: usize,
    capture: [u8; 4],
    captured: usize,
}

impl FrontendParser {
    fn feed(&mut self, mut data: &[u8], be: &mut BackendParser, st: &TapState) {
        while !data.is_empty() {
            if self.body_left > 0 {
                let n = self.body_left.min(data.len());
                if let Some((buf, len)) = &mut self.query {
                    let keep = (buf.len() - *len).min(n);
                    buf[*len..*len + keep].copy_from_slice(&data[..keep]);
                    *len += keep;
                }
                self.body_left -= n;
                data = &data[n..];
                if self.body_left == 0 {
                    if let Some((buf, len)) = self.query.take() {
                        if len == ROLLBACK.len() && &buf == ROLLBACK {
                            st.rollbacks_written.fetch_add(1, Ordering::AcqRel);
                            st.changed.notify_waiters();
                        }
                    }
                }
                continue;
            }
            // Before startup a message is length + code; after it, type + length.
            let want = if self.started { 5 } else { 8 };
            let n = (want - self.header_len).min(data.len());
            self.header[self.header_len..self.header_len + n].copy_from_slice(&data[..n]);
            self.header_len += n;
            data = &data[n..];
            if self.header_len < want {
                continue;
            }
            self.header_len = 0;
            if self.started {
                let len = u32::from_be_bytes(self.header[1..5].try_into().unwrap()) as usize;
                self.body_left = len.saturating_sub(4);
                // Query and Sync (and FunctionCall) are each answered by one ReadyForQuery.
                if matches!(self.header[0], b'Q' | b'S' | b'F') {
                    st.expected.fetch_add(1, Ordering::AcqRel);
                }
                self.query = (self.header[0] == b'Q').then_some(([0; 9], 0));
            } else {
                let len = u32::from_be_bytes(self.header[0..4].try_into().unwrap()) as usize;
                let code = u32::from_be_bytes(self.header[4..8].try_into().unwrap());
                self.body_left = len.saturating_sub(8);
                if code == SSL_REQUEST || code == GSSENC_REQUEST {
                    be.one_byte_answers += 1;
                } else {
                    // The startup message: the server answers it with a ReadyForQuery.
                    self.started = true;
                    st.expected.fetch_add(1, Ordering::AcqRel);
                }
            }
        }
    }
}

impl BackendParser {
    fn feed(&mut self, mut data: &[u8], st: &TapState) {
        while !data.is_empty() {
            if self.one_byte_answers > 0 && self.header_len == 0 && self.body_left == 0 {
                self.one_byte_answers -= 1;
                data = &data[1..];
                continue;
            }
            if self.header_len < 5 {
                let n = (5 - self.header_len).min(data.len());
                self.header[self.header_len..self.header_len + n].copy_from_slice(&data[..n]);
                self.header_len += n;
                data = &data[n..];
                if self.header_len < 5 {
                    continue;
                }
                let len = u32::from_be_bytes(self.header[1..5].try_into().unwrap()) as usize;
                self.body_left = len.saturating_sub(4);
                self.captured = 0;
                if self.body_left == 0 {
                    self.finish(st);
                }
                continue;
            }
            let n = self.body_left.min(data.len());
            let keep = (self.capture.len() - self.captured).min(n);
            self.capture[self.captured..self.captured + keep].copy_from_slice(&data[..keep]);
            self.captured += keep;
            self.body_left -= n;
            data = &data[n..];
            if self.body_left == 0 {
                self.finish(st);
            }
        }
    }

    fn finish(&mut self, st: &TapState) {
        match self.header[0] {
            b'Z' if self.captured >= 1 => {
                st.status.store(self.capture[0], Ordering::Release);
                st.received.fetch_add(1, Ordering::AcqRel);
                st.changed.notify_waiters();
            }
            b'K' if self.captured >= 4 => {
                st.pid.store(i32::from_be_bytes(self.capture), Ordering::Release);
            }
            _ => {}
        }
        self.header_len = 0;
        self.body_left = 0;
    }
}

enum Shutdown {
    Open,
    Draining(Pin<Box<tokio::time::Sleep>>),
    Done,
}

/// The stream wrapper. `S` is the socket, or the TLS stream over it.
pub struct Tap<S> {
    inner: S,
    state: Arc<TapState>,
    parsing: bool,
    fe: FrontendParser,
    be: BackendParser,
    shutdown: Shutdown,
}

impl<S> Tap<S> {
    pub(crate) fn new(inner: S, state: Arc<TapState>) -> Tap<S> {
        Tap {
            inner,
            state,
            parsing: true,
            fe: FrontendParser::default(),
            be: BackendParser::default(),
            shutdown: Shutdown::Open,
        }
    }

    /// TLS takes over this stream: what passes here from now on is
    /// encrypted, and the tap above the TLS stream follows the protocol.
    pub(crate) fn stop_parsing(&mut self) {
        self.parsing = false;
    }

    pub(crate) fn state(&self) -> Arc<TapState> {
        self.state.clone()
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Tap<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tap").field("inner", &self.inner).finish()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tap<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let r = ready!(Pin::new(&mut this.inner).poll_read(cx, buf));
        match &r {
            Ok(()) if buf.filled().len() == before => this.state.mark_closed(),
            Ok(()) => {
                if this.parsing {
                    this.be.feed(&buf.filled()[before..], &this.state);
                }
            }
            Err(_) => this.state.mark_closed(),
        }
        Poll::Ready(r)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Tap<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = ready!(Pin::new(&mut this.inner).poll_write(cx, data));
        if let Ok(n) = r {
            if this.parsing {
                this.fe.feed(&data[..n], &mut this.be, &this.state);
            }
        }
        Poll::Ready(r)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            match &mut this.shutdown {
                Shutdown::Open => {
                    let _ = ready!(Pin::new(&mut this.inner).poll_shutdown(cx));
                    if this.state.closed() {
                        this.shutdown = Shutdown::Done;
                    } else {
                        this.shutdown = Shutdown::Draining(Box::pin(tokio::time::sleep(SHUTDOWN_DRAIN)));
                    }
                }
                Shutdown::Draining(timer) => {
                    // Read until the server closes its end (or the bound passes).
                    if timer.as_mut().poll(cx).is_ready() {
                        this.shutdown = Shutdown::Done;
                        continue;
                    }
                    let mut scratch = [0u8; 512];
                    let mut buf = ReadBuf::new(&mut scratch);
                    match Pin::new(&mut this.inner).poll_read(cx, &mut buf) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(())) if !buf.filled().is_empty() => continue,
                        Poll::Ready(_) => {
                            this.state.mark_closed();
                            this.shutdown = Shutdown::Done;
                        }
                    }
                }
                Shutdown::Done => return Poll::Ready(Ok(())),
            }
        }
    }
}

use std::future::Future;

impl<S: tokio_postgres::tls::TlsStream + Unpin> tokio_postgres::tls::TlsStream for Tap<S> {
    fn channel_binding(&self) -> tokio_postgres::tls::ChannelBinding {
        self.inner.channel_binding()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![kind];
        v.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    fn untyped(code: u32, body: &[u8]) -> Vec<u8> {
        let mut v = ((body.len() + 8) as u32).to_be_bytes().to_vec();
        v.extend_from_slice(&code.to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn the_status_is_followed_through_any_chunking_and_an_ssl_refusal() {
        // Every way of cutting the same conversation into reads gives the same result.
        let mut front = untyped(SSL_REQUEST, &[]);
        front.extend(untyped(196608, b"user\0postgres\0\0"));
        front.extend(typed(b'Q', b"BEGIN\0"));
        front.extend(typed(b'P', b"\0SELECT 1\0\0\0"));
        front.extend(typed(b'S', &[]));
        let mut back = vec![b'N'];
        back.extend(typed(b'R', &0u32.to_be_bytes()));
        back.extend(typed(b'K', &[0, 0, 0x30, 0x39, 1, 2, 3, 4]));
        back.extend(typed(b'Z', b"I"));
        back.extend(typed(b'C', b"BEGIN\0"));
        back.extend(typed(b'Z', b"T"));
        back.extend(typed(b'E', b"SERROR\0C42601\0\0"));
        back.extend(typed(b'Z', b"E"));
        for chunk in [1, 2, 3, 5, 7, 64] {
            let st = TapState::default();
            let (mut fe, mut be) = (FrontendParser::default(), BackendParser::default());
            for c in front.chunks(chunk) {
                fe.feed(c, &mut be, &st);
            }
            assert_eq!(st.expected.load(Ordering::Relaxed), 3);
            assert!(!st.settled());
            for c in back.chunks(chunk) {
                be.feed(c, &st);
            }
            assert!(st.settled(), "chunk {chunk}");
            assert_eq!(st.status_now(), TransactionStatus::Failed, "chunk {chunk}");
            assert_eq!(st.backend_pid(), Some(12345));
            // A ROLLBACK queued but not yet written keeps the status unsettled.
            st.expect_rollback();
            assert!(!st.settled());
            for c in typed(b'Q', b"ROLLBACK\0").chunks(chunk) {
                fe.feed(c, &mut be, &st);
            }
            assert!(!st.settled());
            for c in typed(b'Z', b"I").chunks(chunk) {
                be.feed(c, &st);
            }
            assert!(st.settled());
            assert_eq!(st.status_now(), TransactionStatus::Idle);
        }
    }
}
