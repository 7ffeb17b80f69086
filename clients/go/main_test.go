package fencedlock_test

// The suite runs against the server named by FL_DSN (a superuser
// postgresql:// URL of database postgres). It creates its own database,
// fl_client_go, with the extension, a guarded docs and inventory table and
// the roles it needs, and drops them at the end. The conformance example
// (built by test.sh, or else here) runs as a child process in the tests
// that signal it. Tests run side by side (t.Parallel), each on lock names
// and rows of its own, and each tells its own connections from the others'
// by their client ports (watched).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v4"

	fencedlock "github.com/fenced-lock/fenced_lock/clients/go"
)

const (
	testDB     = "fl_client_go"
	noExecRole = "fl_client_go_noexec"
)

var (
	adminDSN   string // FL_DSN, database postgres
	dbDSN      string // the same server, database fl_client_go
	exampleBin string
	extVersion string
	children   sync.Map // *child -> struct{}: killed at the end, whatever happened
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if h := os.Getenv("FL_GO_HELPER"); h != "" {
		return runHelper(h)
	}
	adminDSN = os.Getenv("FL_DSN")
	if adminDSN == "" {
		fmt.Fprintln(os.Stderr, "FL_DSN is not set: it names the server the suite runs against "+
			"(a superuser postgresql:// URL of database postgres); clients/go/test.sh sets it up")
		return 1
	}
	u, err := url.Parse(adminDSN)
	if err != nil || (u.Scheme != "postgresql" && u.Scheme != "postgres") {
		fmt.Fprintf(os.Stderr, "FL_DSN must be a postgresql:// URL: %v\n", err)
		return 1
	}
	u.Path = "/" + testDB
	dbDSN = u.String()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := setUp(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "setting up", testDB+":", err)
		return 1
	}
	defer tearDown()

	if exampleBin, err = example(); err != nil {
		fmt.Fprintln(os.Stderr, "building the example:", err)
		return 1
	}

	code := m.Run()
	children.Range(func(k, _ interface{}) bool {
		k.(*child).kill()
		return true
	})
	return code
}

// example is the conformance example's binary: the one test.sh built for
// clients/run (FL_GO_EXAMPLE), or else one built here, in the build
// directory rather than a temporary one, since a panicking test ends the
// process without running deferred clean-ups.
func example() (string, error) {
	if bin := os.Getenv("FL_GO_EXAMPLE"); bin != "" {
		return bin, nil
	}
	dir, err := filepath.Abs(filepath.Join(".build", "test-bin"))
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "fenced-lock-example")
	build := exec.Command("go", "build", "-o", bin, "./cmd/fenced-lock-example")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	return bin, build.Run()
}

func setUp(ctx context.Context) error {
	admin, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return err
	}
	defer admin.Close(ctx)
	for _, sql := range []string{
		"DROP DATABASE IF EXISTS " + testDB + " WITH (FORCE)",
		"DROP ROLE IF EXISTS " + noExecRole,
		"CREATE DATABASE " + testDB,
		// EXECUTE on the extension's functions is revoked from PUBLIC, so
		// a role of its own has none: the 42501 case.
		"CREATE ROLE " + noExecRole + " LOGIN",
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	db, err := pgx.Connect(ctx, dbDSN)
	if err != nil {
		return err
	}
	defer db.Close(ctx)
	for _, sql := range []string{
		"CREATE EXTENSION fenced_lock",
		`CREATE TABLE docs (id int PRIMARY KEY, body text, fence_token bigint)`,
		`CREATE TRIGGER docs_fence BEFORE INSERT OR UPDATE OR DELETE ON docs
		   FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('docs:{id}', 'fence_token')`,
		`CREATE TABLE inventory (item_id int PRIMARY KEY, stock int NOT NULL, fence_token bigint)`,
		`CREATE TRIGGER inventory_fence BEFORE INSERT OR UPDATE OR DELETE ON inventory
		   FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('inventory:{item_id}', 'fence_token')`,
	} {
		if _, err := db.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return db.QueryRow(ctx, "SELECT extversion FROM pg_extension WHERE extname = 'fenced_lock'").Scan(&extVersion)
}

func tearDown() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tear down:", err)
		return
	}
	defer admin.Close(ctx)
	for _, sql := range []string{"DROP DATABASE IF EXISTS " + testDB + " WITH (FORCE)", "DROP ROLE IF EXISTS " + noExecRole} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			fmt.Fprintln(os.Stderr, "tear down:", sql, err)
		}
	}
}

// atLeast reports whether the server's extension is version v or later.
func atLeast(v string) bool { return compareVersions(extVersion, v) >= 0 }

func needVersion(t *testing.T, v, what string) {
	t.Helper()
	if !atLeast(v) {
		t.Skipf("%s needs fenced_lock %s; the server has %s", what, v, extVersion)
	}
}

// testCtx bounds a test's every call.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// admin is a superuser connection to the test database, closed at the end.
func admin(t *testing.T) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dbDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func pgxConnect(dsn string) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return pgx.Connect(ctx, dsn)
}

func newLocker(t *testing.T, opts ...fencedlock.Option) *fencedlock.Locker {
	t.Helper()
	return newLockerDSN(t, dbDSN, opts...)
}

// newLockerDSN makes a locker of dsn whose connections are t's own
// (watched): keepalivePIDs tells them from those of the tests that run
// beside t.
func newLockerDSN(t *testing.T, dsn string, opts ...fencedlock.Option) *fencedlock.Locker {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialFunc = watched(t).dial
	lk, err := fencedlock.NewFromConfig(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return lk
}

// byTest holds each test's watched counter: t.Name() -> *counter.
var byTest sync.Map

// watched counts the connections that t's lockers open, and knows their
// client ports.
func watched(t *testing.T) *counter {
	c, _ := byTest.LoadOrStore(t.Name(), &counter{})
	return c.(*counter)
}

// lockName is unique to the test, so that no test sees another's leases.
func lockName(t *testing.T, suffix string) string {
	return "go:" + t.Name() + ":" + suffix
}

// counter counts the connections a config opens and the bytes written to
// them: "nothing sent" is a count that did not move. It also keeps their
// local ports, which the server shows as pg_stat_activity.client_port.
type counter struct {
	dials   atomic.Int64
	written atomic.Int64
	mu      sync.Mutex
	ports   []int32
}

type countingConn struct {
	net.Conn
	c *counter
}

func (cc *countingConn) Write(b []byte) (int, error) {
	n, err := cc.Conn.Write(b)
	cc.c.written.Add(int64(n))
	return n, err
}

func (c *counter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c.dials.Add(1)
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if a, ok := nc.LocalAddr().(*net.TCPAddr); ok {
		c.mu.Lock()
		c.ports = append(c.ports, int32(a.Port))
		c.mu.Unlock()
	}
	return &countingConn{nc, c}, nil
}

func (c *counter) clientPorts() []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int32(nil), c.ports...)
}

func (c *counter) config(t *testing.T) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(dbDSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialFunc = c.dial
	return cfg
}

func (c *counter) snapshot() [2]int64 { return [2]int64{c.dials.Load(), c.written.Load()} }

func one[T any](t *testing.T, conn *pgx.Conn, sql string, args ...interface{}) T {
	t.Helper()
	var v T
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := conn.QueryRow(ctx, sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func exec1(t *testing.T, conn *pgx.Conn, sql string, args ...interface{}) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// seed writes rows of a guarded table around the guard, as the
// superuser may (session_replication_role = replica skips triggers).
func seed(t *testing.T, sql string, args ...interface{}) {
	t.Helper()
	a := admin(t)
	exec1(t, a, "SET session_replication_role = replica")
	exec1(t, a, sql, args...)
}

func live(t *testing.T, conn *pgx.Conn, name string, token int64) bool {
	t.Helper()
	return one[bool](t, conn, "SELECT fenced_lock_validate($1, $2)", name, token)
}

// endedBy is how the history says the lease ended ("" while it has not).
func endedBy(t *testing.T, conn *pgx.Conn, token int64) string {
	t.Helper()
	var s *string
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := conn.QueryRow(ctx, "SELECT ended_by FROM fenced_lock_history WHERE token = $1", token).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	if s == nil {
		return ""
	}
	return *s
}

// keepalivePIDs are the backends of the keepalive connections that t's
// lockers opened (newLocker, watched).
func keepalivePIDs(t *testing.T, conn *pgx.Conn) []int32 {
	t.Helper()
	return pids(t, conn, `SELECT pid FROM pg_stat_activity
	   WHERE datname = $1 AND application_name = $2 AND client_port = ANY($3) ORDER BY pid`,
		testDB, fencedlock.KeepaliveApplicationName, watched(t).clientPorts())
}

func pids(t *testing.T, conn *pgx.Conn, sql string, args ...interface{}) []int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var pids []int32
	for rows.Next() {
		var p int32
		if err := rows.Scan(&p); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, p)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return pids
}

// eventually polls cond until it holds or the bound passes.
func eventually(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("not within %v: %s", bound, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
