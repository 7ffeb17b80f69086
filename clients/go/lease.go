package fencedlock

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
)

type leaseState int

const (
	held leaseState = iota
	releasing
	released
	lost
)

// A Lease is one grant of a lock name: its fencing token, the connection
// it was taken on, and (by default) a keepalive that renews it from a
// connection of its own. Write to guarded tables with Token(); stop the
// work when Done() is closed. Always end it with Release (defer it): that
// also gives its connection back.
//
// Its methods are safe for concurrent use, but the connection (Conn) is a
// pgx.Conn, used by one goroutine at a time.
type Lease struct {
	lk           *Locker
	name         string
	token        int64
	ttl          time.Duration
	holder       *string
	sessionBound bool
	shared       bool
	permits      int
	interval     time.Duration
	onRenew      func(*Lease)
	onLost       func(*Lease, error)

	conn     *pgx.Conn
	handback giveBackFn // nil when the caller passed the connection

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when lost

	mu         sync.Mutex
	state      leaseState
	err        error
	deadline   instant // on the lease clock: never later than the server's expiry
	handedBack bool
	ka         *keepalive
}

func newLease(lk *Locker, s settings, name string, token int64, conn *pgx.Conn, handback giveBackFn, parent context.Context) *Lease {
	ctx, cancel := context.WithCancel(parent)
	return &Lease{
		lk: lk, name: name, token: token, ttl: s.ttl, holder: s.holder, sessionBound: s.sessionBound,
		shared: s.shared, permits: s.permits, interval: s.keepaliveInterval(), onRenew: s.onRenew,
		onLost: s.onLost, conn: conn, handback: handback, ctx: ctx, cancel: cancel,
		done: make(chan struct{}),
	}
}

// Name is the lock name.
func (l *Lease) Name() string { return l.name }

// Token is the fencing token: write it into the guarded table's token
// column with every write made under this lease.
func (l *Lease) Token() int64 { return l.token }

// TTL is the ttl the lease was taken with; each renew extends it by that.
func (l *Lease) TTL() time.Duration { return l.ttl }

// Holder is the holder the lease was taken with, and whether there was one.
func (l *Lease) Holder() (string, bool) {
	if l.holder == nil {
		return "", false
	}
	return *l.holder, true
}

// SessionBound reports whether the lease ends with its connection's session.
func (l *Lease) SessionBound() bool { return l.sessionBound }

// Shared reports whether this is a shared lease.
func (l *Lease) Shared() bool { return l.shared }

// Permits is the permit count it was taken with (1: an exclusive lease).
func (l *Lease) Permits() int { return l.permits }

// KeepaliveInterval is how often the keepalive renews the lease.
func (l *Lease) KeepaliveInterval() time.Duration { return l.interval }

// Conn is the connection the lease was acquired on: use it for the guarded
// writes of a session-bound lease, or wherever the work should share the
// lease's session. It stays usable after a loss, until Release.
func (l *Lease) Conn() *pgx.Conn { return l.conn }

// Done is closed when the lease is lost: a renew said it had ended, its
// deadline passed before a renew succeeded (a pause, a network cut), or a
// Release found it no longer live. Stop the work; do not write. It is not
// closed by a Release of a live lease.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Context is cancelled when the lease is lost or released (and, for a
// lease of Do, when Do's ctx ends). Pass it to work that should stop then;
// see the README for why the guarded write itself is better sent with
// another context.
func (l *Lease) Context() context.Context { return l.ctx }

// Err is nil while the lease is held, a *LostError (errors.Is ErrLost) once
// lost, ErrReleased once released.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Deadline is the client's bound on the lease's expiry: the instant the
// acquire or the last successful renew was sent, plus the ttl. The server's
// expiry is never earlier.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline.wall()
}

func (l *Lease) currentDeadline() instant {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// extend moves the deadline to from+ttl after a successful renew sent at
// from. It reports false if that instant has already passed (the process
// was paused while the renew was in flight): then the lease may have
// expired on the server after the renew, and it counts as lost.
func (l *Lease) extend(from instant) bool {
	d := from.add(l.ttl)
	if !now().before(d) {
		return false
	}
	l.mu.Lock()
	if d > l.deadline {
		l.deadline = d
	}
	l.mu.Unlock()
	return true
}

func (t instant) before(u instant) bool { return t < u }

// markLost signals the loss, exactly once, and stops the keepalive. The
// lease is never released after this: the name may belong to someone else.
func (l *Lease) markLost(reason string, cause error) {
	l.mu.Lock()
	if l.state != held && l.state != releasing {
		l.mu.Unlock()
		return
	}
	err := &LostError{Name: l.name, Token: l.token, Reason: reason, Cause: cause}
	l.state, l.err = lost, err
	close(l.done)
	ka := l.ka
	l.mu.Unlock()
	l.cancel()
	if ka != nil {
		ka.signalStop()
	}
	if l.onLost != nil {
		l.onLost(l, err)
	}
}

func (l *Lease) fn(f string) string { return l.lk.fn(f) }

func (l *Lease) renewOn(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var ok bool
	err := conn.QueryRow(ctx, "SELECT "+l.fn("fenced_lock_renew")+"($1, $2::bigint)", l.name, l.token).Scan(&ok)
	return ok, err
}

// Renew renews the lease now, on the lease's own connection, by its ttl.
// With the keepalive on there is no need; without it, call it more often
// than the ttl. false means the lease had ended (Done is then closed).
func (l *Lease) Renew(ctx context.Context) (bool, error) {
	if l.Err() != nil {
		return false, nil
	}
	sent := now()
	ok, err := l.renewOn(ctx, l.conn)
	if err != nil {
		return false, Wrap(err)
	}
	if !ok {
		l.markLost("a renew returned false: the lease had ended on the server", nil)
		return false, nil
	}
	if !l.extend(sent) {
		l.markLost("the deadline passed while a renew was in flight", nil)
		return false, nil
	}
	return true, nil
}

// Querier is what Assert runs on: a *pgx.Conn, a pgx.Tx, a *pgxpool.Conn.
type Querier interface {
	Exec(ctx context.Context, sql string, arguments ...interface{}) (pgconn.CommandTag, error)
}

// Assert runs fenced_lock_assert(name, token) on q: ErrStaleToken unless
// the lease is live, and, inside a transaction, no other lease of the name
// can be granted until it ends. A guarded DELETE needs it first.
func (l *Lease) Assert(ctx context.Context, q Querier) error {
	if q == nil {
		return invalidArgument("q", "is nil")
	}
	_, err := q.Exec(ctx, "SELECT "+l.fn("fenced_lock_assert")+"($1, $2::bigint)", l.name, l.token)
	return Wrap(err)
}

// Release ends the lease, on its own connection: inside the caller's
// transaction when that connection is in one (it takes effect at COMMIT),
// after rolling back a failed transaction, on a new connection when its
// own is gone. The keepalive is stopped first, and a renew in flight is
// waited for, so no renew is ever sent after the release; the keepalive's
// connection is closed before Release returns.
//
// It returns the server's answer: false if the lease was no longer live
// (then Done is closed too). A lost lease is not released (false, without a
// round trip), nor is a lease twice. Release also gives the lease's
// connection back to the locker (closes it, or returns it to its pool),
// unless the caller's transaction is still open on it: then the next
// Release, after COMMIT, does (a deferred Release is the natural one).
func (l *Lease) Release(ctx context.Context) (bool, error) {
	l.mu.Lock()
	if l.state != held {
		l.mu.Unlock()
		l.giveBack(false)
		return false, nil
	}
	l.state = releasing
	ka := l.ka
	l.mu.Unlock()

	if ka != nil {
		ka.stopAndWait(ctx)
	}
	l.mu.Lock()
	if l.state == lost { // the keepalive saw the loss before it stopped
		l.mu.Unlock()
		l.giveBack(false)
		return false, nil
	}
	l.mu.Unlock()

	ok, err := l.sendRelease(ctx)
	if err == nil && !ok {
		l.markLost("the release found the lease no longer live", nil)
	}
	l.mu.Lock()
	if l.state == releasing {
		l.state, l.err = released, ErrReleased
	}
	l.mu.Unlock()
	l.cancel()
	l.giveBack(false)
	return ok, err
}

func (l *Lease) sendRelease(ctx context.Context) (bool, error) {
	sql := "SELECT " + l.fn("fenced_lock_release") + "($1, $2::bigint)"
	conn := l.conn
	if !conn.IsClosed() {
		if conn.PgConn().TxStatus() == 'E' {
			// a failed transaction cannot commit anyway; the release must
			if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil && !conn.IsClosed() {
				return false, Wrap(err)
			}
		}
		if !conn.IsClosed() {
			var ok bool
			err := conn.QueryRow(ctx, sql, l.name, l.token).Scan(&ok)
			if err == nil || !conn.IsClosed() {
				return ok, Wrap(err)
			}
			// the connection broke under the release: whatever it was part
			// of is gone with it, so send it again on a new connection
		}
	}
	fresh, handback, err := l.lk.src.open(ctx, false)
	if err != nil {
		return false, Wrap(err)
	}
	defer handback(ctx)
	var ok bool
	err = fresh.QueryRow(ctx, sql, l.name, l.token).Scan(&ok)
	return ok, Wrap(err)
}

// giveBack returns a connection the locker opened, unless a transaction of
// the caller is still open on it (force: even then, rolling it back).
func (l *Lease) giveBack(force bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.handback == nil || l.handedBack {
		return
	}
	if !force && !l.conn.IsClosed() && l.conn.PgConn().TxStatus() == 'T' {
		return
	}
	l.handedBack = true
	l.handback(context.Background())
}

// drop ends a lease that a write found lost (FL001) without releasing it.
func (l *Lease) drop(reason string) {
	l.markLost(reason, nil)
	l.mu.Lock()
	ka := l.ka
	l.mu.Unlock()
	if ka != nil {
		ctx, cancel := context.WithTimeout(context.Background(), l.ttl)
		ka.stopAndWait(ctx)
		cancel()
	}
	l.giveBack(true)
}

// detached keeps a context's values but not its cancellation: the lease of
// Acquire outlives the ctx of the call.
type detached struct{ parent context.Context }

func (detached) Deadline() (time.Time, bool)         { return time.Time{}, false }
func (detached) Done() <-chan struct{}               { return nil }
func (detached) Err() error                          { return nil }
func (d detached) Value(key interface{}) interface{} { return d.parent.Value(key) }
