// Command fenced-lock-example is the Go client's pair of conformance
// examples (clients/README.md, "The conformance examples"):
//
//	fenced-lock-example hold --dsn DSN --name NAME --ttl SECONDS --hold SECONDS [--wait SECONDS]
//	    [--write TABLE:ID] [--session-bound] [--shared] [--permits N] [--holder TEXT]
//	fenced-lock-example inventory --dsn DSN --item ID --sales N --ttl SECONDS
//
// They print JSON lines on stdout and nothing else there (diagnostics go to
// stderr). Exit status: 0 done, 3 the lease was lost, 1 any other failure
// (after an "error" line), 2 a bad command line.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"

	fencedlock "github.com/fenced-lock/fenced_lock/clients/go"
)

const (
	exitDone    = 0
	exitFailure = 1
	exitUsage   = 2
	exitLost    = 3
)

// out writes one JSON line at a time: events come from the main goroutine
// and from the keepalive's.
type out struct {
	mu sync.Mutex
	w  io.Writer
}

func (o *out) emit(v interface{}) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b) // one line, '\n' included
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err) // every event is a plain struct
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = o.w.Write(b.Bytes())
}

type tokenEvent struct {
	Event string `json:"event"`
	Token int64  `json:"token"`
}

type writeEvent struct {
	Event    string  `json:"event"`
	OK       bool    `json:"ok"`
	SQLState *string `json:"sqlstate,omitempty"`
}

type releasedEvent struct {
	Event    string `json:"event"`
	Token    int64  `json:"token"`
	Released bool   `json:"released"`
}

type errorEvent struct {
	Event    string  `json:"event"`
	SQLState *string `json:"sqlstate"`
	Message  string  `json:"message"`
}

type soldEvent struct {
	Event string `json:"event"`
	Stock int    `json:"stock"`
}

type eventOnly struct {
	Event string `json:"event"`
}

type doneEvent struct {
	Event string `json:"event"`
	Sold  int    `json:"sold"`
}

func (o *out) fail(err error) int {
	var state *string
	if s := fencedlock.SQLState(err); s != "" {
		state = &s
	}
	o.emit(errorEvent{Event: "error", SQLState: state, Message: err.Error()})
	return exitFailure
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	o := &out{w: stdout}
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: fenced-lock-example hold|inventory ARGS...")
		return exitUsage
	}
	switch args[0] {
	case "hold":
		return hold(args[1:], o, stderr)
	case "inventory":
		return inventory(args[1:], o, stderr)
	}
	fmt.Fprintf(stderr, "fenced-lock-example: unknown example %q (hold, inventory)\n", args[0])
	return exitUsage
}

// seconds is a flag of seconds, fractions allowed. Its range is left to the
// library (a ttl of 0 is its invalid-argument error, exit 1); only what is
// not a number is a bad command line.
type seconds struct {
	d   time.Duration
	set bool
}

func (s *seconds) String() string { return s.d.String() }

func (s *seconds) Set(v string) error {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > 1e9 {
		return fmt.Errorf("not a number of seconds: %q", v)
	}
	s.d, s.set = time.Duration(f*float64(time.Second)), true
	return nil
}

func parse(fs *flag.FlagSet, args []string, required ...string) bool {
	if err := fs.Parse(args); err != nil {
		return false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return false
	}
	seen := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { seen[f.Name] = true })
	for _, r := range required {
		if !seen[r] {
			fmt.Fprintf(fs.Output(), "%s: --%s is required\n", fs.Name(), r)
			return false
		}
	}
	return true
}

func hold(args []string, o *out, stderr io.Writer) int {
	fs := flag.NewFlagSet("hold", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := fs.String("dsn", "", "postgresql:// URL")
	name := fs.String("name", "", "lock name")
	var ttl, holdFor, wait seconds
	fs.Var(&ttl, "ttl", "lease ttl, seconds")
	fs.Var(&holdFor, "hold", "how long to hold, seconds")
	fs.Var(&wait, "wait", "wait at most this long for the lock, seconds")
	write := fs.String("write", "", "TABLE:ID to update with the token")
	sessionBound := fs.Bool("session-bound", false, "session-bound lease")
	shared := fs.Bool("shared", false, "shared lease")
	permits := fs.Int("permits", 1, "permits (a semaphore of N)")
	holder := fs.String("holder", "", "holder text")
	if !parse(fs, args, "dsn", "name", "ttl", "hold") {
		return exitUsage
	}
	var table, id string
	if *write != "" {
		i := strings.LastIndexByte(*write, ':')
		if i <= 0 || i == len(*write)-1 {
			fmt.Fprintf(stderr, "hold: --write wants TABLE:ID, got %q\n", *write)
			return exitUsage
		}
		table, id = (*write)[:i], (*write)[i+1:]
	}

	ctx := context.Background()
	locker, err := fencedlock.New(*dsn)
	if err != nil {
		return o.fail(err)
	}
	// The keepalive's events wait until "acquired" is out, so the lines
	// come in the order they happened.
	acquired := make(chan struct{})
	opts := []fencedlock.Option{
		fencedlock.WithTTL(ttl.d),
		fencedlock.WithSessionBound(*sessionBound),
		fencedlock.WithShared(*shared),
		fencedlock.WithPermits(*permits),
		fencedlock.WithOnRenew(func(l *fencedlock.Lease) {
			<-acquired
			o.emit(tokenEvent{"renewed", l.Token()})
		}),
		fencedlock.WithOnLost(func(l *fencedlock.Lease, err error) {
			<-acquired
			o.emit(tokenEvent{"lost", l.Token()})
			fmt.Fprintln(stderr, err)
		}),
	}
	if wait.set {
		opts = append(opts, fencedlock.WithWait(wait.d))
	}
	if *holder != "" {
		opts = append(opts, fencedlock.WithHolder(*holder))
	}
	lease, err := locker.Acquire(ctx, *name, opts...)
	if err != nil {
		return o.fail(err)
	}
	o.emit(tokenEvent{"acquired", lease.Token()})
	close(acquired)

	time.Sleep(holdFor.d) // the whole time, lost or not: the write below must then be refused

	if table != "" {
		err := writeToken(ctx, lease, table, id)
		ev := writeEvent{Event: "write", OK: err == nil}
		if err != nil {
			if s := fencedlock.SQLState(err); s != "" {
				ev.SQLState = &s
			}
			fmt.Fprintln(stderr, "write:", err)
		}
		o.emit(ev)
	}

	if errors.Is(lease.Err(), fencedlock.ErrLost) {
		_, _ = lease.Release(ctx) // no round trip for a lost lease: it closes the connection
		return exitLost
	}
	released, err := lease.Release(ctx)
	if err != nil {
		return o.fail(err)
	}
	o.emit(releasedEvent{Event: "released", Token: lease.Token(), Released: released})
	if !released { // it had ended without the keepalive seeing it yet
		return exitLost
	}
	return exitDone
}

// writeToken runs the guarded UPDATE on the lease's connection, in a
// transaction of its own.
func writeToken(ctx context.Context, lease *fencedlock.Lease, table, id string) error {
	tx, err := lease.Conn().Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	sql := "UPDATE " + pgx.Identifier(strings.Split(table, ".")).Sanitize() + " SET fence_token = $1 WHERE id = $2"
	if _, err := tx.Exec(ctx, sql, lease.Token(), id); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func inventory(args []string, o *out, stderr io.Writer) int {
	fs := flag.NewFlagSet("inventory", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := fs.String("dsn", "", "postgresql:// URL")
	item := fs.Int("item", 0, "inventory item_id")
	sales := fs.Int("sales", 0, "units to sell")
	var ttl seconds
	fs.Var(&ttl, "ttl", "lease ttl, seconds")
	if !parse(fs, args, "dsn", "item", "sales", "ttl") {
		return exitUsage
	}

	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(*dsn)
	if err != nil {
		return o.fail(fencedlock.Wrap(err))
	}
	// One lease at a time: its connection and its keepalive's.
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["application_name"] = fmt.Sprintf("fenced_lock inventory pid %d", os.Getpid())
	pool, err := pgxpool.ConnectConfig(ctx, cfg)
	if err != nil {
		return o.fail(err)
	}
	defer pool.Close()
	locker, err := fencedlock.NewFromPool(pool, fencedlock.WithTTL(ttl.d),
		fencedlock.WithHolder(fmt.Sprintf("inventory pid %d", os.Getpid())))
	if err != nil {
		return o.fail(err)
	}
	// A test aid: FL_INVENTORY_STALL_AFTER_READ=SECONDS makes the first sale
	// stall that long between its read and its write, inside the lease (the
	// story of the README: read, stall past the ttl, write), after saying so
	// on stderr, so that a test can SIGSTOP the process right there.
	var stall time.Duration
	if v := os.Getenv("FL_INVENTORY_STALL_AFTER_READ"); v != "" {
		var st seconds
		if err := st.Set(v); err != nil {
			fmt.Fprintln(stderr, "inventory: FL_INVENTORY_STALL_AFTER_READ:", err)
			return exitUsage
		}
		stall = st.d
	}
	name := fmt.Sprintf("inventory:%d", *item)
	sold := 0
	for sold < *sales {
		soldOut, committed := false, false
		err := locker.Do(ctx, name, func(ctx context.Context, lease *fencedlock.Lease) error {
			committed = false
			tx, err := lease.Conn().Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			var stock int
			if err := tx.QueryRow(ctx, "SELECT stock FROM inventory WHERE item_id = $1", *item).Scan(&stock); err != nil {
				return err
			}
			if stock <= 0 {
				soldOut = true
				return nil
			}
			if stall > 0 {
				fmt.Fprintf(stderr, "inventory: read stock %d under token %d, stalling %v\n", stock, lease.Token(), stall)
				time.Sleep(stall)
				stall = 0
			}
			if _, err := tx.Exec(ctx, "UPDATE inventory SET stock = $1, fence_token = $2 WHERE item_id = $3",
				stock-1, lease.Token(), *item); err != nil {
				if fencedlock.IsStaleToken(err) {
					fmt.Fprintf(stderr, "inventory: token %d refused (FL001), Do runs again\n", lease.Token())
				}
				return err
			}
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			committed = true
			o.emit(soldEvent{"sold", stock - 1})
			return nil
		})
		if committed {
			sold++ // counted even if the release after it failed: the sale is in
		}
		if err != nil && !committed {
			return o.fail(err)
		}
		if err != nil {
			fmt.Fprintln(stderr, "inventory: release after a sale:", err)
		}
		if soldOut {
			o.emit(eventOnly{"sold_out"})
			break
		}
	}
	o.emit(doneEvent{"done", sold})
	return exitDone
}
