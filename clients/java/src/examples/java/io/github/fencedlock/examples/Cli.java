package io.github.fencedlock.examples;

import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.sql.SQLException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * What both conformance examples share: the command line ({@code --key VALUE} or {@code
 * --key=VALUE}, flags), and JSON lines on stdout, nothing else there.
 */
final class Cli {
  /** A bad command line: exit 2. */
  static final class Usage extends Exception {
    private static final long serialVersionUID = 1L;

    Usage(String message) {
      super(message);
    }
  }

  private final Map<String, String> values;

  private Cli(Map<String, String> values) {
    this.values = values;
  }

  static Cli parse(String[] args, Set<String> required, Set<String> optional, Set<String> flags) throws Usage {
    Map<String, String> values = new HashMap<>();
    for (int i = 0; i < args.length; i++) {
      String a = args[i];
      if (!a.startsWith("--")) {
        throw new Usage("unexpected argument " + a);
      }
      String key = a.substring(2);
      String value = null;
      int eq = key.indexOf('=');
      if (eq >= 0) {
        value = key.substring(eq + 1);
        key = key.substring(0, eq);
      }
      if (flags.contains(key)) {
        if (value != null) {
          throw new Usage("--" + key + " takes no value");
        }
        value = "true";
      } else if (required.contains(key) || optional.contains(key)) {
        if (value == null) {
          if (i + 1 >= args.length) {
            throw new Usage("--" + key + " needs a value");
          }
          value = args[++i];
        }
      } else {
        throw new Usage("unknown option --" + key);
      }
      if (values.put(key, value) != null) {
        throw new Usage("--" + key + " given twice");
      }
    }
    for (String r : required) {
      if (!values.containsKey(r)) {
        throw new Usage("--" + r + " is required");
      }
    }
    return new Cli(values);
  }

  String get(String key) {
    return values.get(key);
  }

  boolean flag(String key) {
    return values.containsKey(key);
  }

  /** Seconds as a decimal number; its value (zero, negative) is for the library to judge. */
  Duration seconds(String key) throws Usage {
    String v = values.get(key);
    if (v == null) {
      return null;
    }
    double d;
    try {
      d = Double.parseDouble(v);
    } catch (NumberFormatException e) {
      throw new Usage("--" + key + ": not a number of seconds: " + v);
    }
    if (Double.isNaN(d) || Double.isInfinite(d) || Math.abs(d) > 1e9) {
      throw new Usage("--" + key + ": not a number of seconds: " + v);
    }
    return Duration.ofNanos(Math.round(d * 1e9));
  }

  Integer integer(String key) throws Usage {
    String v = values.get(key);
    if (v == null) {
      return null;
    }
    try {
      return Integer.parseInt(v);
    } catch (NumberFormatException e) {
      throw new Usage("--" + key + ": not an integer: " + v);
    }
  }

  /** JSON lines on stdout; events before {@link #open()} wait, so that "acquired" comes first. */
  static final class Out {
    private final PrintStream out =
        new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
    private final List<String> early = new ArrayList<>();
    private boolean open;

    synchronized void event(Object... keysAndValues) {
      String line = json(keysAndValues);
      if (open) {
        print(line);
      } else {
        early.add(line);
      }
    }

    /** Prints {@code first} now, then whatever waited for it. */
    synchronized void open(Object... keysAndValues) {
      print(json(keysAndValues));
      open = true;
      for (String line : early) {
        print(line);
      }
      early.clear();
    }

    /** For the end: whatever waited is printed now. */
    synchronized void flushEarly() {
      open = true;
      for (String line : early) {
        print(line);
      }
      early.clear();
    }

    synchronized void error(Throwable e) {
      String state = e instanceof SQLException ? ((SQLException) e).getSQLState() : null;
      flushEarly();
      print(json("event", "error", "sqlstate", state, "message", String.valueOf(e.getMessage())));
    }

    private void print(String line) {
      out.print(line);
      out.print('\n');
      out.flush();
    }
  }

  static String json(Object... kv) {
    Map<String, Object> m = new LinkedHashMap<>();
    for (int i = 0; i + 1 < kv.length; i += 2) {
      m.put((String) kv[i], kv[i + 1]);
    }
    StringBuilder b = new StringBuilder("{");
    boolean first = true;
    for (Map.Entry<String, Object> e : m.entrySet()) {
      if (!first) {
        b.append(',');
      }
      first = false;
      quote(b, e.getKey());
      b.append(':');
      Object v = e.getValue();
      if (v == null) {
        b.append("null");
      } else if (v instanceof Number || v instanceof Boolean) {
        b.append(v);
      } else {
        quote(b, v.toString());
      }
    }
    return b.append('}').toString();
  }

  private static void quote(StringBuilder b, String s) {
    b.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"':
          b.append("\\\"");
          break;
        case '\\':
          b.append("\\\\");
          break;
        case '\n':
          b.append("\\n");
          break;
        case '\r':
          b.append("\\r");
          break;
        case '\t':
          b.append("\\t");
          break;
        default:
          if (c < 0x20) {
            b.append(String.format("\\u%04x", (int) c));
          } else {
            b.append(c);
          }
      }
    }
    b.append('"');
  }
}
