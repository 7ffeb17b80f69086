package fencedlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"

	fencedlock "github.com/fenced-lock/fenced_lock/clients/go"
)

var kinds = map[string]error{
	"FL001": fencedlock.ErrStaleToken,
	"FL002": fencedlock.ErrMissingToken,
	"FL003": fencedlock.ErrModeConflict,
	"55P03": fencedlock.ErrWaitTimeout,
	"25006": fencedlock.ErrReadOnly,
	"42501": fencedlock.ErrNotAllowed,
	"22023": fencedlock.ErrInvalidArgument,
}

// checkKind asserts that err is the *Error of that SQLSTATE, of that kind
// and of no other, carrying the server's message, and still the driver's
// *pgconn.PgError underneath.
func checkKind(t *testing.T, err error, code string) *fencedlock.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("want SQLSTATE %s, got no error", code)
	}
	var fe *fencedlock.Error
	if !errors.As(err, &fe) {
		t.Fatalf("want a *fencedlock.Error of SQLSTATE %s, got %T: %v", code, err, err)
	}
	if fe.Code != code || fe.SQLState() != code || fencedlock.SQLState(err) != code {
		t.Fatalf("want SQLSTATE %s, got %q: %v", code, fe.Code, err)
	}
	for c, kind := range kinds {
		if got := errors.Is(err, kind); got != (c == code) {
			t.Fatalf("errors.Is(%v, %v) = %v", err, kind, got)
		}
	}
	if errors.Is(err, fencedlock.ErrUsage) {
		t.Fatalf("%v is not a usage error", err)
	}
	if fe.Message == "" || !strings.Contains(err.Error(), fe.Message) {
		t.Fatalf("the message is not carried: %#v", fe)
	}
	return fe
}

func TestEverySQLStateOfTheTableMapsToItsErrorTypeWithMessageDetailAndHint(t *testing.T) {
	t.Parallel()
	for code := range kinds {
		pe := &pgconn.PgError{Severity: "ERROR", Code: code, Message: "m " + code, Detail: "d " + code, Hint: "h " + code}
		err := fencedlock.Wrap(pe)
		fe := checkKind(t, err, code)
		if fe.Message != pe.Message || fe.Detail != pe.Detail || fe.Hint != pe.Hint {
			t.Fatalf("%s: fields not carried: %#v", code, fe)
		}
		var back *pgconn.PgError
		if !errors.As(err, &back) || back != pe {
			t.Fatalf("%s: does not unwrap to the driver's error", code)
		}
		if fencedlock.Wrap(err) != err {
			t.Fatalf("%s: wrapping twice changes the error", code)
		}
	}
	// Other SQLSTATEs keep their code and are none of the kinds.
	other := fencedlock.Wrap(&pgconn.PgError{Code: "40001", Message: "serialization"})
	if fencedlock.SQLState(other) != "40001" {
		t.Fatalf("got %v", other)
	}
	for _, kind := range kinds {
		if errors.Is(other, kind) {
			t.Fatalf("40001 is %v", kind)
		}
	}
	// An error without a SQLSTATE is returned as it is.
	plain := errors.New("connection refused")
	if fencedlock.Wrap(plain) != plain || fencedlock.Wrap(nil) != nil || fencedlock.SQLState(plain) != "" {
		t.Fatal("a plain error was changed")
	}
}

func TestEverySQLStateRaisedByTheServerMapsToItsErrorType(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	a := admin(t)
	lk := newLocker(t)

	t.Run("FL001 stale token", func(t *testing.T) {
		name := "docs:101"
		seed(t, "INSERT INTO docs VALUES (101, 'x', NULL)")
		lease, err := lk.Acquire(ctx, name, fencedlock.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := lease.Release(ctx); !ok || err != nil {
			t.Fatalf("release: %v %v", ok, err)
		}
		// the library's own call...
		fe := checkKind(t, lease.Assert(ctx, a), "FL001")
		if !strings.Contains(fe.Detail, "presented token") || fe.Hint == "" {
			t.Fatalf("FL001 without the server's detail and hint: %#v", fe)
		}
		// ...and the caller's guarded write, mapped by Wrap
		_, err = a.Exec(ctx, "UPDATE docs SET body = 'late', fence_token = $1 WHERE id = 101", lease.Token())
		checkKind(t, fencedlock.Wrap(err), "FL001")
		if !fencedlock.IsStaleToken(err) {
			t.Fatal("IsStaleToken misses the driver's FL001")
		}
		if body := one[string](t, a, "SELECT body FROM docs WHERE id = 101"); body != "x" {
			t.Fatalf("the refused write changed the row: %q", body)
		}
	})

	t.Run("FL002 missing token", func(t *testing.T) {
		seed(t, "INSERT INTO docs VALUES (102, 'x', NULL)")
		_, err := a.Exec(ctx, "UPDATE docs SET body = 'y', fence_token = NULL WHERE id = 102")
		checkKind(t, fencedlock.Wrap(err), "FL002")
	})

	t.Run("FL003 mode conflict", func(t *testing.T) {
		needVersion(t, "0.3.0", "FL003 (permits and shared leases)")
		name := lockName(t, "sem")
		first, err := lk.TryAcquire(ctx, name, fencedlock.WithPermits(3))
		if err != nil || first == nil {
			t.Fatalf("a permit of 3: %v %v", first, err)
		}
		defer first.Release(ctx)
		// another permit count while permits of 3 are live can never be granted
		_, err = lk.TryAcquire(ctx, name, fencedlock.WithPermits(2))
		checkKind(t, err, "FL003")
	})

	t.Run("55P03 wait timeout", func(t *testing.T) {
		name := lockName(t, "held")
		holder, err := lk.Acquire(ctx, name, fencedlock.WithTTL(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Release(ctx)
		start := time.Now()
		_, err = lk.Acquire(ctx, name, fencedlock.WithWait(200*time.Millisecond))
		checkKind(t, err, "55P03")
		t.Logf("55P03 after %v", time.Since(start))
	})

	t.Run("25006 read only", func(t *testing.T) {
		conn := admin(t)
		exec1(t, conn, "SET default_transaction_read_only = on")
		_, err := lk.TryAcquire(ctx, lockName(t, "ro"), fencedlock.WithConn(conn))
		checkKind(t, err, "25006")
	})

	t.Run("42501 not allowed", func(t *testing.T) {
		cfg, err := pgx.ParseConfig(dbDSN)
		if err != nil {
			t.Fatal(err)
		}
		cfg.User = noExecRole
		nolk, err := fencedlock.NewFromConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, err = nolk.TryAcquire(ctx, lockName(t, "denied"))
		checkKind(t, err, "42501")
	})

	t.Run("22023 invalid argument judged by the server", func(t *testing.T) {
		// over 512 bytes: only the server knows the limit
		_, err := lk.TryAcquire(ctx, strings.Repeat("n", 513))
		fe := checkKind(t, err, "22023")
		if fe.Argument != "" {
			t.Fatalf("a server-side 22023 names no client argument: %#v", fe)
		}
		conn := admin(t)
		exec1(t, conn, "SET fenced_lock.max_ttl = '1min'")
		_, err = lk.TryAcquire(ctx, lockName(t, "long"), fencedlock.WithConn(conn), fencedlock.WithTTL(2*time.Minute))
		checkKind(t, err, "22023")
	})
}

func TestUsageErrorsAreRefusedBeforeAnythingIsSent(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	var cnt counter
	cfg := cnt.config(t)

	t.Run("an acquire on a connection inside a transaction block", func(t *testing.T) {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		lk, err := fencedlock.NewFromConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		before := cnt.snapshot()
		for _, call := range []func() error{
			func() error { _, err := lk.TryAcquire(ctx, "x", fencedlock.WithConn(conn)); return err },
			func() error { _, err := lk.Acquire(ctx, "x", fencedlock.WithConn(conn)); return err },
		} {
			err := call()
			if !errors.Is(err, fencedlock.ErrUsage) || !strings.Contains(err.Error(), "transaction block") {
				t.Fatalf("want a usage error about the transaction block, got %v", err)
			}
		}
		if cnt.snapshot() != before {
			t.Fatalf("something was sent: %v -> %v", before, cnt.snapshot())
		}
	})

	t.Run("a session-bound lease through transaction pooling", func(t *testing.T) {
		lk, err := fencedlock.NewFromConfig(cfg, fencedlock.WithTransactionPooling(true))
		if err != nil {
			t.Fatal(err)
		}
		before := cnt.snapshot()
		err = lk.Do(ctx, "x", func(context.Context, *fencedlock.Lease) error { return nil },
			fencedlock.WithSessionBound(true))
		if !errors.Is(err, fencedlock.ErrUsage) || !strings.Contains(err.Error(), "pooled server connection") {
			t.Fatalf("want a usage error saying why, got %v", err)
		}
		_, err = lk.TryAcquire(ctx, "x", fencedlock.WithSessionBound(true))
		if !errors.Is(err, fencedlock.ErrUsage) {
			t.Fatalf("want a usage error, got %v", err)
		}
		if cnt.snapshot() != before {
			t.Fatalf("something was sent: %v -> %v", before, cnt.snapshot())
		}
		// plain leases are right there
		lease, err := lk.TryAcquire(ctx, lockName(t, "plain"), fencedlock.WithTTL(5*time.Second))
		if err != nil || lease == nil {
			t.Fatalf("a plain lease with transaction pooling: %v %v", lease, err)
		}
		if ok, err := lease.Release(ctx); !ok || err != nil {
			t.Fatalf("release: %v %v", ok, err)
		}
	})
}
