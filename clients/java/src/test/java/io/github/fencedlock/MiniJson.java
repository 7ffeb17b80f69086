package io.github.fencedlock;

import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Reads the examples' output: one flat JSON object per line (strings, numbers, booleans, null).
 * Strict, so that a line that is not valid JSON is noticed rather than half-read.
 */
final class MiniJson {
  private final String s;
  private int i;

  private MiniJson(String s) {
    this.s = s;
  }

  static Map<String, Object> parseObject(String line) {
    MiniJson p = new MiniJson(line);
    Map<String, Object> m = p.object();
    p.ws();
    if (p.i != p.s.length()) {
      throw p.error("trailing characters");
    }
    return m;
  }

  private Map<String, Object> object() {
    ws();
    expect('{');
    Map<String, Object> m = new LinkedHashMap<>();
    ws();
    if (peek() == '}') {
      i++;
      return m;
    }
    while (true) {
      ws();
      String key = string();
      ws();
      expect(':');
      ws();
      if (m.put(key, value()) != null) {
        throw error("duplicate key " + key);
      }
      ws();
      char c = next();
      if (c == '}') {
        return m;
      }
      if (c != ',') {
        throw error("expected , or }");
      }
    }
  }

  private Object value() {
    char c = peek();
    if (c == '"') {
      return string();
    }
    if (s.startsWith("true", i)) {
      i += 4;
      return Boolean.TRUE;
    }
    if (s.startsWith("false", i)) {
      i += 5;
      return Boolean.FALSE;
    }
    if (s.startsWith("null", i)) {
      i += 4;
      return null;
    }
    int start = i;
    while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) {
      i++;
    }
    String num = s.substring(start, i);
    if (num.isEmpty()) {
      throw error("expected a value");
    }
    try {
      if (num.contains(".") || num.contains("e") || num.contains("E")) {
        return Double.parseDouble(num);
      }
      return Long.parseLong(num);
    } catch (NumberFormatException e) {
      throw error("bad number " + num);
    }
  }

  private String string() {
    expect('"');
    StringBuilder b = new StringBuilder();
    while (true) {
      char c = next();
      if (c == '"') {
        return b.toString();
      }
      if (c < 0x20) {
        throw error("control character in a string");
      }
      if (c == '\\') {
        char e = next();
        switch (e) {
          case '"': b.append('"'); break;
          case '\\': b.append('\\'); break;
          case '/': b.append('/'); break;
          case 'b': b.append('\b'); break;
          case 'f': b.append('\f'); break;
          case 'n': b.append('\n'); break;
          case 'r': b.append('\r'); break;
          case 't': b.append('\t'); break;
          case 'u':
            if (i + 4 > s.length()) {
              throw error("short \\u escape");
            }
            b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
            i += 4;
            break;
          default:
            throw error("bad escape \\" + e);
        }
      } else {
        b.append(c);
      }
    }
  }

  private void ws() {
    while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) {
      i++;
    }
  }

  private char peek() {
    if (i >= s.length()) {
      throw error("unexpected end");
    }
    return s.charAt(i);
  }

  private char next() {
    char c = peek();
    i++;
    return c;
  }

  private void expect(char c) {
    if (next() != c) {
      throw error("expected " + c);
    }
  }

  private IllegalArgumentException error(String what) {
    return new IllegalArgumentException(what + " at " + i + " in: " + s);
  }
}
