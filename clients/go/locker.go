package fencedlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

// KeepaliveApplicationName is the application_name of keepalive
// connections, so that a DBA can tell them apart in pg_stat_activity.
const KeepaliveApplicationName = "fenced_lock_keepalive"

// Version is the version of this client, the extension version it goes with.
const Version = "0.3.0"

// A Locker hands out leases over one way of opening connections: a
// connection string, a pgx config, a pgxpool.Pool or a function. It holds
// no connection itself, is safe for concurrent use, and needs no Close.
type Locker struct {
	src  source
	base settings
}

// source opens the connections of a lease: the lease's own (when the
// caller passes none) and the keepalive's.
type source interface {
	open(ctx context.Context, keepalive bool) (*pgx.Conn, giveBackFn, error)
}

// giveBackFn gives a connection back to where it came from: closes it, or
// returns it to its pool. ctx bounds the wait for the server's goodbye.
type giveBackFn func(ctx context.Context)

// New makes a locker that opens connections from a postgresql:// URL or a
// key=value connection string.
func New(connString string, opts ...Option) (*Locker, error) {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		// pgconn's message quotes the string with its password redacted
		return nil, invalidArgument("connString", "%s", err.Error())
	}
	return NewFromConfig(cfg, opts...)
}

// NewFromConfig makes a locker that opens connections from cfg (a copy of
// it is taken; DialFunc, TLS and the rest apply to every connection).
func NewFromConfig(cfg *pgx.ConnConfig, opts ...Option) (*Locker, error) {
	if cfg == nil {
		return nil, invalidArgument("config", "is nil")
	}
	lk, err := newLocker(opts)
	if err != nil {
		return nil, err
	}
	c := cfg.Copy()
	if lk.base.txPooling {
		// A transaction pooler may hand each statement to another server
		// connection: named prepared statements would not be there.
		c.PreferSimpleProtocol = true
	}
	lk.src = &configSource{cfg: c, setAppName: !lk.base.txPooling}
	return lk, nil
}

// NewFromPool makes a locker that takes connections from pool: each lease
// keeps one for its life, and its keepalive another, so the pool needs two
// connections for each lease held at once (MaxConns).
func NewFromPool(pool *pgxpool.Pool, opts ...Option) (*Locker, error) {
	if pool == nil {
		return nil, invalidArgument("pool", "is nil")
	}
	lk, err := newLocker(opts)
	if err != nil {
		return nil, err
	}
	lk.src = &poolSource{pool: pool, setAppName: !lk.base.txPooling}
	return lk, nil
}

// NewFromConnector makes a locker that opens connections with connect; the
// locker closes the connections it opened when their lease ends.
func NewFromConnector(connect func(ctx context.Context) (*pgx.Conn, error), opts ...Option) (*Locker, error) {
	if connect == nil {
		return nil, invalidArgument("connect", "is nil")
	}
	lk, err := newLocker(opts)
	if err != nil {
		return nil, err
	}
	lk.src = &funcSource{connect: connect, setAppName: !lk.base.txPooling}
	return lk, nil
}

func newLocker(opts []Option) (*Locker, error) {
	lk := &Locker{base: defaultSettings()}
	for _, o := range opts {
		if o != nil {
			o(&lk.base)
		}
	}
	if err := lk.base.check(scopeLocker); err != nil {
		return nil, err
	}
	return lk, nil
}

// TryAcquire grants a lease of name now, or returns nil, nil when it cannot
// be granted without waiting (another lease is live, a transition of the name
// is in flight, others are queued). It never waits for another transaction.
func (lk *Locker) TryAcquire(ctx context.Context, name string, opts ...Option) (*Lease, error) {
	return lk.acquire(ctx, detached{ctx}, name, opts, false)
}

// Acquire waits for a lease of name, in arrival order (WithWait bounds the
// wait: ErrWaitTimeout; ctx ends it too). ctx is for the acquire only; the
// lease lives until it is released or lost (Lease.Context, Lease.Done).
func (lk *Locker) Acquire(ctx context.Context, name string, opts ...Option) (*Lease, error) {
	return lk.acquire(ctx, detached{ctx}, name, opts, true)
}

func (lk *Locker) call(name string, opts []Option) (settings, *Error) {
	s := lk.base
	// what the locker set is not an option of this call
	s.txPoolingSet, s.schemaSet = false, false
	for _, o := range opts {
		if o != nil {
			o(&s)
		}
	}
	if err := checkName(name); err != nil {
		return s, err
	}
	if err := s.check(scopeCall); err != nil {
		return s, err
	}
	if s.sessionBound && s.txPooling {
		return s, usageError("session_bound: refused on a locker with transaction pooling: the lease's session " +
			"would be a pooled server connection shared with other clients, and the lease would end with their " +
			"session, not yours; use a plain lease (ttl and keepalive) there")
	}
	return s, nil
}

func (lk *Locker) fn(f string) string {
	if lk.base.schemaSet {
		return pgx.Identifier{lk.base.schema}.Sanitize() + "." + f
	}
	return f
}

// interval renders a duration as an interval literal, to the microsecond.
func interval(d time.Duration) string {
	return strconv.FormatInt(int64(d/time.Microsecond), 10) + " microseconds"
}

func (lk *Locker) acquire(ctx context.Context, leaseParent context.Context, name string, opts []Option, wait bool) (*Lease, error) {
	s, cerr := lk.call(name, opts)
	if cerr != nil {
		return nil, cerr
	}
	var conn *pgx.Conn
	var handback giveBackFn
	if s.connSet {
		conn = s.conn
		if conn.IsClosed() {
			return nil, usageError("conn: the connection is closed")
		}
		if st := conn.PgConn().TxStatus(); st != 'I' {
			return nil, usageError("conn: the connection is inside a transaction block: an acquire must run " +
				"outside one, so that its grant is committed before the keepalive renews it from another connection")
		}
	} else {
		var err error
		conn, handback, err = lk.src.open(ctx, false)
		if err != nil {
			return nil, Wrap(err)
		}
	}

	args := []interface{}{name, interval(s.ttl)}
	var sql string
	if wait {
		var w interface{}
		if s.waitSet {
			w = interval(s.wait)
		}
		sql = "SELECT " + lk.fn("fenced_lock_acquire") + "($1, $2::interval, $3::interval, $4::text, $5::boolean"
		args = append(args, w, s.holder, s.sessionBound)
	} else {
		sql = "SELECT " + lk.fn("fenced_lock_try_acquire") + "($1, $2::interval, $3::text, $4::boolean"
		args = append(args, s.holder, s.sessionBound)
	}
	// Sent only when they differ from the server's defaults, so exclusive
	// leases also work against a 0.2.0 server, which has neither.
	if s.shared {
		args = append(args, true)
		sql += fmt.Sprintf(", shared => $%d::boolean", len(args))
	}
	if s.permits != 1 {
		args = append(args, s.permits)
		sql += fmt.Sprintf(", permits => $%d::integer", len(args))
	}
	sql += ")"

	var token *int64
	sent := now()
	err := conn.QueryRow(ctx, sql, args...).Scan(&token)
	took := now().sub(sent)
	if err != nil {
		if handback != nil {
			handback(context.Background())
		}
		return nil, Wrap(err)
	}
	if token == nil {
		if handback != nil {
			handback(context.Background())
		}
		return nil, nil
	}
	l := newLease(lk, s, name, *token, conn, handback, leaseParent)
	l.deadline = sent.add(s.ttl)
	// The deadline counts from the instant the acquire was sent, as the
	// grant may have come at any point of the call. After a long wait that
	// leaves little or nothing of the ttl, so confirm the lease with a renew
	// sent now, and count from that.
	if wait && took > s.ttl/2 {
		sent2 := now()
		ok, rerr := l.renewOn(ctx, conn)
		switch {
		case rerr == nil && ok:
			l.deadline = sent2.add(s.ttl)
		case rerr == nil && !ok:
			l.markLost("the lease had already ended when its long wait returned", nil)
		}
	}
	if s.keepalive && l.Err() == nil {
		l.startKeepalive()
	}
	return l, nil
}

// configSource opens connections from a pgx config.
//
// Behind a transaction pooler (setAppName false) a keepalive is not named:
// the server session is shared, PgBouncer passes a client's
// application_name on to it, and the next client that sets none would
// show up as a keepalive.
type configSource struct {
	cfg        *pgx.ConnConfig
	setAppName bool
}

func (c *configSource) open(ctx context.Context, keepalive bool) (*pgx.Conn, giveBackFn, error) {
	cfg := c.cfg.Copy()
	if keepalive && c.setAppName {
		// Set in the startup packet: no round trip, and no session state for
		// a pooler to leak.
		if cfg.RuntimeParams == nil {
			cfg.RuntimeParams = map[string]string{}
		}
		cfg.RuntimeParams["application_name"] = KeepaliveApplicationName
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	return conn, closer(conn, keepalive), nil
}

// closer: a keepalive's connection is closed waiting for the server's end
// (closeConn); a lease's is closed at once, never blocking a Release.
func closer(conn *pgx.Conn, keepalive bool) giveBackFn {
	if keepalive {
		return func(ctx context.Context) { closeConn(ctx, conn) }
	}
	return func(ctx context.Context) { _ = conn.Close(ctx) }
}

// funcSource opens connections with the caller's function.
type funcSource struct {
	connect    func(ctx context.Context) (*pgx.Conn, error)
	setAppName bool
}

func (f *funcSource) open(ctx context.Context, keepalive bool) (*pgx.Conn, giveBackFn, error) {
	conn, err := f.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	if conn == nil {
		return nil, nil, errors.New("fencedlock: the connect function returned no connection")
	}
	if keepalive && f.setAppName {
		if _, err := conn.Exec(ctx, "SET application_name = '"+KeepaliveApplicationName+"'"); err != nil {
			closeConn(ctx, conn)
			return nil, nil, err
		}
	}
	return conn, closer(conn, keepalive), nil
}

// poolSource takes connections from a pgxpool.Pool.
type poolSource struct {
	pool       *pgxpool.Pool
	setAppName bool
}

func (p *poolSource) open(ctx context.Context, keepalive bool) (*pgx.Conn, giveBackFn, error) {
	pc, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	conn := pc.Conn()
	named := false
	if keepalive && p.setAppName {
		if _, err := conn.Exec(ctx, "SET application_name = '"+KeepaliveApplicationName+"'"); err != nil {
			pc.Release()
			return nil, nil, err
		}
		named = true
	}
	return conn, func(ctx context.Context) {
		if named && !conn.IsClosed() && conn.PgConn().TxStatus() == 'I' {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if _, err := conn.Exec(ctx, "RESET application_name"); err != nil {
				// a connection that cannot say RESET is not given back as it is
				_ = conn.PgConn().Close(ctx)
			}
			cancel()
		}
		// pgxpool destroys a connection that is closed or inside a transaction.
		pc.Release()
	}, nil
}

// closeConn ends a connection the locker opened and waits until the server
// has closed its end. A backend leaves pg_stat_activity before it closes its
// socket, so once this returns a DBA (or a test) no longer sees it: "the
// keepalive connection is closed before release returns" holds on the
// server too, not only in this process.
func closeConn(ctx context.Context, conn *pgx.Conn) {
	if conn.IsClosed() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	hc, err := conn.PgConn().Hijack()
	if err != nil { // busy or closed: pgx's own close
		_ = conn.Close(ctx)
		return
	}
	nc := hc.Conn
	defer nc.Close()
	deadline, _ := ctx.Deadline()
	_ = nc.SetDeadline(deadline)
	stop := make(chan struct{})
	defer close(stop)
	go func() { // ctx ended early (a Release that gave up): stop waiting
		select {
		case <-ctx.Done():
			_ = nc.SetDeadline(time.Now())
		case <-stop:
		}
	}()
	if _, err := nc.Write([]byte{'X', 0, 0, 0, 4}); err != nil { // Terminate
		return
	}
	_, _ = io.Copy(io.Discard, nc) // until the server closes (EOF) or the deadline
}
