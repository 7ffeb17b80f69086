package io.github.fencedlock.internal;

import java.io.IOException;
import java.io.InputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.util.concurrent.TimeUnit;
import javax.net.SocketFactory;

/**
 * Not an API: public only because PgJDBC instantiates its {@code socketFactory} by class name.
 *
 * <p>The sockets of keepalive connections opened from a connection string. A keepalive closed
 * gracefully (its lease released or lost) sends PostgreSQL's terminate message, half-closes, and
 * waits (at most a second) for the server's end of file, which comes when the backend process has
 * exited: so when {@code release} returns, the keepalive's backend is gone from the server, not
 * just from the client, and {@code pg_stat_activity} no longer lists it.
 */
public final class KeepaliveSocketFactory extends SocketFactory {
  private static final ThreadLocal<WaitingSocket> LAST = new ThreadLocal<>();

  public KeepaliveSocketFactory() {}

  /** The socket this thread's factory made last, forgotten once taken. */
  public static WaitingSocket takeLast() {
    WaitingSocket s = LAST.get();
    LAST.remove();
    return s;
  }

  @Override
  public Socket createSocket() {
    WaitingSocket s = new WaitingSocket();
    LAST.set(s);
    return s;
  }

  @Override
  public Socket createSocket(String host, int port) throws IOException {
    Socket s = createSocket();
    s.connect(new InetSocketAddress(host, port));
    return s;
  }

  @Override
  public Socket createSocket(String host, int port, InetAddress localHost, int localPort) throws IOException {
    Socket s = createSocket();
    s.bind(new InetSocketAddress(localHost, localPort));
    s.connect(new InetSocketAddress(host, port));
    return s;
  }

  @Override
  public Socket createSocket(InetAddress host, int port) throws IOException {
    Socket s = createSocket();
    s.connect(new InetSocketAddress(host, port));
    return s;
  }

  @Override
  public Socket createSocket(InetAddress address, int port, InetAddress localAddress, int localPort)
      throws IOException {
    Socket s = createSocket();
    s.bind(new InetSocketAddress(localAddress, localPort));
    s.connect(new InetSocketAddress(address, port));
    return s;
  }

  /** A socket whose close can wait for the peer to close first. */
  public static final class WaitingSocket extends Socket {
    private volatile boolean awaitPeer;

    /** The next close waits (at most a second) for the server to close its end. */
    public void awaitPeerOnClose() {
      awaitPeer = true;
    }

    @Override
    public synchronized void close() throws IOException {
      if (awaitPeer && isConnected() && !isClosed() && !isInputShutdown()) {
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(1);
        try {
          shutdownOutput();
          InputStream in = getInputStream();
          byte[] buf = new byte[512];
          while (true) {
            long left = TimeUnit.NANOSECONDS.toMillis(until - System.nanoTime());
            if (left <= 0) {
              break;
            }
            setSoTimeout((int) left);
            if (in.read(buf) < 0) {
              break; // the backend has exited
            }
          }
        } catch (SocketTimeoutException e) {
          // A second is enough for a healthy server; the socket is closed anyway.
        } catch (IOException e) {
          // Reset or already closed: the peer is gone either way.
        }
      }
      super.close();
    }
  }
}
