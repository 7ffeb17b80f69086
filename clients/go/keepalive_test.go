package fencedlock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	fencedlock "github.com/fenced-lock/fenced_lock/clients/go"
)

func TestKeepaliveKeepsACriticalSectionOfThreeTTLsAlive(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	a := admin(t)
	seed(t, "INSERT INTO docs VALUES (201, 'before', NULL)")
	const ttl = time.Second
	var renewals atomic.Int64
	lk := newLocker(t)
	lease, err := lk.Acquire(ctx, "docs:201", fencedlock.WithTTL(ttl),
		fencedlock.WithOnRenew(func(*fencedlock.Lease) { renewals.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)

	// The section keeps the lease's own connection busy the whole time: the
	// keepalive renews from its own, so the work never delays a renew.
	start := time.Now()
	if _, err := lease.Conn().Exec(ctx, "SELECT pg_sleep($1)", (3 * ttl).Seconds()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Done():
		t.Fatalf("lost during the section: %v", lease.Err())
	default:
	}
	if !live(t, a, "docs:201", lease.Token()) {
		t.Fatal("the server says the lease is not live after 3 ttls")
	}
	if _, err := lease.Conn().Exec(ctx, "UPDATE docs SET body = 'after', fence_token = $1 WHERE id = 201", lease.Token()); err != nil {
		t.Fatalf("the guarded write at the end of the section: %v", err)
	}
	// one renew per interval (ttl/3) over 3 ttls is about 9; 5 leaves room
	// for a loaded machine while still needing renewals all along
	if n := renewals.Load(); n < 5 {
		t.Fatalf("only %d renewals in %v", n, time.Since(start))
	}
	t.Logf("%d renewals in %v (ttl %v, interval %v)", renewals.Load(), time.Since(start), ttl, lease.KeepaliveInterval())
	if ok, err := lease.Release(ctx); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	if got := endedBy(t, a, lease.Token()); got != "release" {
		t.Fatalf("history says %q", got)
	}
}

func TestAGuardedTransactionOpenForThreeTTLsKeepsItsLeaseAndItsCommitIsAccepted(t *testing.T) {
	t.Parallel()
	needVersion(t, "0.3.0", "renews that do not wait for the holder's guarded writes")
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	seed(t, "INSERT INTO docs VALUES (203, 'before', NULL)")
	const ttl = time.Second
	var renewals atomic.Int64
	lease, err := newLocker(t).Acquire(ctx, "docs:203", fencedlock.WithTTL(ttl),
		fencedlock.WithOnRenew(func(*fencedlock.Lease) { renewals.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	tx, err := lease.Conn().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "UPDATE docs SET body = 'first', fence_token = $1 WHERE id = 203", lease.Token()); err != nil {
		t.Fatal(err)
	}
	// The write holds the lease's lock until the commit; the keepalive's
	// renews go on beside it, from their own connection.
	n := renewals.Load()
	time.Sleep(3*ttl + 500*time.Millisecond)
	select {
	case <-lease.Done():
		t.Fatalf("lost with its transaction open: %v", lease.Err())
	default:
	}
	// about 10 are due (every ttl/3); 3 still means renewals all along
	if got := renewals.Load() - n; got < 3 {
		t.Fatalf("only %d renewals in 3 ttls beside the open transaction", got)
	}
	if !live(t, a, "docs:203", lease.Token()) {
		t.Fatal("the server let the lease expire")
	}
	if _, err := tx.Exec(ctx, "UPDATE docs SET body = 'second', fence_token = $1 WHERE id = 203", lease.Token()); err != nil {
		t.Fatalf("a guarded write after 3 ttls: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	t.Logf("%d renewals beside a guarded transaction open %v (ttl %v)", renewals.Load()-n, 3*ttl+500*time.Millisecond, ttl)
	if body := one[string](t, a, "SELECT body FROM docs WHERE id = 203"); body != "second" {
		t.Fatalf("body %q", body)
	}
	if tok := one[int64](t, a, "SELECT fence_token FROM docs WHERE id = 203"); tok != lease.Token() {
		t.Fatalf("fence_token %d, want %d", tok, lease.Token())
	}
	if ok, err := lease.Release(ctx); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	if got := endedBy(t, a, lease.Token()); got != "release" {
		t.Fatalf("history says %q", got)
	}
}

func TestAProcessBusyOnItsOnlyProcessorStillRenewsItsLease(t *testing.T) {
	c := startHelper(t, "busy-holder", "GOMAXPROCS=1", "FL_GO_HELPER_DSN="+dbDSN, "FL_GO_HELPER_NAME="+lockName(t, "l"))
	busy := c.next(t, 30*time.Second)
	if busy.name() != "busy" {
		t.Fatalf("got %s", busy.raw)
	}
	t.Logf("%d renewals in 3 ttls with the only processor busy", busy.int("renewals"))
	if busy.m["lost"] != false {
		t.Fatalf("lost while busy: %s", busy.raw)
	}
	// about 9 are due (every ttl/3); 5 still means renewals all along
	if busy.int("renewals") < 5 {
		t.Fatalf("only %d renewals: the keepalive was starved", busy.int("renewals"))
	}
	if _, code := c.rest(t, 10*time.Second); code != 0 {
		t.Fatalf("helper exit %d", code)
	}
}

func TestTerminatingTheKeepaliveConnectionMakesItReconnectAndRenewAndTheLeaseStaysLive(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	a := admin(t)
	const ttl = 2 * time.Second
	var renewals atomic.Int64
	lease, err := newLocker(t).Acquire(ctx, lockName(t, "l"), fencedlock.WithTTL(ttl),
		fencedlock.WithOnRenew(func(*fencedlock.Lease) { renewals.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	var pids []int32
	eventually(t, 10*time.Second, "a keepalive connection", func() bool {
		pids = keepalivePIDs(t, a)
		return len(pids) == 1
	})
	first := pids[0]
	for round := 0; round < 2; round++ {
		victim := pids[0]
		if !one[bool](t, a, "SELECT pg_terminate_backend($1)", victim) {
			t.Fatalf("could not terminate %d", victim)
		}
		n := renewals.Load()
		// a terminated connection is seen at the next renew; it is retried
		// on a new one at once, well before the deadline
		eventually(t, 2*ttl, "a renew on a new connection", func() bool {
			pids = keepalivePIDs(t, a)
			return renewals.Load() > n && len(pids) == 1 && pids[0] != victim
		})
		t.Logf("round %d: keepalive backend %d terminated, renewing from %d", round, victim, pids[0])
	}
	time.Sleep(ttl) // longer than the ttl since the first termination
	select {
	case <-lease.Done():
		t.Fatalf("lost: %v", lease.Err())
	default:
	}
	if !live(t, a, lease.Name(), lease.Token()) {
		t.Fatal("the lease is not live on the server")
	}
	if pids[0] == first {
		t.Fatal("still the first keepalive connection")
	}
	if ok, err := lease.Release(ctx); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
}

func TestTerminatingASessionBoundLeasesConnectionEndsItAndTheClientSignalsLostAtItsNextRenew(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	a := admin(t)
	const ttl = 3 * time.Second
	lostAt := make(chan time.Time, 1)
	lease, err := newLocker(t).Acquire(ctx, lockName(t, "l"), fencedlock.WithTTL(ttl), fencedlock.WithSessionBound(true),
		fencedlock.WithOnLost(func(*fencedlock.Lease, error) { lostAt <- time.Now() }))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	pid := lease.Conn().PgConn().PID()
	if !one[bool](t, a, "SELECT pg_terminate_backend($1)", pid) {
		t.Fatalf("could not terminate %d", pid)
	}
	terminated := time.Now()
	// the server ends it with the session: another session gets the name
	// long before the ttl
	var next *int64
	eventually(t, 2*time.Second, "the name free for another session", func() bool {
		next = one[*int64](t, a, "SELECT fenced_lock_try_acquire($1, '5 s')", lease.Name())
		return next != nil
	})
	if got := endedBy(t, a, lease.Token()); got != "session_end" {
		t.Fatalf("history says %q, want session_end", got)
	}
	select {
	case at := <-lostAt:
		d := at.Sub(terminated)
		t.Logf("lost %v after the termination (interval %v)", d, lease.KeepaliveInterval())
		// the next renew comes at most an interval later; generous slack
		if d > lease.KeepaliveInterval()+2*time.Second {
			t.Fatalf("lost only %v after the session ended", d)
		}
	case <-time.After(lease.KeepaliveInterval() + 5*time.Second):
		t.Fatal("the client never signalled the loss")
	}
	<-lease.Done()
	var le *fencedlock.LostError
	if !errors.As(lease.Err(), &le) || !strings.Contains(le.Reason, "renew returned false") {
		t.Fatalf("lost for another reason: %v", lease.Err())
	}
	if lease.Context().Err() == nil {
		t.Fatal("the lease's context is not cancelled")
	}
	if ok, err := lease.Release(ctx); ok || err != nil {
		t.Fatalf("release of the lost lease: %v %v", ok, err)
	}
	exec1(t, a, "SELECT fenced_lock_release($1, $2)", lease.Name(), *next)
}

func TestALeaseLostOnTheServerIsSignalledOnceAndNeverReleased(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	var cnt counter
	lk, err := fencedlock.NewFromConfig(cnt.config(t))
	if err != nil {
		t.Fatal(err)
	}
	var losses atomic.Int64
	lease, err := lk.Acquire(ctx, lockName(t, "l"), fencedlock.WithTTL(900*time.Millisecond),
		fencedlock.WithOnLost(func(*fencedlock.Lease, error) { losses.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	if !one[bool](t, a, "SELECT fenced_lock_force_release($1)", lease.Name()) {
		t.Fatal("force release")
	}
	select {
	case <-lease.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the loss was not signalled")
	}
	if !errors.Is(lease.Err(), fencedlock.ErrLost) || lease.Context().Err() == nil {
		t.Fatalf("Err %v, Context().Err %v", lease.Err(), lease.Context().Err())
	}
	before := cnt.snapshot()
	if ok, err := lease.Release(ctx); ok || err != nil {
		t.Fatalf("release of a lost lease: %v %v", ok, err)
	}
	if ok, err := lease.Renew(ctx); ok || err != nil {
		t.Fatalf("renew of a lost lease: %v %v", ok, err)
	}
	// at most the Terminate messages (5 bytes each) closing its connection
	// and the keepalive's; a release would be a query of some 60 bytes
	if got := cnt.snapshot(); got[1]-before[1] > 10 {
		t.Fatalf("a release of a lost lease went to the server: %d bytes", got[1]-before[1])
	}
	time.Sleep(time.Second)
	if losses.Load() != 1 {
		t.Fatalf("lost signalled %d times", losses.Load())
	}
	if got := endedBy(t, a, lease.Token()); got != "force_release" {
		t.Fatalf("history says %q", got)
	}
}

func TestAnAcquireThatWaitedLongerThanItsTTLIsLiveAndKeptAlive(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	a := admin(t)
	const ttl = time.Second
	name := lockName(t, "l")
	var first int64
	if err := a.QueryRow(ctx, "SELECT fenced_lock_try_acquire($1, '30 s')", name).Scan(&first); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(2 * ttl) // the waiter waits twice its ttl
		a2, err := pgxConnect(dbDSN)
		if err == nil {
			defer a2.Close(context.Background())
			_, _ = a2.Exec(context.Background(), "SELECT fenced_lock_release($1, $2)", name, first)
		}
	}()
	start := time.Now()
	lease, err := newLocker(t).Acquire(ctx, name, fencedlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	waited := time.Since(start)
	if waited < 2*ttl {
		t.Fatalf("granted after %v, before the holder released", waited)
	}
	time.Sleep(2 * ttl)
	select {
	case <-lease.Done():
		t.Fatalf("lost after waiting %v: %v", waited, lease.Err())
	default:
	}
	if !live(t, a, name, lease.Token()) {
		t.Fatal("not live on the server")
	}
	if ok, err := lease.Release(ctx); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
}
