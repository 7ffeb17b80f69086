package io.github.fencedlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import org.junit.jupiter.api.Test;

/** Connection strings as libpq reads them, turned into PgJDBC's URL and properties (no server needed). */
class DsnTest {
  @Test
  void aPostgresqlUrlBecomesAJdbcUrlWithItsUserPasswordAndParameters() throws Exception {
    Dsn d = Dsn.parse("postgresql://app:s%40cr%2Bt@db.example.com:6432/shop%20db?sslmode=require"
        + "&application_name=billing&connect_timeout=5&target_session_attrs=read-write&prepareThreshold=0");
    assertEquals("jdbc:postgresql://db.example.com:6432/shop%20db", d.url);
    assertEquals("app", d.properties.getProperty("user"));
    assertEquals("s@cr+t", d.properties.getProperty("password"));
    assertEquals("require", d.properties.getProperty("sslmode"));
    assertEquals("billing", d.properties.getProperty("ApplicationName"));
    assertEquals("5", d.properties.getProperty("connectTimeout"));
    assertEquals("primary", d.properties.getProperty("targetServerType"));
    assertEquals("0", d.properties.getProperty("prepareThreshold"), "PgJDBC's own parameters pass through");
  }

  @Test
  void severalHostsAndIpv6AddressesAreKept() throws Exception {
    assertEquals("jdbc:postgresql://a:5432,b:5433/x", Dsn.parse("postgresql://u@a,b:5433/x").url);
    assertEquals("jdbc:postgresql://[::1]:5499/x", Dsn.parse("postgresql://u@[::1]:5499/x").url);
    assertEquals("jdbc:postgresql://a:1,b:2/x", Dsn.parse("host=a,b port=1,2 dbname=x user=u").url);
  }

  @Test
  void keywordValuePairsWithQuotesAndEscapes() throws Exception {
    Dsn d = Dsn.parse("host=127.0.0.1 port = 6543 dbname=postgres user=postgres password='it\\'s a secret' options='-c x=1'");
    assertEquals("jdbc:postgresql://127.0.0.1:6543/postgres", d.url);
    assertEquals("it's a secret", d.properties.getProperty("password"));
    assertEquals("-c x=1", d.properties.getProperty("options"));
  }

  @Test
  void theDatabaseDefaultsToTheUserAsInLibpq() throws Exception {
    Dsn d = Dsn.parse("postgresql://someone@localhost");
    assertTrue(d.url.endsWith("/" + (System.getenv("PGDATABASE") != null ? System.getenv("PGDATABASE") : "someone")), d.url);
  }

  @Test
  void aJdbcUrlIsTakenAsItIs() throws Exception {
    assertEquals("jdbc:postgresql://h/db?user=x", Dsn.parse("jdbc:postgresql://h/db?user=x").url);
  }

  @Test
  void whatPgjdbcCannotHonourIsRefusedNotDropped() {
    for (String bad : new String[] {"postgresql://h/db?passfile=/x", "service=prod", "host=/tmp dbname=x",
        "postgresql://h/db?target_session_attrs=whatever", "postgresql://a,b/db?port=1,2,3"}) {
      InvalidArgumentException e = assertThrows(InvalidArgumentException.class, () -> Dsn.parse(bad), bad);
      assertTrue(e.getMessage().startsWith("dsn: "), e.getMessage());
    }
  }

  @Test
  void intervalsAreSentToTheMicrosecond() {
    assertEquals("30.000000 seconds", FencedLock.interval(Duration.ofSeconds(30)));
    assertEquals("1.500000 seconds", FencedLock.interval(Duration.ofMillis(1500)));
    assertEquals("0.000001 seconds", FencedLock.interval(Duration.ofNanos(1999)));
    assertEquals("86400.000000 seconds", FencedLock.interval(Duration.ofDays(1)));
  }
}
