package io.github.fencedlock;

import java.net.URLDecoder;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

/**
 * A connection string as libpq reads it (a {@code postgresql://} URL or {@code key=value} pairs),
 * or a {@code jdbc:postgresql:} URL, turned into what PgJDBC takes: a JDBC URL and properties.
 * PgJDBC silently ignores properties it does not know, so a libpq parameter it cannot honour is
 * refused here rather than dropped (a {@code passfile} that is never read, a {@code service} that
 * is never looked up would connect somewhere else, or as someone else, than the string says).
 */
final class Dsn {
  final String url;
  final Properties properties;

  private Dsn(String url, Properties properties) {
    this.url = url;
    this.properties = properties;
  }

  /** libpq parameters and the PgJDBC property each one becomes. */
  private static final Map<String, String> RENAMED = Map.ofEntries(
      Map.entry("user", "user"),
      Map.entry("password", "password"),
      Map.entry("application_name", "ApplicationName"),
      Map.entry("connect_timeout", "connectTimeout"),
      Map.entry("options", "options"),
      Map.entry("sslmode", "sslmode"),
      Map.entry("sslcert", "sslcert"),
      Map.entry("sslkey", "sslkey"),
      Map.entry("sslrootcert", "sslrootcert"),
      Map.entry("sslpassword", "sslpassword"),
      Map.entry("gssencmode", "gssEncMode"),
      Map.entry("channel_binding", "channelBinding"));

  /** libpq parameters PgJDBC has no way to honour. */
  private static final List<String> UNSUPPORTED = List.of(
      "hostaddr", "service", "passfile", "sslcrl", "sslcrldir", "sslcompression", "sslsni",
      "requirepeer", "krbsrvname", "gsslib", "replication", "fallback_application_name",
      "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout",
      "require_auth", "ssl_min_protocol_version", "ssl_max_protocol_version", "load_balance_hosts");

  static Dsn parse(String dsn) throws InvalidArgumentException {
    if (dsn == null) {
      throw InvalidArgumentException.argument("dsn", "must not be null");
    }
    String s = dsn.trim();
    if (s.isEmpty()) {
      throw InvalidArgumentException.argument("dsn", "must not be empty");
    }
    if (s.startsWith("jdbc:postgresql:")) {
      return new Dsn(s, new Properties());
    }
    Map<String, String> params;
    if (s.startsWith("postgresql://") || s.startsWith("postgres://")) {
      params = parseUrl(s);
    } else if (s.contains("=")) {
      params = parseKeywords(s);
    } else {
      throw InvalidArgumentException.argument("dsn",
          "expected a postgresql:// URL, key=value pairs or a jdbc:postgresql: URL");
    }
    return fromParams(params);
  }

  private static Map<String, String> parseUrl(String s) throws InvalidArgumentException {
    Map<String, String> params = new LinkedHashMap<>();
    String rest = s.substring(s.indexOf("://") + 3);
    int q = rest.indexOf('?');
    String query = q >= 0 ? rest.substring(q + 1) : "";
    rest = q >= 0 ? rest.substring(0, q) : rest;
    int slash = rest.indexOf('/');
    String authority = slash >= 0 ? rest.substring(0, slash) : rest;
    if (slash >= 0 && slash + 1 < rest.length()) {
      params.put("dbname", decode(rest.substring(slash + 1)));
    }
    int at = authority.lastIndexOf('@');
    if (at >= 0) {
      String userinfo = authority.substring(0, at);
      authority = authority.substring(at + 1);
      int colon = userinfo.indexOf(':');
      if (colon >= 0) {
        params.put("user", decode(userinfo.substring(0, colon)));
        params.put("password", decode(userinfo.substring(colon + 1)));
      } else if (!userinfo.isEmpty()) {
        params.put("user", decode(userinfo));
      }
    }
    if (!authority.isEmpty()) {
      List<String> hosts = new ArrayList<>();
      List<String> ports = new ArrayList<>();
      for (String hp : authority.split(",", -1)) {
        String host;
        String port = "";
        if (hp.startsWith("[")) {
          int close = hp.indexOf(']');
          if (close < 0) {
            throw InvalidArgumentException.argument("dsn", "unclosed [ in host \"" + hp + "\"");
          }
          host = hp.substring(1, close);
          if (hp.length() > close + 1) {
            if (hp.charAt(close + 1) != ':') {
              throw InvalidArgumentException.argument("dsn", "bad host \"" + hp + "\"");
            }
            port = hp.substring(close + 2);
          }
        } else {
          int colon = hp.lastIndexOf(':');
          host = colon >= 0 ? hp.substring(0, colon) : hp;
          port = colon >= 0 ? hp.substring(colon + 1) : "";
        }
        hosts.add(decode(host));
        ports.add(port);
      }
      params.put("host", String.join(",", hosts));
      if (ports.stream().anyMatch(p -> !p.isEmpty())) {
        params.put("port", String.join(",", ports));
      }
    }
    if (!query.isEmpty()) {
      for (String pair : query.split("&")) {
        if (pair.isEmpty()) {
          continue;
        }
        int eq = pair.indexOf('=');
        if (eq <= 0) {
          throw InvalidArgumentException.argument("dsn", "bad URL parameter \"" + pair + "\"");
        }
        params.put(decode(pair.substring(0, eq)), decode(pair.substring(eq + 1)));
      }
    }
    return params;
  }

  private static String decode(String s) throws InvalidArgumentException {
    try {
      // URLDecoder would also turn '+' into a space, which a URL path and userinfo do not mean.
      return URLDecoder.decode(s.replace("+", "%2B"), StandardCharsets.UTF_8);
    } catch (IllegalArgumentException e) {
      throw InvalidArgumentException.argument("dsn", "bad percent-encoding in \"" + s + "\"");
    }
  }

  /** libpq's keyword/value syntax: {@code key = value}, values optionally in single quotes. */
  private static Map<String, String> parseKeywords(String s) throws InvalidArgumentException {
    Map<String, String> params = new LinkedHashMap<>();
    int i = 0;
    int n = s.length();
    while (true) {
      while (i < n && Character.isWhitespace(s.charAt(i))) {
        i++;
      }
      if (i >= n) {
        break;
      }
      int keyStart = i;
      while (i < n && s.charAt(i) != '=' && !Character.isWhitespace(s.charAt(i))) {
        i++;
      }
      String key = s.substring(keyStart, i);
      while (i < n && Character.isWhitespace(s.charAt(i))) {
        i++;
      }
      if (key.isEmpty() || i >= n || s.charAt(i) != '=') {
        throw InvalidArgumentException.argument("dsn", "missing \"=\" after \"" + key + "\"");
      }
      i++;
      while (i < n && Character.isWhitespace(s.charAt(i))) {
        i++;
      }
      StringBuilder value = new StringBuilder();
      if (i < n && s.charAt(i) == '\'') {
        i++;
        boolean closed = false;
        while (i < n) {
          char c = s.charAt(i++);
          if (c == '\\' && i < n) {
            value.append(s.charAt(i++));
          } else if (c == '\'') {
            closed = true;
            break;
          } else {
            value.append(c);
          }
        }
        if (!closed) {
          throw InvalidArgumentException.argument("dsn", "unterminated quoted value of \"" + key + "\"");
        }
      } else {
        while (i < n && !Character.isWhitespace(s.charAt(i))) {
          char c = s.charAt(i++);
          if (c == '\\' && i < n) {
            value.append(s.charAt(i++));
          } else {
            value.append(c);
          }
        }
      }
      params.put(key, value.toString());
    }
    return params;
  }

  private static Dsn fromParams(Map<String, String> params) throws InvalidArgumentException {
    Properties props = new Properties();
    String host = null;
    String port = null;
    String dbname = null;
    for (Map.Entry<String, String> e : params.entrySet()) {
      String key = e.getKey();
      String value = e.getValue();
      if (UNSUPPORTED.contains(key)) {
        throw InvalidArgumentException.argument("dsn", "libpq parameter \"" + key + "\" is not supported by PgJDBC");
      }
      switch (key) {
        case "host":
          host = value;
          break;
        case "port":
          port = value;
          break;
        case "dbname":
          dbname = value;
          break;
        case "target_session_attrs":
          props.setProperty("targetServerType", targetServerType(value));
          break;
        case "keepalives":
          props.setProperty("tcpKeepAlive", "0".equals(value) ? "false" : "true");
          break;
        default:
          // A libpq name PgJDBC spells otherwise is renamed; anything else is taken to be a
          // PgJDBC property (prepareThreshold, socketTimeout, tcpKeepAlive, ...).
          props.setProperty(RENAMED.getOrDefault(key, key), value);
      }
    }
    // libpq's defaults, from the environment as libpq takes them.
    if (host == null || host.isEmpty()) {
      host = env("PGHOST", "localhost");
    }
    if (port == null || port.isEmpty()) {
      port = env("PGPORT", "5432");
    }
    if (!props.containsKey("user")) {
      props.setProperty("user", env("PGUSER", System.getProperty("user.name")));
    }
    if (!props.containsKey("password") && System.getenv("PGPASSWORD") != null) {
      props.setProperty("password", System.getenv("PGPASSWORD"));
    }
    if (dbname == null || dbname.isEmpty()) {
      dbname = env("PGDATABASE", props.getProperty("user"));
    }
    String[] hosts = host.split(",", -1);
    String[] ports = port.split(",", -1);
    if (ports.length != 1 && ports.length != hosts.length) {
      throw InvalidArgumentException.argument("dsn", hosts.length + " hosts but " + ports.length + " ports");
    }
    StringBuilder url = new StringBuilder("jdbc:postgresql://");
    for (int i = 0; i < hosts.length; i++) {
      String h = hosts[i].isEmpty() ? "localhost" : hosts[i];
      if (h.startsWith("/") || h.startsWith("@")) {
        throw InvalidArgumentException.argument("dsn", "Unix-domain sockets (host \"" + h
            + "\") are not supported by PgJDBC; connect over TCP");
      }
      String p = ports.length == 1 ? ports[0] : ports[i];
      p = p.isEmpty() ? "5432" : p;
      if (!p.chars().allMatch(Character::isDigit)) {
        throw InvalidArgumentException.argument("dsn", "bad port \"" + p + "\"");
      }
      if (i > 0) {
        url.append(',');
      }
      url.append(h.contains(":") ? "[" + h + "]" : h).append(':').append(p);
    }
    url.append('/').append(URLEncoder.encode(dbname, StandardCharsets.UTF_8).replace("+", "%20"));
    return new Dsn(url.toString(), props);
  }

  private static String targetServerType(String attrs) throws InvalidArgumentException {
    switch (attrs) {
      case "any":
        return "any";
      case "read-write":
      case "primary":
        return "primary";
      case "read-only":
      case "standby":
        return "secondary";
      case "prefer-standby":
        return "preferSecondary";
      default:
        throw InvalidArgumentException.argument("dsn", "bad target_session_attrs \"" + attrs + "\"");
    }
  }

  private static String env(String name, String fallback) {
    String v = System.getenv(name);
    return v == null || v.isEmpty() ? fallback : v;
  }
}
