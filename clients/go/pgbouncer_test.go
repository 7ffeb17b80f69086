package fencedlock_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v4"

	fencedlock "github.com/fenced-lock/fenced_lock/clients/go"
)

// startPgBouncer runs PgBouncer in transaction mode in front of the test
// database, listening on a Unix socket only, in a directory of the test's
// own (no TCP port is taken), with two server connections for every client.
// It returns the key=value connection string of the pooled database.
func startPgBouncer(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skip("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
	}
	u, err := url.Parse(dbDSN)
	if err != nil {
		t.Fatal(err)
	}
	user := u.User.Username()
	if user == "" {
		user = "postgres"
	}
	dir, err := os.MkdirTemp("", "fl_client_go_pgbouncer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil { // PgBouncer runs as postgres
		t.Fatal(err)
	}
	const socketPort = 5627 // only the name of the socket file, in this directory
	ini := filepath.Join(dir, "pgbouncer.ini")
	conf := fmt.Sprintf(`[databases]
%s = host=%s port=%s dbname=%s user=%s
[pgbouncer]
listen_addr =
listen_port = %d
unix_socket_dir = %s
auth_type = any
pool_mode = transaction
default_pool_size = 2
max_client_conn = 50
server_reset_query =
logfile = %s
pidfile = %s
`, testDB, u.Hostname(), u.Port(), testDB, user, socketPort, dir,
		filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	if err := os.WriteFile(ini, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	var cmd *exec.Cmd
	if os.Geteuid() == 0 { // PgBouncer refuses to run as root
		cmd = exec.Command("sudo", "-u", "postgres", "--", bin, ini)
	} else {
		cmd = exec.Command(bin, ini)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		if pid, err := os.ReadFile(filepath.Join(dir, "pgbouncer.pid")); err == nil {
			kill := []string{"kill", "-TERM", strings.TrimSpace(string(pid))}
			if os.Geteuid() == 0 {
				kill = append([]string{"sudo", "-u", "postgres", "--"}, kill...)
			}
			_ = exec.Command(kill[0], kill[1:]...).Run()
		}
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	sock := filepath.Join(dir, fmt.Sprintf(".s.PGSQL.%d", socketPort))
	eventually(t, 10*time.Second, "pgbouncer listening", func() bool {
		select {
		case <-exited:
			t.Fatalf("pgbouncer ended: %s", stderr.String())
		default:
		}
		_, err := os.Stat(sock)
		return err == nil
	})
	return fmt.Sprintf("host=%s port=%d dbname=%s user=%s", dir, socketPort, testDB, user)
}

func TestPlainLeasesWorkThroughPgBouncerInTransactionModeAndRenewOnAnyServerConnection(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	a := admin(t)
	dsn := startPgBouncer(t)
	seed(t, "INSERT INTO docs VALUES (501, 'v0', NULL)")
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	// every statement that fails on the locker's connections, renews included
	var failures atomic.Int64
	var firstFailure atomic.Value
	cfg.LogLevel = pgx.LogLevelError
	cfg.Logger = logFunc(func(msg string, data map[string]interface{}) {
		failures.Add(1)
		firstFailure.CompareAndSwap(nil, fmt.Sprintf("%s %v", msg, data))
	})
	lk, err := fencedlock.NewFromConfig(cfg, fencedlock.WithTransactionPooling(true))
	if err != nil {
		t.Fatal(err)
	}
	var renewals atomic.Int64
	lease, err := lk.Acquire(ctx, "docs:501", fencedlock.WithTTL(1500*time.Millisecond),
		fencedlock.WithKeepaliveInterval(100*time.Millisecond),
		fencedlock.WithOnRenew(func(*fencedlock.Lease) { renewals.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	// After a second of renews (on one server connection, the one PgBouncer
	// hands out last-in first-out), another client holds that connection in
	// a transaction: the renews go on the other one, where a statement
	// prepared on the first would not be.
	time.Sleep(time.Second)
	other, err := pgx.Connect(ctx, dsn+" prefer_simple_protocol=true")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	otx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := otx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	select {
	case <-lease.Done():
		t.Fatalf("lost through PgBouncer: %v", lease.Err())
	default:
	}
	t.Logf("%d renewals through PgBouncer in 3 s", renewals.Load())
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d statements failed, the first: %v", n, firstFailure.Load())
	}
	if renewals.Load() < 10 {
		t.Fatalf("only %d renewals", renewals.Load())
	}
	tx, err := lease.Conn().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "UPDATE docs SET body = 'v1', fence_token = $1 WHERE id = 501", lease.Token()); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := lease.Release(ctx); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	if body := one[string](t, a, "SELECT body FROM docs WHERE id = 501"); body != "v1" {
		t.Fatalf("body %q", body)
	}
	if got := endedBy(t, a, lease.Token()); got != "release" {
		t.Fatalf("ended by %q", got)
	}
	// the shared server sessions keep no name of ours
	for i := 0; i < 4; i++ {
		c, err := pgx.Connect(ctx, dsn+" prefer_simple_protocol=true")
		if err != nil {
			t.Fatal(err)
		}
		name := one[string](t, c, "SHOW application_name")
		c.Close(ctx)
		if name == fencedlock.KeepaliveApplicationName {
			t.Fatalf("a pooled server session still says %q", name)
		}
	}
}

type logFunc func(msg string, data map[string]interface{})

func (f logFunc) Log(_ context.Context, _ pgx.LogLevel, msg string, data map[string]interface{}) {
	f(msg, data)
}
