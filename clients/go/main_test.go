package fencedlock_test

// The suite runs against the server named by FL_DSN (a superuser
// postgresql:// URL of database postgres). It creates its own database,
// fl_client_go, with the extension, a guarded docs and inventory table and
// the roles it needs, and drops them at the end. The conformance example is
// built once here and run as a child process by the tests that signal it.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
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

	// in the build directory, not a temporary one: a panicking test ends
	// the process without running deferred clean-ups
	dir, err := filepath.Abs(filepath.Join(".build", "test-bin"))
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	exampleBin = filepath.Join(dir, "fenced-lock-example")
	build := exec.Command("go", "build", "-o", exampleBin, "./cmd/fenced-lock-example")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
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

func newLockerDSN(t *testing.T, dsn string, opts ...fencedlock.Option) *fencedlock.Locker {
	t.Helper()
	lk, err := fencedlock.New(dsn, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return lk
}

// lockName is unique to the test, so that no test sees another's leases.
func lockName(t *testing.T, suffix string) string {
	return "go:" + t.Name() + ":" + suffix
}

// counter counts the connections a config opens and the bytes written to
// them: "nothing sent" is a count that did not move.
type counter struct {
	dials   atomic.Int64
	written atomic.Int64
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
	return &countingConn{nc, c}, nil
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

// keepalivePIDs are the backends of keepalive connections in the test
// database (other suites may run on the same server, in other databases).
func keepalivePIDs(t *testing.T, conn *pgx.Conn) []int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_activity
	                               WHERE datname = $1 AND application_name = $2 ORDER BY pid`,
		testDB, fencedlock.KeepaliveApplicationName)
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

// A child runs the conformance example; its JSON lines arrive with the
// instant they were read.
type child struct {
	cmd    *exec.Cmd
	lines  chan event
	stderr syncBuffer
	exited chan struct{}
	code   int
	once   sync.Once
}

type event struct {
	at  time.Time
	raw string
	m   map[string]interface{}
}

func (e event) name() string { s, _ := e.m["event"].(string); return s }

func (e event) int(k string) int64 {
	f, _ := e.m[k].(float64)
	return int64(f)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
	// lines, when set, gets each complete line written
	lines chan string
	part  []byte
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.Write(p)
	if s.lines != nil {
		s.part = append(s.part, p...)
		for {
			i := bytes.IndexByte(s.part, '\n')
			if i < 0 {
				break
			}
			select {
			case s.lines <- string(s.part[:i]):
			default:
			}
			s.part = s.part[i+1:]
		}
	}
	return len(p), nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startExample(t *testing.T, env []string, args ...string) *child {
	t.Helper()
	return startProcess(t, exampleBin, env, args...)
}

// startHelper runs this test binary as one of the helpers of runHelper.
func startHelper(t *testing.T, helper string, env ...string) *child {
	t.Helper()
	return startProcess(t, os.Args[0], append(env, "FL_GO_HELPER="+helper))
}

func startProcess(t *testing.T, path string, env []string, args ...string) *child {
	t.Helper()
	c := &child{cmd: exec.Command(path, args...), lines: make(chan event, 1024), exited: make(chan struct{})}
	c.stderr.lines = make(chan string, 1024)
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stderr = &c.stderr
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	children.Store(c, struct{}{})
	t.Cleanup(func() {
		c.kill()
		if t.Failed() {
			t.Logf("child %d stderr:\n%s", c.cmd.Process.Pid, c.stderr.String())
		}
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			e := event{at: time.Now(), raw: sc.Text()}
			if err := json.Unmarshal(sc.Bytes(), &e.m); err != nil {
				e.m = map[string]interface{}{"event": "not json"}
			}
			c.lines <- e
		}
		close(c.lines)
		err := c.cmd.Wait()
		c.code = 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			c.code = ee.ExitCode()
		} else if err != nil {
			c.code = -1
		}
		close(c.exited)
	}()
	return c
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) signal(t *testing.T, sig syscall.Signal) time.Time {
	t.Helper()
	if err := syscall.Kill(c.pid(), sig); err != nil {
		t.Fatalf("kill -%v %d: %v", sig, c.pid(), err)
	}
	return time.Now()
}

// next returns the next JSON line, failing the test after bound.
func (c *child) next(t *testing.T, bound time.Duration) event {
	t.Helper()
	select {
	case e, ok := <-c.lines:
		if !ok {
			t.Fatalf("child %d ended (stderr: %s)", c.pid(), c.stderr.String())
		}
		return e
	case <-time.After(bound):
		t.Fatalf("child %d printed nothing within %v (stderr: %s)", c.pid(), bound, c.stderr.String())
	}
	return event{}
}

// until returns the first line of the given event, collecting the others.
func (c *child) until(t *testing.T, name string, bound time.Duration) (event, []event) {
	t.Helper()
	end := time.Now().Add(bound)
	var seen []event
	for {
		e := c.next(t, time.Until(end))
		if e.name() == name {
			return e, seen
		}
		seen = append(seen, e)
	}
}

// rest returns every remaining line and the exit status.
func (c *child) rest(t *testing.T, bound time.Duration) ([]event, int) {
	t.Helper()
	var all []event
	timeout := time.After(bound)
	for {
		select {
		case e, ok := <-c.lines:
			if !ok {
				select {
				case <-c.exited:
				case <-timeout:
					t.Fatalf("child %d did not exit within %v", c.pid(), bound)
				}
				return all, c.code
			}
			all = append(all, e)
		case <-timeout:
			t.Fatalf("child %d did not end within %v (stderr: %s)", c.pid(), bound, c.stderr.String())
		}
	}
}

func (c *child) kill() {
	c.once.Do(func() {
		select {
		case <-c.exited:
		default:
			_ = syscall.Kill(c.pid(), syscall.SIGCONT)
			_ = syscall.Kill(c.pid(), syscall.SIGKILL)
			select {
			case <-c.exited:
			case <-time.After(10 * time.Second):
			}
		}
		children.Delete(c)
	})
}

// runHelper runs the test binary as a child process doing one thing, for
// the tests that must signal a process and look inside it at once.
func runHelper(name string) int {
	switch name {
	case "paused-holder":
		return pausedHolder(os.Getenv("FL_GO_HELPER_DSN"), os.Getenv("FL_GO_HELPER_NAME"))
	case "busy-holder":
		return busyHolder(os.Getenv("FL_GO_HELPER_DSN"), os.Getenv("FL_GO_HELPER_NAME"))
	}
	fmt.Fprintln(os.Stderr, "unknown helper", name)
	return 2
}

// pausedHolder holds a lease and prints, at each renew and at the loss, how
// many bytes its connections have sent so far: the test stops it right
// after a renew and compares.
func pausedHolder(dsn, name string) int {
	var cnt counter
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.DialFunc = cnt.dial
	lk, err := fencedlock.NewFromConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var mu sync.Mutex
	say := func(ev string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("{\"event\":%q,\"written\":%d}\n", ev, cnt.written.Load())
	}
	ctx := context.Background()
	lease, err := lk.Acquire(ctx, name, fencedlock.WithTTL(time.Second),
		fencedlock.WithOnRenew(func(*fencedlock.Lease) { say("renewed") }),
		fencedlock.WithOnLost(func(*fencedlock.Lease, error) { say("lost") }))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	say("acquired")
	<-lease.Done()
	time.Sleep(200 * time.Millisecond) // let the keepalive close its connection
	say("ended")
	_, _ = lease.Release(ctx)
	return 3
}

// A blackhole is a TCP proxy to the server that can cut the network: from
// cut() on it drops every byte both ways and forwards no new connection,
// keeping the sockets open, as a partition does (nothing is refused or
// reset; requests simply get no answer).
type blackhole struct {
	ln     net.Listener
	target string
	cutAt  atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
	dead   map[net.Conn]bool // cutExisting: these drop everything
}

func startBlackhole(t *testing.T) *blackhole {
	t.Helper()
	u, err := url.Parse(dbDSN)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: u.Host}
	t.Cleanup(b.close)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.track(c)
			if b.cutAt.Load() {
				continue // accepted, never answered
			}
			s, err := net.Dial("tcp", b.target)
			if err != nil {
				c.Close()
				continue
			}
			b.track(s)
			go b.pipe(c, s)
			go b.pipe(s, c)
		}
	}()
	return b
}

func (b *blackhole) track(c net.Conn) {
	b.mu.Lock()
	b.conns = append(b.conns, c)
	b.mu.Unlock()
}

func (b *blackhole) pipe(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if err != nil {
			to.Close()
			return
		}
		b.mu.Lock()
		dead := b.dead[from] || b.dead[to]
		b.mu.Unlock()
		if dead || b.cutAt.Load() {
			continue
		}
		if _, err := to.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (b *blackhole) cut() { b.cutAt.Store(true) }

// cutExisting makes the connections open now die silently; new ones work.
func (b *blackhole) cutExisting() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dead == nil {
		b.dead = map[net.Conn]bool{}
	}
	for _, c := range b.conns {
		b.dead[c] = true
	}
}

func (b *blackhole) close() {
	b.ln.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		c.Close()
	}
}

// dsn is the test database's URL through the proxy.
func (b *blackhole) dsn(t *testing.T) string {
	u, err := url.Parse(dbDSN)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = b.ln.Addr().String()
	return u.String()
}

// busyHolder holds a lease while keeping its only processor busy (the test
// runs it with GOMAXPROCS=1) for three ttls, in loops that make no call for
// longer than the ttl, then says how many renews went through meanwhile and
// whether it was lost. The keepalive runs because Go preempts the loop
// (with GODEBUG=asyncpreemptoff=1 the lease is lost: the stalled watchdog).
func busyHolder(dsn, name string) int {
	lk, err := fencedlock.New(dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var renewals atomic.Int64
	ctx := context.Background()
	const ttl = time.Second
	lease, err := lk.Acquire(ctx, name, fencedlock.WithTTL(ttl),
		fencedlock.WithOnRenew(func(*fencedlock.Lease) { renewals.Add(1) }))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	start := time.Now()
	x := uint64(1)
	for time.Since(start) < 3*ttl {
		for i := 0; i < 1_000_000_000; i++ { // over a second with no call: only preemption lets others run
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	lost := false
	select {
	case <-lease.Done():
		lost = true
	default:
	}
	fmt.Printf("{\"event\":\"busy\",\"renewals\":%d,\"lost\":%v,\"x\":%d}\n", renewals.Load(), lost, x%2)
	ok, err := lease.Release(ctx)
	if err != nil || !ok {
		fmt.Fprintln(os.Stderr, "release:", ok, err)
		return 1
	}
	return 0
}
