package io.github.fencedlock;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;

/**
 * A TCP proxy on 127.0.0.1 in front of the server, whose connections can be cut the way a network
 * cuts them: bytes stop flowing both ways, nobody is told, and the sockets stay open (no reset,
 * no end of file). {@link #stallExisting()} cuts the connections open now (a NAT or firewall that
 * dropped them); {@link #stallAll()} also the ones that come after (a partition); {@link #heal()}
 * lets everything flow again, what was held back included.
 */
final class CutProxy implements AutoCloseable {
  private final ServerSocket listener;
  private final InetSocketAddress target;
  private final List<Link> links = new CopyOnWriteArrayList<>();
  private final Thread acceptor;
  private volatile boolean stallNew;
  private volatile boolean closed;

  /** One proxied connection: two pumps that forward unless stalled. */
  private final class Link {
    final Socket client;
    final Socket server;
    volatile boolean stalled;

    Link(Socket client, Socket server, boolean stalled) {
      this.client = client;
      this.server = server;
      this.stalled = stalled;
    }

    void start() {
      pump(client, server, "up");
      pump(server, client, "down");
    }

    private void pump(Socket from, Socket to, String dir) {
      Thread t = new Thread(() -> {
        byte[] buf = new byte[8192];
        try (InputStream in = from.getInputStream(); OutputStream out = to.getOutputStream()) {
          from.setSoTimeout(20); // to look at the stall flag between reads
          while (!closed) {
            if (stalled) {
              // Not reading: what is sent stays in the socket buffers, as in a cut network.
              Db.sleep(5);
              continue;
            }
            int n;
            try {
              n = in.read(buf);
            } catch (SocketTimeoutException e) {
              continue;
            }
            if (n < 0) {
              break;
            }
            while (stalled && !closed) {
              Db.sleep(5); // read just as the cut came: held back until the heal
            }
            out.write(buf, 0, n);
            out.flush();
          }
        } catch (IOException e) {
          // One side closed: close the other.
        } finally {
          closeQuietly(from);
          closeQuietly(to);
        }
      }, "cut proxy " + dir);
      t.setDaemon(true);
      t.start();
    }
  }

  CutProxy(String host, int port) throws IOException {
    target = new InetSocketAddress(host, port);
    listener = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
    acceptor = new Thread(this::accept, "cut proxy accept");
    acceptor.setDaemon(true);
    acceptor.start();
  }

  int port() {
    return listener.getLocalPort();
  }

  private void accept() {
    while (!closed) {
      try {
        Socket client = listener.accept();
        Socket server = new Socket();
        server.connect(target, 5000);
        Link link = new Link(client, server, stallNew);
        links.add(link);
        link.start();
      } catch (IOException e) {
        if (closed) {
          return;
        }
      }
    }
  }

  void stallExisting() {
    for (Link l : links) {
      l.stalled = true;
    }
  }

  void stallAll() {
    stallNew = true;
    stallExisting();
  }

  void heal() {
    stallNew = false;
    for (Link l : links) {
      l.stalled = false;
    }
  }

  @Override
  public void close() {
    closed = true;
    closeQuietly(listener);
    for (Link l : links) {
      closeQuietly(l.client);
      closeQuietly(l.server);
    }
  }

  private static void closeQuietly(AutoCloseable c) {
    try {
      c.close();
    } catch (Exception ignored) {
      // Closing a proxy's socket twice, or one the peer reset.
    }
  }
}
