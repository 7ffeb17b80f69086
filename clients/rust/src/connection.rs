//! [`Connection`]: a tokio-postgres connection that knows its transaction
//! status and its backend pid, and that closes completely; and how a
//! connection string becomes a `Config`.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::ops::Deref;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio::task::JoinHandle;
use tokio_postgres::config::{Host, TargetSessionAttrs};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, Config, NoTls};

use crate::error::Error;
use crate::tap::{Tap, TapState, TransactionStatus};

/// How long [`Connection::close`] waits for the connection's task.
const CLOSE_WAIT: Duration = Duration::from_secs(3);

/// A `postgresql://` URL or `key=value` string as a `Config`, or the
/// invalid-argument error naming `dsn`.
pub(crate) fn parse_dsn(dsn: &str) -> Result<Config, Error> {
    Config::from_str(dsn).map_err(|e| {
        Error::invalid_argument(
            format!("dsn: not a connection string: {e}"),
            "Give a postgresql://user@host:port/dbname URL or a key=value string.",
        )
    })
}

/// Where a connection goes when its last clone is dropped, instead of being
/// closed: back to the pool it came from. The connection hands over its
/// parts; the home decides whether they are fit to be used again.
pub(crate) trait Home: Send + Sync {
    fn give_back(self: Box<Self>, client: Client, tap: Arc<TapState>, driver: Option<JoinHandle<()>>);
}

/// The socket under a [`Connection`]: TCP or a Unix-domain socket.
#[derive(Debug)]
pub enum Socket {
    /// TCP.
    Tcp(TcpStream),
    /// A Unix-domain socket.
    Unix(UnixStream),
}

impl AsyncRead for Socket {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Socket::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_write(cx, data),
            Socket::Unix(s) => Pin::new(s).poll_write(cx, data),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_flush(cx),
            Socket::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Socket::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// The stream a TLS connector given to [`Connection::connect_tls`] wraps:
/// the socket, inside the wrapper that follows the protocol until TLS
/// takes over.
pub type RawStream = Tap<Socket>;

/// Wraps the caller's TLS connector so that the protocol is followed above
/// the encryption.
struct TapTls<T> {
    inner: T,
}

impl<T> TlsConnect<RawStream> for TapTls<T>
where
    T: TlsConnect<RawStream> + Send + 'static,
    T::Future: Send + 'static,
    T::Stream: Send + 'static,
{
    type Stream = Tap<T::Stream>;
    type Error = T::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Tap<T::Stream>, T::Error>> + Send>>;

    fn connect(self, mut stream: RawStream) -> Self::Future {
        let state = stream.state();
        stream.stop_parsing();
        let fut = self.inner.connect(stream);
        Box::pin(async move { Ok(Tap::new(fut.await?, state)) })
    }
}

struct ConnInner {
    client: Option<Client>,
    tap: Arc<TapState>,
    driver: Mutex<Option<JoinHandle<()>>>,
    home: Option<Box<dyn Home>>,
}

impl Drop for ConnInner {
    fn drop(&mut self) {
        if let (Some(home), Some(client)) = (self.home.take(), self.client.take()) {
            let driver = self.driver.lock().unwrap().take();
            home.give_back(client, self.tap.clone(), driver);
        }
    }
}

/// One PostgreSQL connection (tokio-postgres underneath), shared by
/// clones: a lease keeps a clone of the connection it was acquired on, and
/// the connection closes (or goes back to its [`crate::Pool`]) when the last
/// clone is dropped.
///
/// It derefs to [`tokio_postgres::Client`] for every query. Beyond the
/// client it knows the session's transaction status, without a round trip,
/// from the protocol's own `ReadyForQuery` messages, so that an acquire
/// inside a transaction block is refused before anything is sent, and a
/// release in a failed transaction rolls it back first.
///
/// Use [`Connection::transaction`] rather than `BEGIN` by hand where you can;
/// both are seen.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<ConnInner>,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("backend_pid", &self.backend_pid())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Deref for Connection {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client()
    }
}

impl Connection {
    /// Opens a connection without TLS (`sslmode=disable` or `prefer`; with
    /// `require`, use [`Connection::connect_tls`]).
    ///
    /// Of the settings of `config` it honours what tokio-postgres'
    /// `Config::connect` does, but for `load_balance_hosts` (hosts are
    /// tried in order): hosts and `hostaddr`s (TCP and Unix-domain), ports,
    /// `connect_timeout`, TCP keepalives, `tcp_user_timeout`,
    /// `target_session_attrs=read-write`, and the startup parameters.
    pub async fn connect(config: &Config) -> Result<Connection, Error> {
        Self::connect_with(config, |stream, _host| async move {
            config.connect_raw(stream, NoTls).await.map(|(c, conn)| {
                let driver = tokio::spawn(async move {
                    let _ = conn.await;
                });
                (c, driver)
            })
        })
        .await
    }

    /// Opens a connection with the caller's TLS connector (any
    /// `MakeTlsConnect` that is generic over the stream, such as those of
    /// `postgres-native-tls` and `tokio-postgres-rustls`).
    pub async fn connect_tls<T>(config: &Config, tls: T) -> Result<Connection, Error>
    where
        T: MakeTlsConnect<RawStream> + Clone,
        T::TlsConnect: Send + 'static,
        <T::TlsConnect as TlsConnect<RawStream>>::Future: Send + 'static,
        T::Stream: Send + 'static,
    {
        Self::connect_with(config, |stream, host: String| {
            let mut tls = tls.clone();
            async move {
                let connector = tls.make_tls_connect(&host).map_err(|e| Error::connection(e.into()))?;
                let (c, conn) = config.connect_raw(stream, TapTls { inner: connector }).await?;
                let driver = tokio::spawn(async move {
                    let _ = conn.await;
                });
                Ok::<_, Error>((c, driver))
            }
        })
        .await
    }

    async fn connect_with<F, Fut, E>(config: &Config, mut start: F) -> Result<Connection, Error>
    where
        F: FnMut(RawStream, String) -> Fut,
        Fut: Future<Output = Result<(Client, JoinHandle<()>), E>>,
        Error: From<E>,
    {
        let hosts = config.get_hosts();
        let addrs = config.get_hostaddrs();
        let count = hosts.len().max(addrs.len());
        if count == 0 {
            return Err(Error::invalid_argument(
                "connection: no host given",
                "Give host= (or a host in the URL), a TCP host or a Unix-domain socket directory.",
            ));
        }
        let ports = config.get_ports();
        let mut last: Option<Error> = None;
        for i in 0..count {
            let port = match ports.len() {
                0 => 5432,
                1 => ports[0],
                _ => *ports.get(i).unwrap_or(&5432),
            };
            let host = hosts.get(i);
            let hostname = match host {
                Some(Host::Tcp(h)) => h.clone(),
                _ => addrs.get(i).map(|a| a.to_string()).unwrap_or_default(),
            };
            let attempt = async {
                let socket = open_socket(config, host, addrs.get(i).copied(), port).await?;
                let state = Arc::new(TapState::default());
                let (client, driver) = start(Tap::new(socket, state.clone()), hostname.clone()).await?;
                let conn = Connection::from_parts(client, state, Some(driver), None);
                if config.get_target_session_attrs() == TargetSessionAttrs::ReadWrite {
                    let ro: String = conn.client().query_one("SHOW transaction_read_only", &[]).await?.get(0);
                    if ro == "on" {
                        return Err(Error::connection(format!("{hostname}:{port} is read-only")));
                    }
                }
                Ok::<_, Error>(conn)
            };
            match attempt.await {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap())
    }

    pub(crate) fn from_parts(
        client: Client,
        tap: Arc<TapState>,
        driver: Option<JoinHandle<()>>,
        home: Option<Box<dyn Home>>,
    ) -> Connection {
        Connection {
            inner: Arc::new(ConnInner { client: Some(client), tap, driver: Mutex::new(driver), home }),
        }
    }

    /// A connection just opened (it has no other clone yet), given a home
    /// to go back to instead of being closed.
    pub(crate) fn with_home(self, home: Box<dyn Home>) -> Connection {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                inner.home = Some(home);
                Connection { inner: Arc::new(inner) }
            }
            Err(_) => unreachable!("a new connection has one owner"),
        }
    }

    /// The tokio-postgres client.
    pub fn client(&self) -> &Client {
        self.inner.client.as_ref().expect("client present until drop")
    }

    /// The backend's process id (as in `pg_stat_activity.pid`).
    pub fn backend_pid(&self) -> Option<i32> {
        self.inner.tap.backend_pid()
    }

    /// The connection is closed (by either end).
    pub fn is_closed(&self) -> bool {
        self.inner.tap.closed() || self.client().is_closed()
    }

    /// The transaction status once every request already sent on this
    /// connection has been answered.
    pub async fn transaction_status(&self) -> TransactionStatus {
        if self.client().is_closed() {
            return TransactionStatus::Closed;
        }
        let settled = self.inner.tap.settled_status();
        let closed = async {
            // The driver task ends when the connection does, answered or not.
            loop {
                if self.client().is_closed() {
                    return TransactionStatus::Closed;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::select! { s = settled => s, s = closed => s }
    }

    /// `BEGIN`: a transaction on this connection, rolled back when dropped
    /// without [`Transaction::commit`].
    pub async fn transaction(&self) -> Result<Transaction<'_>, Error> {
        self.client().batch_execute("BEGIN").await?;
        Ok(Transaction { conn: self, done: false })
    }

    /// Closes the connection and waits (a few seconds at most) until the
    /// server has ended the session, if this is the last clone; otherwise
    /// just drops this clone.
    pub async fn close(self) {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                inner.home = None;
                let driver = inner.driver.lock().unwrap().take();
                drop(inner.client.take());
                if let Some(d) = driver {
                    let _ = tokio::time::timeout(CLOSE_WAIT, d).await;
                }
            }
            Err(shared) => drop(shared),
        }
    }
}

async fn open_socket(
    config: &Config,
    host: Option<&Host>,
    addr: Option<IpAddr>,
    port: u16,
) -> Result<Socket, Error> {
    let timeout = config.get_connect_timeout().copied();
    let connect = async {
        match (addr, host) {
            (Some(ip), _) => tcp(config, TcpStream::connect((ip, port)).await?),
            (None, Some(Host::Tcp(h))) => tcp(config, TcpStream::connect((h.as_str(), port)).await?),
            (None, Some(Host::Unix(dir))) => {
                Ok(Socket::Unix(UnixStream::connect(dir.join(format!(".s.PGSQL.{port}"))).await?))
            }
            (None, None) => Err(io::Error::new(io::ErrorKind::InvalidInput, "no host")),
        }
    };
    let r = match timeout {
        Some(t) => tokio::time::timeout(t, connect)
            .await
            .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, "connection timed out"))),
        None => connect.await,
    };
    r.map_err(|e| Error::connection(format!("connecting to {}: {e}", describe(host, addr, port))))
}

fn describe(host: Option<&Host>, addr: Option<IpAddr>, port: u16) -> String {
    match (addr, host) {
        (Some(ip), _) => format!("{ip}:{port}"),
        (None, Some(Host::Tcp(h))) => format!("{h}:{port}"),
        (None, Some(Host::Unix(d))) => format!("{}/.s.PGSQL.{port}", d.display()),
        _ => "?".into(),
    }
}

fn tcp(config: &Config, s: TcpStream) -> io::Result<Socket> {
    s.set_nodelay(true)?;
    let sock = SockRef::from(&s);
    if config.get_keepalives() {
        let mut ka = TcpKeepalive::new().with_time(config.get_keepalives_idle());
        if let Some(i) = config.get_keepalives_interval() {
            ka = ka.with_interval(i);
        }
        if let Some(r) = config.get_keepalives_retries() {
            ka = ka.with_retries(r);
        }
        sock.set_tcp_keepalive(&ka)?;
    }
    #[cfg(target_os = "linux")]
    if let Some(t) = config.get_tcp_user_timeout() {
        sock.set_tcp_user_timeout(Some(*t))?;
    }
    Ok(Socket::Tcp(s))
}

/// A transaction on a [`Connection`] (see [`Connection::transaction`] and
/// [`crate::Lease::transaction`]). Derefs to the client; a lease released
/// while it is open is released as part of it, at its commit.
pub struct Transaction<'c> {
    conn: &'c Connection,
    done: bool,
}

impl Deref for Transaction<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.conn.client()
    }
}

impl Transaction<'_> {
    /// `COMMIT`.
    pub async fn commit(mut self) -> Result<(), Error> {
        self.done = true;
        self.conn.client().batch_execute("COMMIT").await.map_err(Error::from)
    }

    /// `ROLLBACK`.
    pub async fn rollback(mut self) -> Result<(), Error> {
        self.done = true;
        self.conn.client().batch_execute("ROLLBACK").await.map_err(Error::from)
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.done {
            // Queued at once, as tokio-postgres' own Transaction does, so that
            // nothing sent later on this connection runs inside it.
            self.conn.inner.tap.expect_rollback();
            self.conn.client().__private_api_rollback(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connector with the bounds TLS crates put on the stream (those of
    /// postgres-native-tls' `MakeTlsConnector`): `connect_tls` must accept
    /// it. (Compiled, not run: no TLS server here.)
    #[derive(Clone)]
    struct GenericConnector;

    impl<S> MakeTlsConnect<S> for GenericConnector
    where
        S: AsyncRead + AsyncWrite + Unpin + fmt::Debug + Send + Sync + 'static,
    {
        type Stream = tokio_postgres::tls::NoTlsStream;
        type TlsConnect = NoTls;
        type Error = std::io::Error;
        fn make_tls_connect(&mut self, _domain: &str) -> Result<NoTls, std::io::Error> {
            Ok(NoTls)
        }
    }

    #[allow(dead_code)]
    async fn connect_tls_accepts_a_connector_generic_over_the_stream(config: Config) {
        let _ = Connection::connect_tls(&config, GenericConnector).await;
    }
}
