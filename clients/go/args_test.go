package fencedlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v4"

	fencedlock "github.com/fenced-lock/fenced_lock/clients/go"
)

// checkInvalid asserts the client-side invalid-argument error: the 22023
// kind, naming the argument.
func checkInvalid(t *testing.T, err error, arg string) {
	t.Helper()
	var fe *fencedlock.Error
	if !errors.As(err, &fe) || !errors.Is(err, fencedlock.ErrInvalidArgument) || fe.Code != "22023" {
		t.Fatalf("want the invalid-argument error for %s, got %T %v", arg, err, err)
	}
	if fe.Argument != arg || !strings.Contains(fe.Message, arg) {
		t.Fatalf("want the error to name %q, got argument %q, message %q", arg, fe.Argument, fe.Message)
	}
}

func TestEveryBadArgumentOfEveryCallIsTheInvalidArgumentErrorAndSendsNothing(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	var cnt counter
	cfg := cnt.config(t)
	lk, err := fencedlock.NewFromConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// a connection of the caller, to show that it is not written to either
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	bad := []struct {
		arg  string
		name string
		opts []fencedlock.Option
	}{
		{"name", "", nil},
		{"name", "a\x00b", nil},
		{"name", "\xff\xfe", nil},
		{"ttl", "n", []fencedlock.Option{fencedlock.WithTTL(0)}},
		{"ttl", "n", []fencedlock.Option{fencedlock.WithTTL(-time.Second)}},
		{"ttl", "n", []fencedlock.Option{fencedlock.WithTTL(500 * time.Nanosecond)}},
		{"wait", "n", []fencedlock.Option{fencedlock.WithWait(-time.Millisecond)}},
		{"holder", "n", []fencedlock.Option{fencedlock.WithHolder("w\x00")}},
		{"holder", "n", []fencedlock.Option{fencedlock.WithHolder("\xc3")}},
		{"permits", "n", []fencedlock.Option{fencedlock.WithPermits(0)}},
		{"permits", "n", []fencedlock.Option{fencedlock.WithPermits(-2)}},
		{"permits", "n", []fencedlock.Option{fencedlock.WithShared(true), fencedlock.WithPermits(2)}},
		{"keepalive interval", "n", []fencedlock.Option{fencedlock.WithKeepaliveInterval(0)}},
		{"keepalive interval", "n", []fencedlock.Option{fencedlock.WithKeepaliveInterval(-time.Second)}},
		{"keepalive interval", "n", []fencedlock.Option{fencedlock.WithTTL(3 * time.Second), fencedlock.WithKeepaliveInterval(3 * time.Second)}},
		{"attempts", "n", []fencedlock.Option{fencedlock.WithAttempts(0)}},
		{"conn", "n", []fencedlock.Option{fencedlock.WithConn(nil)}},
		{"WithTransactionPooling", "n", []fencedlock.Option{fencedlock.WithTransactionPooling(true)}},
		{"WithSchema", "n", []fencedlock.Option{fencedlock.WithSchema("s")}},
	}
	calls := map[string]func(name string, opts []fencedlock.Option) error{
		"TryAcquire": func(name string, opts []fencedlock.Option) error {
			_, err := lk.TryAcquire(ctx, name, opts...)
			return err
		},
		"Acquire": func(name string, opts []fencedlock.Option) error {
			_, err := lk.Acquire(ctx, name, opts...)
			return err
		},
		"Do": func(name string, opts []fencedlock.Option) error {
			return lk.Do(ctx, name, func(context.Context, *fencedlock.Lease) error {
				t.Error("fn ran despite a bad argument")
				return nil
			}, opts...)
		},
		"TryAcquire on the caller's connection": func(name string, opts []fencedlock.Option) error {
			_, err := lk.TryAcquire(ctx, name, append([]fencedlock.Option{fencedlock.WithConn(conn)}, opts...)...)
			return err
		},
		"Acquire on the caller's connection": func(name string, opts []fencedlock.Option) error {
			_, err := lk.Acquire(ctx, name, append([]fencedlock.Option{fencedlock.WithConn(conn)}, opts...)...)
			return err
		},
	}
	before := cnt.snapshot()
	n := 0
	for call, f := range calls {
		for _, b := range bad {
			if strings.Contains(call, "caller's connection") && b.arg == "conn" {
				continue // WithConn(nil) after WithConn(conn) is the same case as above
			}
			checkInvalid(t, f(b.name, b.opts), b.arg)
			n++
		}
	}
	checkInvalid(t, lk.Do(ctx, "n", nil), "fn")
	if got := cnt.snapshot(); got != before {
		t.Fatalf("a bad call sent something: (dials, bytes) %v -> %v", before, got)
	}
	lease, err := lk.TryAcquire(ctx, lockName(t, "assert"), fencedlock.WithKeepalive(false), fencedlock.WithConn(conn))
	if err != nil || lease == nil {
		t.Fatalf("acquire: %v %v", lease, err)
	}
	afterAcquire := cnt.snapshot()
	checkInvalid(t, lease.Assert(ctx, nil), "q")
	if cnt.snapshot() != afterAcquire {
		t.Fatalf("Assert(nil) sent something")
	}
	if _, err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	afterRelease := cnt.snapshot()

	// the constructors
	var nilCfg *pgx.ConnConfig
	ctors := []struct {
		arg string
		f   func() error
	}{
		{"connString", func() error { _, err := fencedlock.New("postgresql://[::1"); return err }},
		{"connString", func() error { _, err := fencedlock.New("port=notaport"); return err }},
		{"config", func() error { _, err := fencedlock.NewFromConfig(nilCfg); return err }},
		{"pool", func() error { _, err := fencedlock.NewFromPool(nil); return err }},
		{"connect", func() error { _, err := fencedlock.NewFromConnector(nil); return err }},
		{"ttl", func() error { _, err := fencedlock.NewFromConfig(cfg, fencedlock.WithTTL(0)); return err }},
		{"wait", func() error { _, err := fencedlock.NewFromConfig(cfg, fencedlock.WithWait(-1)); return err }},
		{"attempts", func() error { _, err := fencedlock.NewFromConfig(cfg, fencedlock.WithAttempts(-1)); return err }},
		{"permits", func() error { _, err := fencedlock.NewFromConfig(cfg, fencedlock.WithPermits(0)); return err }},
		{"keepalive interval", func() error {
			_, err := fencedlock.NewFromConfig(cfg, fencedlock.WithKeepaliveInterval(time.Minute))
			return err
		}},
		{"WithConn", func() error { _, err := fencedlock.NewFromConfig(cfg, fencedlock.WithConn(conn)); return err }},
		{"schema", func() error { _, err := fencedlock.NewFromConfig(cfg, fencedlock.WithSchema("")); return err }},
	}
	for _, c := range ctors {
		checkInvalid(t, c.f(), c.arg)
	}
	if got := cnt.snapshot(); got != afterRelease {
		t.Fatalf("a bad constructor sent something: %v -> %v", afterRelease, got)
	}
	t.Logf("%d bad calls, %d bad constructors: nothing sent", n+2, len(ctors))
}
