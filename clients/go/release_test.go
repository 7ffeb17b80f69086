package fencedlock_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v4/pgxpool"

	fencedlock "github.com/fenced-lock/fenced_lock/clients/go"
)

func TestTryAcquireReturnsNilWhenTheNameIsHeldAndGivesItsConnectionBack(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	name := lockName(t, "l")
	var held int64
	if err := a.QueryRow(ctx, "SELECT fenced_lock_try_acquire($1, '10 s')", name).Scan(&held); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.Connect(ctx, dbDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	lk, err := fencedlock.NewFromPool(pool)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := lk.TryAcquire(ctx, name)
	if lease != nil || err != nil {
		t.Fatalf("want nil, nil while held, got %v %v", lease, err)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d pool connections kept", n)
	}
	exec1(t, a, "SELECT fenced_lock_release($1, $2)", name, held)
	lease, err = lk.TryAcquire(ctx, name)
	if lease == nil || err != nil || lease.Token() <= held {
		t.Fatalf("want a lease with a larger token once free, got %v %v", lease, err)
	}
	if ok, err := lease.Release(ctx); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
}

func TestAPoolLeaseKeepsTwoConnectionsAndGivesBothBackAtRelease(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	cfg, err := pgxpool.ParseConfig(dbDSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.DialFunc = watched(t).dial // keepalivePIDs: this test's own
	pool, err := pgxpool.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	lk, err := fencedlock.NewFromPool(pool, fencedlock.WithTTL(900*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // the same two connections, lease after lease
		renewed := make(chan struct{}, 16)
		lease, err := lk.Acquire(ctx, lockName(t, "l"),
			fencedlock.WithOnRenew(func(*fencedlock.Lease) { renewed <- struct{}{} }))
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-renewed:
		case <-time.After(5 * time.Second):
			t.Fatal("no renew from the pool's second connection")
		}
		if n := pool.Stat().AcquiredConns(); n != 2 {
			t.Fatalf("%d connections taken, want the lease's and the keepalive's", n)
		}
		if pids := keepalivePIDs(t, a); len(pids) != 1 {
			t.Fatalf("keepalive backends %v", pids)
		}
		if ok, err := lease.Release(ctx); !ok || err != nil {
			t.Fatalf("release: %v %v", ok, err)
		}
		if n := pool.Stat().AcquiredConns(); n != 0 {
			t.Fatalf("%d connections still taken after release", n)
		}
		// given back under its own name, not as a keepalive
		if pids := keepalivePIDs(t, a); len(pids) != 0 {
			t.Fatalf("a pooled connection still says it is a keepalive: %v", pids)
		}
	}
	if n := pool.Stat().TotalConns(); n > 2 {
		t.Fatalf("%d connections in the pool", n)
	}
}

func TestReleaseInsideATransactionTakesEffectAtItsCommit(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	seed(t, "INSERT INTO docs VALUES (401, 'v0', NULL)")
	lease, err := newLocker(t).Acquire(ctx, "docs:401", fencedlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx) // the second call gives the connection back
	tx, err := lease.Conn().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "UPDATE docs SET body = 'v1', fence_token = $1 WHERE id = 401", lease.Token()); err != nil {
		t.Fatal(err)
	}
	if ok, err := lease.Release(ctx); !ok || err != nil {
		t.Fatalf("release inside the transaction: %v %v", ok, err)
	}
	// not yet: the release is part of the open transaction
	if !live(t, a, "docs:401", lease.Token()) {
		t.Fatal("the release took effect before the commit")
	}
	if lease.Conn().IsClosed() {
		t.Fatal("the release closed the connection of the open transaction")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if live(t, a, "docs:401", lease.Token()) {
		t.Fatal("still live after the commit")
	}
	if body := one[string](t, a, "SELECT body FROM docs WHERE id = 401"); body != "v1" {
		t.Fatalf("body %q: the guarded write did not commit with the release", body)
	}
	if ok, err := lease.Release(ctx); ok || err != nil {
		t.Fatalf("the second release: %v %v", ok, err)
	}
	if !lease.Conn().IsClosed() {
		t.Fatal("the second release did not give the connection back")
	}
}

func TestReleaseRollsBackAFailedTransactionFirst(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	seed(t, "INSERT INTO docs VALUES (402, 'v0', NULL)")
	lease, err := newLocker(t).Acquire(ctx, "docs:402", fencedlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	tx, err := lease.Conn().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "UPDATE docs SET body = 'v1', fence_token = $1 WHERE id = 402", lease.Token()); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1/0"); err == nil {
		t.Fatal("1/0 did not fail")
	}
	if ok, err := lease.Release(ctx); !ok || err != nil {
		t.Fatalf("release after a failed transaction: %v %v", ok, err)
	}
	if live(t, a, "docs:402", lease.Token()) {
		t.Fatal("still live")
	}
	if body := one[string](t, a, "SELECT body FROM docs WHERE id = 402"); body != "v0" {
		t.Fatalf("body %q: the failed transaction was not rolled back", body)
	}
}

func TestReleaseOnAGoneConnectionIsSentOnANewOne(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	lease, err := newLocker(t).Acquire(ctx, lockName(t, "l"), fencedlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	pid := lease.Conn().PgConn().PID()
	if !one[bool](t, a, "SELECT pg_terminate_backend($1)", pid) {
		t.Fatal("terminate")
	}
	eventually(t, 5*time.Second, "the backend gone", func() bool {
		return one[int](t, a, "SELECT count(*)::int FROM pg_stat_activity WHERE pid = $1", int32(pid)) == 0
	})
	// the client has not noticed yet; the release finds out, and goes on a
	// new connection
	ok, err := lease.Release(ctx)
	if !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	if got := endedBy(t, a, lease.Token()); got != "release" {
		t.Fatalf("ended by %q", got)
	}
}

func TestReleasingTwiceSendsOneRelease(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	var cnt counter
	lk, err := fencedlock.NewFromConfig(cnt.config(t))
	if err != nil {
		t.Fatal(err)
	}
	lease, err := lk.Acquire(ctx, lockName(t, "l"), fencedlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := lease.Release(ctx); !ok || err != nil {
		t.Fatalf("first release: %v %v", ok, err)
	}
	before := cnt.snapshot()
	if ok, err := lease.Release(ctx); ok || err != nil {
		t.Fatalf("second release: %v %v", ok, err)
	}
	if got := cnt.snapshot(); got != before {
		t.Fatalf("the second release sent something: %v -> %v", before, got)
	}
	if lease.Err() != fencedlock.ErrReleased || lease.Context().Err() == nil {
		t.Fatalf("Err %v, Context().Err %v", lease.Err(), lease.Context().Err())
	}
	select {
	case <-lease.Done():
		t.Fatal("Done closed by a release: it says lost")
	default:
	}
}

func TestAcquireOnTheCallersConnectionKeepsItThereAndNeverClosesIt(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	conn := admin(t)
	lease, err := newLocker(t).Acquire(ctx, lockName(t, "l"), fencedlock.WithConn(conn),
		fencedlock.WithSessionBound(true), fencedlock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if lease.Conn() != conn {
		t.Fatal("not the caller's connection")
	}
	// session-bound to the caller's session: the history knows the lease as such
	if !one[bool](t, a, "SELECT session_bound FROM fenced_lock_leases WHERE name = $1", lease.Name()) {
		t.Fatal("not session-bound")
	}
	if ok, err := lease.Release(ctx); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	if conn.IsClosed() {
		t.Fatal("the caller's connection was closed")
	}
	exec1(t, conn, "SELECT 1")
}

func TestNoRenewIsSentAfterReleaseAndTheKeepaliveConnectionIsGoneWhenReleaseReturns(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	a := admin(t)
	const ttl = 600 * time.Millisecond // renews every 200 ms: plenty of chances to slip one in
	lk := newLocker(t)
	for i := 0; i < 5; i++ {
		var renewals atomic.Int64
		lease, err := lk.Acquire(ctx, lockName(t, fmt.Sprint(i)), fencedlock.WithTTL(ttl),
			fencedlock.WithOnRenew(func(*fencedlock.Lease) { renewals.Add(1) }))
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "a renew", func() bool { return renewals.Load() > 0 })
		if pids := keepalivePIDs(t, a); len(pids) != 1 {
			t.Fatalf("keepalive backends: %v", pids)
		}
		// release at a different point of the renew cycle each time
		time.Sleep(time.Duration(i) * 45 * time.Millisecond)
		ok, err := lease.Release(ctx)
		if !ok || err != nil {
			t.Fatalf("release: %v %v", ok, err)
		}
		n := renewals.Load()
		if pids := keepalivePIDs(t, a); len(pids) != 0 {
			t.Fatalf("the keepalive backend %v is still there when release has returned", pids)
		}
		if got := endedBy(t, a, lease.Token()); got != "release" {
			t.Fatalf("history says %q", got)
		}
		// and it stays gone: no renew, no reconnect, over several intervals
		time.Sleep(3 * lease.KeepaliveInterval())
		if pids := keepalivePIDs(t, a); len(pids) != 0 || renewals.Load() != n {
			t.Fatalf("after release: keepalive backends %v, renewals %d -> %d", pids, n, renewals.Load())
		}
	}
}

func TestReleaseWaitsForARenewInFlightAndSendsTheReleaseOnlyAfterIt(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	a := admin(t)
	const ttl = 6 * time.Second
	var renewals atomic.Int64
	// an interval of 2 s gives the renew that long before it is given up
	// (max(interval, 1 s)): longer than this test keeps it waiting
	lease, err := newLocker(t).Acquire(ctx, lockName(t, "l"), fencedlock.WithTTL(ttl),
		fencedlock.WithKeepaliveInterval(2*time.Second),
		fencedlock.WithOnRenew(func(*fencedlock.Lease) { renewals.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	// A renew of the lease in another session's open transaction holds the
	// lease's lock until that transaction ends, so the keepalive's next renew
	// waits for it on the server: a renew in flight. (A guarded write would
	// not do: it does not hold up a renew.)
	blocker, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	var renewed bool
	if err := blocker.QueryRow(ctx, "SELECT fenced_lock_renew($1, $2)", lease.Name(), lease.Token()).Scan(&renewed); err != nil || !renewed {
		t.Fatalf("the blocking renew: %v %v", renewed, err)
	}
	watch := admin(t)
	eventually(t, 5*time.Second, "the keepalive's renew waiting for the lease's lock", func() bool {
		return len(pids(t, watch, `SELECT pid FROM pg_stat_activity WHERE pid = ANY($1)
		   AND wait_event_type = 'Lock' AND query LIKE '%fenced_lock_renew%'`, keepalivePIDs(t, watch))) == 1
	})
	n := renewals.Load()

	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		ok, err := lease.Release(ctx)
		done <- result{ok, err}
	}()
	leasePID := lease.Conn().PgConn().PID()
	// For a while (well within the renew's own bound of max(interval, 1 s)),
	// Release must wait: its connection sends nothing.
	end := time.Now().Add(700 * time.Millisecond)
	for time.Now().Before(end) {
		select {
		case r := <-done:
			t.Fatalf("release returned while a renew was in flight: %v %v", r.ok, r.err)
		default:
		}
		q := one[string](t, watch, "SELECT state || ': ' || query FROM pg_stat_activity WHERE pid = $1", int32(leasePID))
		if strings.Contains(q, "fenced_lock_release") {
			t.Fatalf("the release was sent while a renew was in flight: %s", q)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if !r.ok || r.err != nil {
			t.Fatalf("release: %v %v", r.ok, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("release did not return after the renew finished")
	}
	if renewals.Load() != n+1 {
		t.Fatalf("the renew in flight did not finish first: renewals %d -> %d", n, renewals.Load())
	}
	if pids := keepalivePIDs(t, watch); len(pids) != 0 {
		t.Fatalf("keepalive backends after release: %v", pids)
	}
	if got := endedBy(t, watch, lease.Token()); got != "release" {
		t.Fatalf("history says %q", got)
	}
}
