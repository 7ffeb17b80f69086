package fencedlock

import (
	"context"
	"time"
)

// Do runs fn under a lease of name and returns what fn returned: it
// acquires (waiting, with keepalive), calls fn, and releases on the way
// out, also when fn panics. If fn fails with FL001 (IsStaleToken: the lease
// was lost and the database refused a write, so nothing was written), the
// lease is dropped without a release and everything runs again from the
// acquire, up to WithAttempts times in all (default 5); then the last FL001
// error is returned. Any other error of fn is returned at once, after the
// release. If the lease was lost, the exit does not release.
//
// fn gets Do's own ctx: send the guarded write with it, so that the
// database decides (FL001 means for sure that nothing was written, which a
// write cancelled halfway does not). lease.Context() and lease.Done() are
// there to stop other work early when the lease is lost.
//
// So fn reads what it needs again on each attempt: acquire, read, write
// with lease.Token(), release.
func (lk *Locker) Do(ctx context.Context, name string, fn func(ctx context.Context, lease *Lease) error, opts ...Option) error {
	s, cerr := lk.call(name, opts)
	if cerr != nil {
		return cerr
	}
	if fn == nil {
		return invalidArgument("fn", "is nil")
	}
	for attempt := 1; ; attempt++ {
		lease, err := lk.acquire(ctx, ctx, name, opts, true)
		if err != nil {
			return err
		}
		ferr := runScoped(ctx, lease, fn)
		if ferr != nil && IsStaleToken(ferr) {
			lease.drop("a write under it was refused with FL001")
			if attempt >= s.attempts {
				return Wrap(ferr)
			}
			continue
		}
		rerr := releaseOnExit(ctx, lease)
		if ferr != nil {
			return ferr
		}
		return rerr
	}
}

func runScoped(ctx context.Context, lease *Lease, fn func(context.Context, *Lease) error) error {
	defer func() {
		if r := recover(); r != nil {
			_ = releaseOnExit(ctx, lease)
			panic(r)
		}
	}()
	return fn(ctx, lease)
}

// releaseOnExit releases even when ctx has ended (the caller gave up, the
// lease should not linger), bounded by the ttl: after that the lease has
// expired anyway.
func releaseOnExit(ctx context.Context, lease *Lease) error {
	bound := lease.ttl
	if bound < time.Second {
		bound = time.Second
	}
	rctx, cancel := context.WithTimeout(detached{ctx}, bound)
	defer cancel()
	_, err := lease.Release(rctx)
	lease.giveBack(true)
	return err
}
