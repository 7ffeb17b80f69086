package io.github.fencedlock;

import static org.junit.jupiter.api.Assertions.fail;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;

/**
 * A conformance example ({@code run-example hold|inventory ...}) run as a child process: its
 * stdout read as JSON lines, each stamped with the instant it arrived, its stderr kept in a file
 * for the failure message. {@code run-example} execs the JVM, so {@link #pid()} is the JVM's and
 * signals reach it. Every child is killed when its test ends ({@link #killAll()}).
 *
 * <p>Test classes run in parallel (junit-platform.properties), each test on one thread from its
 * start to its {@code @AfterEach}: a child belongs to the thread that started it, and only its
 * own test kills it.
 */
final class Child {
  private static final List<Child> LIVE = new CopyOnWriteArrayList<>();

  /** One JSON line of the child's stdout. */
  static final class Event {
    final Map<String, Object> fields;
    final long at; // System.nanoTime() when it was read

    Event(Map<String, Object> fields, long at) {
      this.fields = fields;
      this.at = at;
    }

    String name() {
      return (String) fields.get("event");
    }

    Object get(String key) {
      return fields.get(key);
    }

    long num(String key) {
      return ((Number) fields.get(key)).longValue();
    }

    @Override
    public String toString() {
      return fields.toString();
    }
  }

  private final Process process;
  private final Thread owner = Thread.currentThread();
  private final Path stderr;
  private final List<Event> events = Collections.synchronizedList(new ArrayList<>());
  private final List<String> badLines = new CopyOnWriteArrayList<>();
  private final Thread reader;

  private Child(Process process, Path stderr) {
    this.process = process;
    this.stderr = stderr;
    this.reader = new Thread(this::read, "child " + process.pid() + " stdout");
    this.reader.setDaemon(true);
    this.reader.start();
  }

  static Child start(String example, String... args) throws IOException {
    String dir = System.getProperty("fl.clientdir");
    if (dir == null) {
      throw new IllegalStateException("system property fl.clientdir (clients/java) is not set; run test.sh");
    }
    List<String> cmd = new ArrayList<>();
    cmd.add(dir + "/run-example");
    cmd.add(example);
    Collections.addAll(cmd, args);
    Path err = Files.createTempFile("fl_client_java_child", ".err");
    Process p = new ProcessBuilder(cmd).redirectError(err.toFile()).redirectInput(new File("/dev/null")).start();
    Child c = new Child(p, err);
    LIVE.add(c);
    return c;
  }

  private void read() {
    try (BufferedReader r = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
      String line;
      while ((line = r.readLine()) != null) {
        long at = System.nanoTime();
        try {
          events.add(new Event(MiniJson.parseObject(line), at));
        } catch (IllegalArgumentException e) {
          badLines.add(line);
        }
        synchronized (this) {
          notifyAll();
        }
      }
    } catch (IOException e) {
      // The child was killed: its stdout is closed.
    }
    synchronized (this) {
      notifyAll();
    }
  }

  long pid() {
    return process.pid();
  }

  void signal(String sig) throws IOException, InterruptedException {
    Process k = new ProcessBuilder("kill", "-" + sig, Long.toString(pid())).inheritIO().start();
    if (!k.waitFor(10, TimeUnit.SECONDS) || k.exitValue() != 0) {
      fail("kill -" + sig + " " + pid() + " failed");
    }
  }

  /** Waits for the first event matching {@code p}, from the {@code from}-th event on. */
  Event await(String what, Duration limit, int from, Predicate<Event> p) throws InterruptedException {
    long until = System.nanoTime() + limit.toNanos();
    synchronized (this) {
      while (true) {
        List<Event> snapshot = events();
        for (int i = from; i < snapshot.size(); i++) {
          if (p.test(snapshot.get(i))) {
            return snapshot.get(i);
          }
        }
        long left = until - System.nanoTime();
        if (left <= 0 || (!process.isAlive() && !reader.isAlive())) {
          fail("child " + pid() + ": no " + what + " within " + limit + "; events " + events() + describe());
        }
        wait(Math.max(1, TimeUnit.NANOSECONDS.toMillis(left)));
      }
    }
  }

  Event await(String event, Duration limit) throws InterruptedException {
    return await("\"" + event + "\" event", limit, 0, e -> event.equals(e.name()));
  }

  List<Event> events() {
    synchronized (events) {
      return new ArrayList<>(events);
    }
  }

  List<Event> events(String name) {
    List<Event> out = new ArrayList<>();
    for (Event e : events()) {
      if (name.equals(e.name())) {
        out.add(e);
      }
    }
    return out;
  }

  /** Lines of stdout that were not JSON objects: the contract allows none. */
  List<String> badLines() {
    return badLines;
  }

  /** Waits for the exit, and for stdout to be read to its end; returns the exit status. */
  int waitFor(Duration limit) throws InterruptedException {
    if (!process.waitFor(limit.toMillis(), TimeUnit.MILLISECONDS)) {
      fail("child " + pid() + " still running after " + limit + "; events " + events() + describe());
    }
    reader.join(TimeUnit.SECONDS.toMillis(10));
    return process.exitValue();
  }

  String describe() {
    try {
      return "\nstderr of " + pid() + ":\n" + Files.readString(stderr);
    } catch (IOException e) {
      return "";
    }
  }

  /**
   * Kills every child this thread's test started and that is still running (a stopped one too:
   * SIGKILL needs no SIGCONT).
   */
  static void killAll() {
    for (Child c : LIVE) {
      if (c.owner != Thread.currentThread()) {
        continue;
      }
      if (c.process.isAlive()) {
        c.process.destroyForcibly();
        try {
          c.process.waitFor(10, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
      }
      try {
        Files.deleteIfExists(c.stderr);
      } catch (IOException ignored) {
        // A temp file; the OS cleans /tmp.
      }
      LIVE.remove(c);
    }
  }
}
