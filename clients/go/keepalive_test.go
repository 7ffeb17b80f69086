package fencedlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	fencedlock "github.com/fenced-lock/fenced_lock/clients/go"
)

func TestKeepaliveKeepsACriticalSectionOfThreeTTLsAlive(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	a := admin(t)
	seed(t, "INSERT INTO docs VALUES (201, 'before', NULL)")
	const ttl = 2 * time.Second
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

func TestSIGSTOPPastTheTTLSignalsLostWithinASecondOfSIGCONTAndTheGuardedWriteIsRefused(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	a := admin(t)
	seed(t, "INSERT INTO docs VALUES (202, 'before', NULL)")
	c := startExample(t, nil, "hold", "--dsn", dbDSN, "--name", "docs:202", "--ttl", "2", "--hold", "8",
		"--write", "docs:202")
	acquired := c.next(t, 20*time.Second)
	if acquired.name() != "acquired" {
		t.Fatalf("first line: %s", acquired.raw)
	}
	old := acquired.int("token")
	c.signal(t, syscall.SIGSTOP)
	stopped := time.Now()

	// While it is stopped its lease expires and someone else takes the name
	// and writes: the stopped holder's write must not land after that.
	var token int64
	if err := a.QueryRow(ctx, "SELECT fenced_lock_acquire('docs:202', '30 s', '10 s')").Scan(&token); err != nil {
		t.Fatal(err)
	}
	if token <= old {
		t.Fatalf("new token %d not above %d", token, old)
	}
	exec1(t, a, "UPDATE docs SET body = 'new holder', fence_token = $1 WHERE id = 202", token)
	t.Logf("taken over after %v with token %d", time.Since(stopped), token)
	time.Sleep(4*time.Second - time.Since(stopped))
	cont := c.signal(t, syscall.SIGCONT)

	lost, before := c.until(t, "lost", 10*time.Second)
	for _, e := range before {
		if e.name() != "renewed" {
			t.Fatalf("before lost: %s", e.raw)
		}
	}
	delay := lost.at.Sub(cont)
	t.Logf("lost %v after SIGCONT (stopped %v, ttl 2 s)", delay, cont.Sub(stopped))
	if delay > time.Second {
		t.Fatalf("lost signalled %v after SIGCONT, more than a second", delay)
	}
	if lost.int("token") != old {
		t.Fatalf("lost: %s", lost.raw)
	}
	rest, code := c.rest(t, 20*time.Second)
	if len(rest) != 1 || rest[0].name() != "write" || rest[0].m["ok"] != false || rest[0].m["sqlstate"] != "FL001" {
		t.Fatalf("after lost, want only the refused write, got %v", rest)
	}
	if code != 3 {
		t.Fatalf("exit status %d, want 3", code)
	}
	if body := one[string](t, a, "SELECT body FROM docs WHERE id = 202"); body != "new holder" {
		t.Fatalf("the stale write landed: %q", body)
	}
	// a lost lease is not released by the client: the name is the new holder's
	if !live(t, a, "docs:202", token) {
		t.Fatal("the new holder's lease is not live")
	}
	exec1(t, a, "SELECT fenced_lock_release('docs:202', $1)", token)
}

func TestAfterAPausePastTheDeadlineTheKeepaliveSignalsLostWithoutSendingARenew(t *testing.T) {
	c := startHelper(t, "paused-holder", "FL_GO_HELPER_DSN="+dbDSN, "FL_GO_HELPER_NAME="+lockName(t, "l"))
	if e := c.next(t, 20*time.Second); e.name() != "acquired" {
		t.Fatalf("first line: %s", e.raw)
	}
	// stop it just after a renew, so that no renew is in flight
	renewed, _ := c.until(t, "renewed", 10*time.Second)
	c.signal(t, syscall.SIGSTOP)
	time.Sleep(2500 * time.Millisecond) // ttl 1 s
	cont := c.signal(t, syscall.SIGCONT)
	lost, others := c.until(t, "lost", 10*time.Second)
	if len(others) != 0 {
		t.Fatalf("between the stop and the loss: %v", others)
	}
	t.Logf("lost %v after SIGCONT", lost.at.Sub(cont))
	if lost.at.Sub(cont) > time.Second {
		t.Fatalf("lost %v after SIGCONT", lost.at.Sub(cont))
	}
	if lost.int("written") != renewed.int("written") {
		t.Fatalf("%d bytes were sent after the pause before the loss was signalled",
			lost.int("written")-renewed.int("written"))
	}
	ended, _ := c.until(t, "ended", 10*time.Second)
	// then only the Terminate (5 bytes) closing the keepalive's connection
	if d := ended.int("written") - lost.int("written"); d > 5 {
		t.Fatalf("%d bytes sent after the loss", d)
	}
	if _, code := c.rest(t, 10*time.Second); code != 3 {
		t.Fatalf("helper exit %d", code)
	}
}

func TestWhenTheNetworkIsCutARenewThatGetsNoAnswerIsLostAtTheDeadlineNotLater(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	link := startBlackhole(t)
	const ttl = 1500 * time.Millisecond
	renewedAt := make(chan time.Time, 64)
	lostAt := make(chan time.Time, 1)
	lease, err := newLockerDSN(t, link.dsn(t)).Acquire(ctx, lockName(t, "l"), fencedlock.WithTTL(ttl),
		fencedlock.WithOnRenew(func(*fencedlock.Lease) { renewedAt <- time.Now() }),
		fencedlock.WithOnLost(func(*fencedlock.Lease, error) { lostAt <- time.Now() }))
	if err != nil {
		t.Fatal(err)
	}
	var last time.Time
	select {
	case last = <-renewedAt:
	case <-time.After(5 * time.Second):
		t.Fatal("no renew")
	}
	link.cut()
	cutAt := time.Now()
	// the client's deadline now: the last renew's sending plus the ttl (the
	// next renew is not due for an interval, so nothing moves it)
	deadline := lease.Deadline()
	if d := deadline.Sub(last); d > ttl || d < ttl-time.Second {
		t.Fatalf("the deadline is %v after the last renew returned, want a little under the ttl %v", d, ttl)
	}
	select {
	case at := <-lostAt:
		// at the deadline, not later (1 s of slack for a loaded machine),
		// and not before it either
		t.Logf("cut %v after the last renew; lost %v after the deadline", cutAt.Sub(last), at.Sub(deadline))
		if at.Before(deadline.Add(-5*time.Millisecond)) || at.After(deadline.Add(time.Second)) {
			t.Fatalf("lost %v after the deadline", at.Sub(deadline))
		}
	case <-time.After(ttl + 5*time.Second):
		t.Fatal("never signalled lost while every renew went unanswered")
	}
	var le *fencedlock.LostError
	if !errors.As(lease.Err(), &le) || !strings.Contains(le.Reason, "deadline") {
		t.Fatalf("lost for another reason: %v", lease.Err())
	}
	// the server never heard of it: its lease is still live a little longer
	// (the client's deadline comes first), and then it expires on its own
	eventually(t, 2*ttl, "the server's lease expired", func() bool { return !live(t, a, lease.Name(), lease.Token()) })
	start := time.Now()
	if ok, err := lease.Release(ctx); ok || err != nil {
		t.Fatalf("release of the lost lease: %v %v", ok, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("release of a lost lease took %v with the network cut", d)
	}
}

func TestARenewHangingOnASilentlyDeadConnectionIsRetriedOnANewOneAndTheLeaseStaysLive(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	link := startBlackhole(t)
	const ttl = 4 * time.Second
	renewedAt := make(chan time.Time, 64)
	// the lease on a direct connection; the keepalive through the proxy
	lease, err := newLockerDSN(t, link.dsn(t)).Acquire(ctx, lockName(t, "l"), fencedlock.WithTTL(ttl),
		fencedlock.WithConn(admin(t)),
		fencedlock.WithOnRenew(func(*fencedlock.Lease) { renewedAt <- time.Now() }))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	var pids []int32
	eventually(t, 10*time.Second, "a keepalive connection", func() bool {
		pids = keepalivePIDs(t, a)
		return len(pids) == 1
	})
	select {
	case <-renewedAt:
	case <-time.After(5 * time.Second):
		t.Fatal("no renew")
	}
	link.cutExisting()
	cutAt := time.Now()
	// the next renew hangs; it is given up after max(interval, 1 s) and
	// sent again on a new connection, well before the deadline
	var again time.Time
	for again.IsZero() {
		select {
		case r := <-renewedAt:
			if r.After(cutAt) {
				again = r
			}
		case <-time.After(ttl):
			t.Fatalf("no renew within the ttl after the cut: %v", lease.Err())
		}
	}
	t.Logf("renewed on a new connection %v after the cut (interval %v)", again.Sub(cutAt), lease.KeepaliveInterval())
	time.Sleep(ttl) // past the deadline the dead connection's renew would have left
	select {
	case <-lease.Done():
		t.Fatalf("lost: %v", lease.Err())
	default:
	}
	if !live(t, a, lease.Name(), lease.Token()) {
		t.Fatal("not live on the server")
	}
	if ok, err := lease.Release(ctx); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
}

func TestTerminatingTheKeepaliveConnectionMakesItReconnectAndRenewAndTheLeaseStaysLive(t *testing.T) {
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

func TestNoRenewIsSentAfterReleaseAndTheKeepaliveConnectionIsGoneWhenReleaseReturns(t *testing.T) {
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
	// A transaction that asserted the lease holds its name lock shared until
	// it ends; a renew waits for it (it needs the lock exclusive).
	blocker, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, "SELECT fenced_lock_assert($1, $2)", lease.Name(), lease.Token()); err != nil {
		t.Fatal(err)
	}
	watch := admin(t)
	eventually(t, 5*time.Second, "the keepalive's renew waiting for the name lock", func() bool {
		return one[int](t, watch, `SELECT count(*)::int FROM pg_stat_activity WHERE datname = $1
		   AND application_name = $2 AND wait_event_type = 'Lock' AND query LIKE '%fenced_lock_renew%'`,
			testDB, fencedlock.KeepaliveApplicationName) == 1
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
	// For a second, Release must wait: its connection sends nothing.
	end := time.Now().Add(time.Second)
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

func TestALeaseLostOnTheServerIsSignalledOnceAndNeverReleased(t *testing.T) {
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
