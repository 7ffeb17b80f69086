package fencedlock_test

// Child processes: the conformance example, and this test binary run as a
// helper program (runHelper) for the tests that must signal a process and
// look inside it at once. Every child is killed at the end of its test.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v4"

	fencedlock "github.com/fenced-lock/fenced_lock/clients/go"
)

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
