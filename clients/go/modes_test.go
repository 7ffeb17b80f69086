package fencedlock_test

// Shared leases and permits (0.3.0): every call takes them as the server
// does, and they are sent only when they are not the default.

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v4"

	fencedlock "github.com/fenced-lock/fenced_lock/clients/go"
)

func TestSharedLeasesAndPermitsAreGrantedSideBySide(t *testing.T) {
	t.Parallel()
	needVersion(t, "0.3.0", "shared leases and permits")
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	lk := newLocker(t, fencedlock.WithTTL(5*time.Second))
	shared := lockName(t, "shared")
	r1, err := lk.TryAcquire(ctx, shared, fencedlock.WithShared(true))
	if err != nil || r1 == nil {
		t.Fatalf("shared 1: %v %v", r1, err)
	}
	defer r1.Release(ctx)
	r2, err := lk.TryAcquire(ctx, shared, fencedlock.WithShared(true))
	if err != nil || r2 == nil || r2.Token() == r1.Token() {
		t.Fatalf("shared 2 beside 1: %v %v", r2, err)
	}
	defer r2.Release(ctx)
	if w, err := lk.TryAcquire(ctx, shared); w != nil || err != nil {
		t.Fatalf("an exclusive lease beside shared ones: %v %v", w, err)
	}
	if mode := one[string](t, a, "SELECT mode FROM fenced_lock_leases WHERE token = $1", r1.Token()); mode != "shared" {
		t.Fatalf("mode %q", mode)
	}

	sem := lockName(t, "sem")
	var leases []*fencedlock.Lease
	for i := 0; i < 2; i++ {
		l, err := lk.TryAcquire(ctx, sem, fencedlock.WithPermits(2))
		if err != nil || l == nil {
			t.Fatalf("permit %d: %v %v", i, l, err)
		}
		defer l.Release(ctx)
		leases = append(leases, l)
	}
	if l, err := lk.TryAcquire(ctx, sem, fencedlock.WithPermits(2)); l != nil || err != nil {
		t.Fatalf("a third permit of 2: %v %v", l, err)
	}
	if ok, err := leases[0].Release(ctx); !ok || err != nil {
		t.Fatalf("release a permit: %v %v", ok, err)
	}
	l, err := lk.TryAcquire(ctx, sem, fencedlock.WithPermits(2))
	if err != nil || l == nil {
		t.Fatalf("a permit after a release: %v %v", l, err)
	}
	defer l.Release(ctx)
}

// modeOf is the mode and permit count the server recorded for token.
func modeOf(t *testing.T, conn *pgx.Conn, token int64) (string, *int32) {
	t.Helper()
	var mode string
	var permits *int32
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := conn.QueryRow(ctx, "SELECT mode, permits FROM fenced_lock_leases WHERE token = $1", token).Scan(&mode, &permits); err != nil {
		t.Fatal(err)
	}
	return mode, permits
}

func TestSharedLeasesAreWaitedForRenewedAndReleasedLikeExclusiveOnes(t *testing.T) {
	t.Parallel()
	needVersion(t, "0.3.0", "shared leases")
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	lk := newLocker(t, fencedlock.WithTTL(2*time.Second), fencedlock.WithKeepaliveInterval(200*time.Millisecond))
	name := lockName(t, "shared")
	var renewals [2]atomic.Int64
	var leases []*fencedlock.Lease
	for i := range renewals {
		n := &renewals[i]
		// the second also ends with its session
		l, err := lk.Acquire(ctx, name, fencedlock.WithShared(true), fencedlock.WithWait(5*time.Second),
			fencedlock.WithSessionBound(i == 1), fencedlock.WithOnRenew(func(*fencedlock.Lease) { n.Add(1) }))
		if err != nil {
			t.Fatalf("shared %d: %v", i, err)
		}
		defer l.Release(ctx)
		leases = append(leases, l)
	}
	if !leases[0].Shared() || leases[0].Token() == leases[1].Token() {
		t.Fatalf("two shared leases: %d %d", leases[0].Token(), leases[1].Token())
	}
	if mode, permits := modeOf(t, a, leases[0].Token()); mode != "shared" || permits != nil {
		t.Fatalf("mode %q, permits %v", mode, permits)
	}
	if !one[bool](t, a, "SELECT session_bound FROM fenced_lock_leases WHERE token = $1", leases[1].Token()) {
		t.Fatal("the session-bound shared lease is not recorded as such")
	}
	// without keepalive, a shared lease is renewed by hand
	manual, err := lk.TryAcquire(ctx, name, fencedlock.WithShared(true), fencedlock.WithKeepalive(false))
	if err != nil || manual == nil {
		t.Fatalf("a third shared lease: %v %v", manual, err)
	}
	if ok, err := manual.Renew(ctx); !ok || err != nil {
		t.Fatalf("renew by hand: %v %v", ok, err)
	}
	if ok, err := manual.Release(ctx); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	// an exclusive request waits for every shared lease to end
	_, err = lk.Acquire(ctx, name, fencedlock.WithWait(300*time.Millisecond))
	checkKind(t, err, "55P03")
	eventually(t, 5*time.Second, "both shared leases renewed", func() bool {
		return renewals[0].Load() >= 2 && renewals[1].Load() >= 2
	})
	for i, l := range leases {
		if !live(t, a, name, l.Token()) {
			t.Fatalf("shared %d not live", i)
		}
		if ok, err := l.Release(ctx); !ok || err != nil {
			t.Fatalf("release shared %d: %v %v", i, ok, err)
		}
		if got := endedBy(t, a, l.Token()); got != "release" {
			t.Fatalf("shared %d ended by %q", i, got)
		}
	}
	x, err := lk.TryAcquire(ctx, name)
	if err != nil || x == nil {
		t.Fatalf("exclusive once the shared leases ended: %v %v", x, err)
	}
	defer x.Release(ctx)
}

func TestAPermitIsWaitedForRenewedReleasedAndTakenByDo(t *testing.T) {
	t.Parallel()
	needVersion(t, "0.3.0", "permits")
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	lk := newLocker(t, fencedlock.WithTTL(2*time.Second), fencedlock.WithKeepaliveInterval(200*time.Millisecond),
		fencedlock.WithPermits(2))
	name := lockName(t, "sem")
	var renewals [2]atomic.Int64
	p1, err := lk.Acquire(ctx, name, fencedlock.WithOnRenew(func(*fencedlock.Lease) { renewals[0].Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Release(ctx)
	holder := name + ":worker-2"
	p2, err := lk.TryAcquire(ctx, name, fencedlock.WithHolder(holder),
		fencedlock.WithOnRenew(func(*fencedlock.Lease) { renewals[1].Add(1) }))
	if err != nil || p2 == nil {
		t.Fatalf("the second permit: %v %v", p2, err)
	}
	defer p2.Release(ctx)
	// Its holder asking again gets its permit back, renewed (the retry-safe
	// acquire). Not released: it is the same permit as p2.
	again, err := lk.TryAcquire(ctx, name, fencedlock.WithHolder(holder), fencedlock.WithKeepalive(false),
		fencedlock.WithConn(admin(t)))
	if err != nil || again == nil || again.Token() != p2.Token() {
		t.Fatalf("the holder's own permit back: %v %v (p2 %d)", again, err, p2.Token())
	}
	if ok, err := again.Renew(ctx); !ok || err != nil {
		t.Fatalf("renew by hand: %v %v", ok, err)
	}
	if mode, permits := modeOf(t, a, p1.Token()); mode != "permit" || permits == nil || *permits != 2 || p1.Permits() != 2 {
		t.Fatalf("mode %q, permits %v, Permits() %d", mode, permits, p1.Permits())
	}
	// a third waits until a permit frees, then is granted a new token
	type result struct {
		lease *fencedlock.Lease
		err   error
	}
	third := make(chan result, 1)
	go func() {
		l, err := lk.Acquire(ctx, name, fencedlock.WithWait(10*time.Second))
		third <- result{l, err}
	}()
	eventually(t, 5*time.Second, "the third waits in line", func() bool {
		return one[int](t, a, "SELECT count(*)::int FROM fenced_lock_waiters WHERE name = $1", name) == 1
	})
	eventually(t, 5*time.Second, "both permits renewed", func() bool {
		return renewals[0].Load() >= 2 && renewals[1].Load() >= 2
	})
	if ok, err := p1.Release(ctx); !ok || err != nil {
		t.Fatalf("release a permit: %v %v", ok, err)
	}
	var p3 result
	select {
	case p3 = <-third:
	case <-time.After(10 * time.Second):
		t.Fatal("the third was not granted when a permit freed")
	}
	if p3.err != nil || p3.lease.Token() <= p2.Token() {
		t.Fatalf("the third permit: %v %v", p3.lease, p3.err)
	}
	defer p3.lease.Release(ctx)
	if !live(t, a, name, p2.Token()) || !live(t, a, name, p3.lease.Token()) {
		t.Fatal("the two permits are not both live")
	}
	for _, l := range []*fencedlock.Lease{p2, p3.lease} {
		if ok, err := l.Release(ctx); !ok || err != nil {
			t.Fatalf("release: %v %v", ok, err)
		}
	}
	// Do with permits: fn runs under a permit, which is released after it
	var token int64
	err = lk.Do(ctx, name, func(ctx context.Context, lease *fencedlock.Lease) error {
		token = lease.Token()
		if mode, _ := modeOf(t, a, token); mode != "permit" {
			t.Errorf("Do's lease is a %q lease", mode)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := endedBy(t, a, token); got != "release" {
		t.Fatalf("Do's permit ended by %q", got)
	}
}

func TestSharedAndPermitsAreSentOnlyWhenTheyAreNotTheDefault(t *testing.T) {
	t.Parallel()
	needVersion(t, "0.3.0", "shared leases and permits")
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	lk := newLocker(t, fencedlock.WithTTL(5*time.Second))
	name := lockName(t, "sent")
	sent := func(l *fencedlock.Lease) string {
		return one[string](t, a, "SELECT query FROM pg_stat_activity WHERE pid = $1", int32(l.Conn().PgConn().PID()))
	}
	for _, c := range []struct {
		what     string
		acquire  func() (*fencedlock.Lease, error)
		has, not []string
	}{
		// without them an exclusive acquire also runs on a 0.2.0 server
		{"try", func() (*fencedlock.Lease, error) { return lk.TryAcquire(ctx, name) },
			[]string{"fenced_lock_try_acquire"}, []string{"shared", "permits"}},
		{"acquire", func() (*fencedlock.Lease, error) { return lk.Acquire(ctx, name) },
			[]string{"fenced_lock_acquire"}, []string{"shared", "permits"}},
		{"shared", func() (*fencedlock.Lease, error) { return lk.Acquire(ctx, name, fencedlock.WithShared(true)) },
			[]string{"shared =>"}, []string{"permits"}},
		{"permits", func() (*fencedlock.Lease, error) { return lk.TryAcquire(ctx, name, fencedlock.WithPermits(3)) },
			[]string{"permits =>"}, []string{"shared"}},
	} {
		l, err := c.acquire()
		if err != nil || l == nil {
			t.Fatalf("%s: %v %v", c.what, l, err)
		}
		q := sent(l)
		for _, h := range c.has {
			if !strings.Contains(q, h) {
				t.Fatalf("%s: %q does not say %q", c.what, q, h)
			}
		}
		for _, n := range c.not {
			if strings.Contains(q, n) {
				t.Fatalf("%s: %q says %q", c.what, q, n)
			}
		}
		if ok, err := l.Release(ctx); !ok || err != nil {
			t.Fatalf("%s: release: %v %v", c.what, ok, err)
		}
	}
}
