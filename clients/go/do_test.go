package fencedlock_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	fencedlock "github.com/fenced-lock/fenced_lock/clients/go"
)

func TestRetryHelperFourProcessesSellEveryUnitExactlyOnceWithOneStoppedPastItsTTL(t *testing.T) {
	t.Parallel()
	a := admin(t)
	seed(t, "INSERT INTO inventory VALUES (1, 100, NULL)")
	args := []string{"inventory", "--dsn", dbDSN, "--item", "1", "--sales", "25", "--ttl", "1"}
	// The first process stalls once between its read and its write, inside
	// the lease, and says so: it is stopped right there, past its ttl, and
	// must come back to an FL001, run again and still sell its 25.
	stalled := startExample(t, []string{"FL_INVENTORY_STALL_AFTER_READ=0.5"}, args...)
	procs := []*child{stalled}
	for i := 0; i < 3; i++ {
		procs = append(procs, startExample(t, nil, args...))
	}
	select {
	case line := <-stalled.stderr.lines:
		if !strings.Contains(line, "stalling") {
			t.Fatalf("stderr: %s", line)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the stalling process never read (stderr: %s)", stalled.stderr.String())
	}
	stalled.signal(t, syscall.SIGSTOP)
	stoppedAt := time.Now()
	time.Sleep(3 * time.Second) // 3x its ttl: the others take over and sell meanwhile
	sold := one[int](t, a, "SELECT 100 - stock FROM inventory WHERE item_id = 1")
	stalled.signal(t, syscall.SIGCONT)
	t.Logf("stopped %v; the other three sold %d meanwhile", time.Since(stoppedAt), sold)
	if sold == 0 {
		t.Fatal("nobody sold while the holder was stopped: its lease did not expire")
	}

	var stocks []int
	total := 0
	for i, p := range procs {
		events, code := p.rest(t, 60*time.Second)
		if code != 0 {
			t.Fatalf("process %d exited %d: %v", i, code, events)
		}
		n := 0
		for _, e := range events {
			switch e.name() {
			case "sold":
				stocks = append(stocks, int(e.int("stock")))
				n++
			case "done":
				if int(e.int("sold")) != n {
					t.Fatalf("process %d: done says %d, printed %d sales", i, e.int("sold"), n)
				}
				total += n
			case "sold_out":
			default:
				t.Fatalf("process %d: %s", i, e.raw)
			}
		}
		if n != 25 {
			t.Fatalf("process %d sold %d, want 25 (stock 100 = 4 x 25)", i, n)
		}
	}
	if !strings.Contains(stalled.stderr.String(), "FL001") {
		t.Fatalf("the stopped process never met FL001:\n%s", stalled.stderr.String())
	}
	sort.Ints(stocks)
	for i, s := range stocks {
		if s != i {
			t.Fatalf("the stocks written are not 0..99 once each: %v", stocks)
		}
	}
	if total != 100 || len(stocks) != 100 {
		t.Fatalf("sold %d in all", total)
	}
	if stock := one[int](t, a, "SELECT stock FROM inventory WHERE item_id = 1"); stock != 0 {
		t.Fatalf("stock %d", stock)
	}
	// the stopped process's lease ended by expiry: nobody released it
	expired := one[int](t, a, `SELECT count(*)::int FROM fenced_lock_history
	    WHERE name = 'inventory:1' AND holder = $1 AND ended_by = 'expiry'`,
		fmt.Sprintf("inventory pid %d", stalled.pid()))
	if expired < 1 {
		t.Fatal("the history has no expired lease of the stopped process")
	}
}

// forceRelease ends the lease behind the holder's back, as an expiry
// during a pause would.
func forceRelease(t *testing.T, name string) {
	t.Helper()
	a, err := pgxConnect(dbDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	if !one[bool](t, a, "SELECT fenced_lock_force_release($1)", name) {
		t.Fatalf("nothing to force-release on %s", name)
	}
}

func TestDoRunsAgainFromTheAcquireAfterFL001WithoutReleasingTheLostLease(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	seed(t, "INSERT INTO docs VALUES (301, 'v0', NULL)")
	var tokens []int64
	err := newLocker(t).Do(ctx, "docs:301", func(ctx context.Context, lease *fencedlock.Lease) error {
		tokens = append(tokens, lease.Token())
		// re-read on every attempt: what the previous one read is stale
		body := one[string](t, lease.Conn(), "SELECT body FROM docs WHERE id = 301")
		if len(tokens) == 1 {
			forceRelease(t, lease.Name())
		}
		_, err := lease.Conn().Exec(ctx, "UPDATE docs SET body = $1, fence_token = $2 WHERE id = 301",
			body+"+", lease.Token())
		return err
	}, fencedlock.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(tokens) != 2 || tokens[1] <= tokens[0] {
		t.Fatalf("attempts with tokens %v, want 2 growing", tokens)
	}
	if body := one[string](t, a, "SELECT body FROM docs WHERE id = 301"); body != "v0+" {
		t.Fatalf("body %q: the write of the lost lease landed or the retry did not", body)
	}
	if got := endedBy(t, a, tokens[0]); got != "force_release" {
		t.Fatalf("the lost lease ended by %q: it must not be released", got)
	}
	if got := endedBy(t, a, tokens[1]); got != "release" {
		t.Fatalf("the last lease ended by %q", got)
	}
}

func TestDoGivesUpAfterItsAttemptsWithTheLastFL001(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	seed(t, "INSERT INTO docs VALUES (302, 'v0', NULL)")
	var tokens []int64
	err := newLocker(t).Do(ctx, "docs:302", func(ctx context.Context, lease *fencedlock.Lease) error {
		tokens = append(tokens, lease.Token())
		forceRelease(t, lease.Name())
		_, err := lease.Conn().Exec(ctx, "UPDATE docs SET body = 'x', fence_token = $1 WHERE id = 302", lease.Token())
		return err
	}, fencedlock.WithAttempts(3), fencedlock.WithTTL(5*time.Second))
	if !errors.Is(err, fencedlock.ErrStaleToken) {
		t.Fatalf("want the last FL001, got %v", err)
	}
	if len(tokens) != 3 {
		t.Fatalf("%d attempts, want 3", len(tokens))
	}
	if !strings.Contains(err.Error(), fmt.Sprint(tokens[2])) {
		t.Fatalf("not the last attempt's error (tokens %v): %v", tokens, err)
	}
	if body := one[string](t, a, "SELECT body FROM docs WHERE id = 302"); body != "v0" {
		t.Fatalf("body %q", body)
	}
}

func TestDoReturnsAnyOtherErrorAtOnceAfterTheRelease(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	mine := errors.New("not a stale token")
	calls := 0
	var token int64
	err := newLocker(t).Do(ctx, lockName(t, "l"), func(ctx context.Context, lease *fencedlock.Lease) error {
		calls++
		token = lease.Token()
		return mine
	})
	if err != mine || calls != 1 {
		t.Fatalf("got %v after %d calls", err, calls)
	}
	if got := endedBy(t, a, token); got != "release" {
		t.Fatalf("ended by %q", got)
	}
	// a server error that is not FL001 is not retried either
	calls = 0
	err = newLocker(t).Do(ctx, lockName(t, "m"), func(ctx context.Context, lease *fencedlock.Lease) error {
		calls++
		token = lease.Token()
		_, err := lease.Conn().Exec(ctx, "UPDATE docs SET fence_token = NULL WHERE id = 1") // no row: fine
		if err != nil {
			return err
		}
		_, err = lease.Conn().Exec(ctx, "SELECT 1/0")
		return err
	})
	if fencedlock.SQLState(err) != "22012" || calls != 1 {
		t.Fatalf("got %v after %d calls", err, calls)
	}
	if got := endedBy(t, a, token); got != "release" {
		t.Fatalf("ended by %q", got)
	}
}

func TestDoReleasesWhenItsFunctionPanics(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	var token int64
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the function's own panic", r)
			}
		}()
		_ = newLocker(t).Do(ctx, lockName(t, "l"), func(ctx context.Context, lease *fencedlock.Lease) error {
			token = lease.Token()
			panic("boom")
		})
	}()
	if got := endedBy(t, a, token); got != "release" {
		t.Fatalf("ended by %q", got)
	}
	if pids := keepalivePIDs(t, a); len(pids) != 0 {
		t.Fatalf("keepalive still running: %v", pids)
	}
}

func TestDoesNotReleaseALeaseLostDuringItsFunction(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 30*time.Second)
	a := admin(t)
	var token int64
	err := newLocker(t).Do(ctx, lockName(t, "l"), func(ctx context.Context, lease *fencedlock.Lease) error {
		token = lease.Token()
		forceRelease(t, lease.Name())
		select {
		case <-lease.Done():
			return nil // the work stopped when the loss was signalled
		case <-time.After(10 * time.Second):
			return errors.New("the loss was not signalled")
		}
	}, fencedlock.WithTTL(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if got := endedBy(t, a, token); got != "force_release" {
		t.Fatalf("ended by %q", got)
	}
}
