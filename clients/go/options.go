package fencedlock

import (
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v4"
)

// DefaultTTL is the server's default ttl.
const DefaultTTL = 30 * time.Second

// DefaultAttempts is how many times Do runs in all when its function keeps
// failing with FL001.
const DefaultAttempts = 5

// An Option sets one argument. Options given to a constructor (New,
// NewFromPool, ...) are the locker's defaults; options given to a call
// (Acquire, TryAcquire, Do) override them for that call. WithConn is for
// calls only; WithTransactionPooling and WithSchema for constructors only.
type Option func(*settings)

type settings struct {
	ttl          time.Duration
	wait         time.Duration
	waitSet      bool
	holder       *string
	sessionBound bool
	shared       bool
	permits      int
	keepalive    bool
	interval     time.Duration
	intervalSet  bool
	attempts     int
	conn         *pgx.Conn
	connSet      bool
	txPooling    bool
	txPoolingSet bool
	schema       string
	schemaSet    bool
	onRenew      func(*Lease)
	onLost       func(*Lease, error)
}

func defaultSettings() settings {
	return settings{ttl: DefaultTTL, permits: 1, keepalive: true, attempts: DefaultAttempts}
}

// WithTTL sets the lease's ttl (default 30 s; the server's maximum is
// fenced_lock.max_ttl). It must be at least a microsecond, the server's
// resolution.
func WithTTL(ttl time.Duration) Option { return func(s *settings) { s.ttl = ttl } }

// WithWait bounds how long Acquire (and Do) wait for the lock; then
// ErrWaitTimeout. Without it they wait until granted (or ctx ends). 0 means
// "do not queue": the lock now or ErrWaitTimeout.
func WithWait(wait time.Duration) Option {
	return func(s *settings) { s.wait, s.waitSet = wait, true }
}

// WithHolder names the worker. An acquire by the same holder (and role) of
// a lease it holds returns the same token and extends it, so a caller that
// lost the reply of an acquire can simply call again.
func WithHolder(holder string) Option { return func(s *settings) { h := holder; s.holder = &h } }

// WithSessionBound makes the lease also end when the lease's database
// session ends (its connection closes, the client dies, the backend is
// terminated). Refused with ErrUsage on a locker made
// WithTransactionPooling(true).
func WithSessionBound(on bool) Option { return func(s *settings) { s.sessionBound = on } }

// WithShared asks for a shared lease: any number of shared leases of a name
// live together, each with its own token; an exclusive lease excludes them
// all. Needs fenced_lock 0.3.0 on the server.
func WithShared(on bool) Option { return func(s *settings) { s.shared = on } }

// WithPermits makes the name a counting semaphore of n permits: up to n
// leases live at once, each exclusive to its holder with its own token. 1
// (the default) is a plain exclusive lease. n > 1 needs fenced_lock 0.3.0.
func WithPermits(n int) Option { return func(s *settings) { s.permits = n } }

// WithKeepalive turns the keepalive on (the default) or off. Without it the
// lease lives until its ttl unless renewed (Lease.Renew), and Done is
// closed only when a Renew returns false.
func WithKeepalive(on bool) Option { return func(s *settings) { s.keepalive = on } }

// WithKeepaliveInterval sets how often the keepalive renews (default: a
// third of the ttl). It must be shorter than the ttl.
func WithKeepaliveInterval(d time.Duration) Option {
	return func(s *settings) { s.interval, s.intervalSet = d, true }
}

// WithAttempts sets how many times Do runs in all when its function fails
// with FL001 (default 5).
func WithAttempts(n int) Option { return func(s *settings) { s.attempts = n } }

// WithConn makes the call acquire on conn (which must not be inside a
// transaction block) and keep the lease there; the lease never closes it.
// Calls only.
func WithConn(conn *pgx.Conn) Option {
	return func(s *settings) { s.conn, s.connSet = conn, true }
}

// WithTransactionPooling says the locker's connections go through a pooler
// in transaction mode (PgBouncer pool_mode=transaction): session-bound
// leases are refused with ErrUsage, and the connections the locker opens
// itself from a connection string or config use the simple protocol.
// Constructors only.
func WithTransactionPooling(on bool) Option {
	return func(s *settings) { s.txPooling, s.txPoolingSet = on, true }
}

// WithSchema names the schema fenced_lock was created in, when it is not on
// the connections' search_path. Constructors only.
func WithSchema(schema string) Option {
	return func(s *settings) { s.schema, s.schemaSet = schema, true }
}

// WithOnRenew calls fn, from the keepalive's goroutine, after each
// successful renew. fn must return quickly: the keepalive waits for it.
func WithOnRenew(fn func(*Lease)) Option { return func(s *settings) { s.onRenew = fn } }

// WithOnLost calls fn once, from the goroutine that saw it, when the lease
// is lost (Done is closed just before). fn must return quickly.
func WithOnLost(fn func(lease *Lease, err error)) Option {
	return func(s *settings) { s.onLost = fn }
}

type scope int

const (
	scopeLocker scope = iota
	scopeCall
)

// check returns the first bad argument, before anything is sent.
func (s *settings) check(sc scope) *Error {
	if sc == scopeLocker && s.connSet {
		return invalidArgument("WithConn", "is an option of a call (Acquire, TryAcquire, Do), not of a locker")
	}
	if sc == scopeCall && s.txPoolingSet {
		return invalidArgument("WithTransactionPooling", "is an option of a locker (New...), not of a call")
	}
	if sc == scopeCall && s.schemaSet {
		return invalidArgument("WithSchema", "is an option of a locker (New...), not of a call")
	}
	if s.connSet && s.conn == nil {
		return invalidArgument("conn", "is nil")
	}
	if s.ttl < time.Microsecond {
		return invalidArgument("ttl", "must be at least 1 microsecond, got %v", s.ttl)
	}
	if s.waitSet && s.wait < 0 {
		return invalidArgument("wait", "must not be negative, got %v", s.wait)
	}
	if s.holder != nil {
		if err := checkText("holder", *s.holder); err != nil {
			return err
		}
	}
	if s.permits < 1 {
		return invalidArgument("permits", "must be at least 1, got %d", s.permits)
	}
	if s.shared && s.permits > 1 {
		return invalidArgument("permits", "a shared lease takes no permit count, got shared with permits %d", s.permits)
	}
	if s.intervalSet && s.interval <= 0 {
		return invalidArgument("keepalive interval", "must be positive, got %v", s.interval)
	}
	if s.intervalSet && s.interval >= s.ttl {
		return invalidArgument("keepalive interval", "must be shorter than the ttl (%v), got %v", s.ttl, s.interval)
	}
	if s.attempts < 1 {
		return invalidArgument("attempts", "must be at least 1, got %d", s.attempts)
	}
	if s.schemaSet {
		if s.schema == "" {
			return invalidArgument("schema", "is empty")
		}
		if err := checkText("schema", s.schema); err != nil {
			return err
		}
	}
	return nil
}

func checkName(name string) *Error {
	if name == "" {
		return invalidArgument("name", "is empty")
	}
	return checkText("name", name)
}

// checkText refuses what no text value can hold: pgx speaks UTF-8 to the
// server, and PostgreSQL text cannot contain a NUL byte.
func checkText(arg, v string) *Error {
	if !utf8.ValidString(v) {
		return invalidArgument(arg, "is not valid UTF-8")
	}
	if strings.IndexByte(v, 0) >= 0 {
		return invalidArgument(arg, "contains a NUL byte")
	}
	return nil
}

// keepaliveInterval is the interval asked for, or a third of the ttl.
func (s *settings) keepaliveInterval() time.Duration {
	if s.intervalSet {
		return s.interval
	}
	if d := s.ttl / 3; d > 0 {
		return d
	}
	return time.Nanosecond
}
