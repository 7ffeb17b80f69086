package fencedlock_test

// Pauses and network faults: the process stopped past its ttl, a cut that
// leaves renews unanswered, a connection that dies silently.

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	fencedlock "github.com/fenced-lock/fenced_lock/clients/go"
)

func TestSIGSTOPPastTheTTLSignalsLostWithinASecondOfSIGCONTAndTheGuardedWriteIsRefused(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 60*time.Second)
	a := admin(t)
	seed(t, "INSERT INTO docs VALUES (202, 'before', NULL)")
	c := startExample(t, nil, "hold", "--dsn", dbDSN, "--name", "docs:202", "--ttl", "1", "--hold", "4",
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
	time.Sleep(2500*time.Millisecond - time.Since(stopped))
	cont := c.signal(t, syscall.SIGCONT)

	lost, before := c.until(t, "lost", 10*time.Second)
	for _, e := range before {
		if e.name() != "renewed" {
			t.Fatalf("before lost: %s", e.raw)
		}
	}
	delay := lost.at.Sub(cont)
	t.Logf("lost %v after SIGCONT (stopped %v, ttl 1 s)", delay, cont.Sub(stopped))
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
