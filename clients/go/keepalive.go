package fencedlock

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v4"
)

// keepalive renews one lease from a connection of its own, in its own
// goroutine. It never touches the lease's connection, so the caller's work
// never delays a renew and a renew never blocks the caller's work.
type keepalive struct {
	stop     chan struct{} // closed: send no new renew, end
	stopOnce sync.Once
	// force cancels a renew in flight; only a Release whose ctx ended
	// while waiting for that renew uses it.
	force    context.Context
	forceFn  context.CancelFunc
	finished chan struct{} // closed when the goroutine has ended, its connection closed
}

func (k *keepalive) signalStop() { k.stopOnce.Do(func() { close(k.stop) }) }

// stopAndWait stops the keepalive and waits until it has ended: a renew in
// flight finishes first (or, if ctx ends before, is cancelled), and the
// keepalive's connection is closed.
func (k *keepalive) stopAndWait(ctx context.Context) {
	k.signalStop()
	select {
	case <-k.finished:
	case <-ctx.Done():
		k.forceFn()
		<-k.finished
	}
}

func (l *Lease) startKeepalive() {
	force, forceFn := context.WithCancel(context.Background())
	k := &keepalive{stop: make(chan struct{}), force: force, forceFn: forceFn, finished: make(chan struct{})}
	l.mu.Lock()
	l.ka = k
	l.mu.Unlock()
	go l.keepaliveLoop(k)
}

// attemptTimeout bounds one renew. A connection can die silently (a cut
// that sends no reset, a half-open socket behind a NAT): a renew on it
// never returns, while a new connection would work. So a renew gets
// max(interval, 1 s); then pgx cancels it and closes the connection, and
// the next attempt goes on a new one. Never past the deadline: a renew
// that returns after it is of no use, the lease counts as lost then.
func (l *Lease) attemptTimeout(sent instant) time.Duration {
	d := l.interval
	if d < time.Second {
		d = time.Second
	}
	if left := l.currentDeadline().sub(sent); left < d {
		d = left
	}
	return d
}

// retryEvery is how soon a renew that failed for an error (the connection
// broke, the server refused, no answer in time) is tried again, on a new
// connection: min(interval, 1 s).
func (l *Lease) retryEvery() time.Duration {
	if l.interval < time.Second {
		return l.interval
	}
	return time.Second
}

func (l *Lease) keepaliveLoop(k *keepalive) {
	var conn *pgx.Conn
	var handback giveBackFn
	defer func() {
		if handback != nil {
			handback(k.force) // a Release that gives up cancels it: no waiting then
		}
		k.forceFn()
		close(k.finished)
	}()

	// The first renew is due an interval after the acquire was sent; the
	// connection is opened at once, so that it is ready by then.
	next := l.currentDeadline().add(-l.ttl).add(l.interval)
	var lastErr error
	for {
		if conn != nil && conn.IsClosed() {
			handback(k.force)
			conn, handback = nil, nil
		}
		if conn == nil {
			c, hb, err := l.openKeepaliveConn(k)
			if err != nil {
				lastErr = err
				if !l.waitUntil(k, now().add(l.retryEvery()), lastErr) {
					return
				}
				continue
			}
			conn, handback = c, hb
		}
		if !l.waitUntil(k, next, lastErr) {
			return
		}
		select {
		case <-k.stop:
			return
		default:
		}

		sent := now()
		ctx, cancel := context.WithTimeout(k.force, l.attemptTimeout(sent))
		ok, err := l.renewOn(ctx, conn)
		cancel()
		if err != nil {
			// Never stop renewing because of one error: try again soon, on
			// a new connection, until the deadline. Not only a broken
			// connection is left behind: a session that refuses the renew
			// (a pooler's server connection without the statement pgx
			// prepared, a setting gone wrong) may refuse it again.
			lastErr = Wrap(err)
			_ = conn.Close(k.force) // closed, a pooled connection is destroyed, not reused
			handback(k.force)
			conn, handback = nil, nil
			next = sent.add(l.retryEvery())
			continue
		}
		if !ok {
			l.markLost("a renew returned false: the lease had ended on the server", nil)
			return
		}
		if !l.extend(sent) {
			l.markLost("the deadline passed while a renew was in flight", nil)
			return
		}
		lastErr = nil
		next = sent.add(l.interval)
		if l.onRenew != nil {
			l.onRenew(l)
		}
	}
}

// waitUntil sleeps until t on the lease clock. It looks at the clock first
// on every wake, so after a pause (GC, SIGSTOP, a suspended VM) a passed
// deadline is signalled at once and nothing is sent. It returns false when
// the keepalive must end: stopped, or the lease lost.
func (l *Lease) waitUntil(k *keepalive, t instant, lastErr error) bool {
	for {
		n := now()
		deadline := l.currentDeadline()
		if !n.before(deadline) {
			l.markLost("its deadline passed before a renew succeeded", lastErr)
			return false
		}
		if !n.before(t) {
			return true
		}
		wait := t.sub(n)
		if d := deadline.sub(n); d < wait {
			wait = d
		}
		if wait > sliceWait {
			wait = sliceWait
		}
		timer := time.NewTimer(wait)
		select {
		case <-k.stop:
			timer.Stop()
			return false
		case <-timer.C:
		}
	}
}

// openKeepaliveConn opens the keepalive's connection, giving up at the
// lease's deadline or when the keepalive is stopped.
func (l *Lease) openKeepaliveConn(k *keepalive) (*pgx.Conn, giveBackFn, error) {
	ctx, cancel := context.WithTimeout(k.force, l.currentDeadline().sub(now()))
	defer cancel()
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-k.stop:
			cancel()
		case <-stopped:
		}
	}()
	return l.lk.src.open(ctx, true)
}
