package io.github.fencedlock;

import java.lang.reflect.InvocationHandler;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import java.sql.Connection;
import java.sql.SQLException;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Watches what the library does with connections: a factory that counts the connections it opens
 * and closes, each wrapped so that every statement it is asked to prepare or run is recorded. "Sends
 * nothing" is then exact: no connection opened, and no statement made on the caller's.
 */
final class Spy implements ConnectionFactory {
  /** Calls that put something on the wire (or would, on their next use). */
  private static final Set<String> SENDING = Set.of("createStatement", "prepareStatement", "prepareCall",
      "setAutoCommit", "commit", "rollback", "setTransactionIsolation", "setReadOnly", "setClientInfo",
      "setSchema", "setSavepoint", "releaseSavepoint");

  private final ConnectionFactory real;
  final AtomicInteger opened = new AtomicInteger();
  final AtomicInteger closed = new AtomicInteger();
  /** Every sending call, as "method" or "prepareStatement: SQL". */
  final List<String> sent = new CopyOnWriteArrayList<>();

  Spy(ConnectionFactory real) {
    this.real = real;
  }

  static Spy of(Db db) {
    return new Spy(db::admin);
  }

  @Override
  public Connection connect() throws SQLException {
    opened.incrementAndGet();
    return wrap(real.connect());
  }

  /** A connection that records what is sent on it, and counts its close. */
  Connection wrap(Connection c) {
    InvocationHandler h = new InvocationHandler() {
      private boolean closedOnce;

      @Override
      public Object invoke(Object proxy, Method m, Object[] args) throws Throwable {
        String name = m.getName();
        if (SENDING.contains(name)) {
          sent.add(args != null && args.length > 0 && args[0] instanceof String ? name + ": " + args[0] : name);
        }
        if (name.equals("close")) {
          synchronized (this) {
            if (!closedOnce) {
              closedOnce = true;
              closed.incrementAndGet();
            }
          }
        }
        try {
          return m.invoke(c, args);
        } catch (InvocationTargetException e) {
          throw e.getCause();
        }
      }
    };
    return (Connection) Proxy.newProxyInstance(Spy.class.getClassLoader(), new Class<?>[] {Connection.class}, h);
  }

  long sentMatching(String fragment) {
    return sent.stream().filter(s -> s.contains(fragment)).count();
  }
}
