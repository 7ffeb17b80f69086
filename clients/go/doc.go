// Package fencedlock is the Go client of fenced_lock, the PostgreSQL
// extension of leased named locks with fencing tokens: a Locker hands out
// leases, a keepalive renews each from a connection of its own and closes
// Lease.Done when the lease is lost, Do runs a function under a lease and
// runs it again when the database refused a write with a stale token
// (FL001), and SQLSTATEs map to errors (ErrStaleToken and the rest).
//
// The module path is github.com/fenced-lock/fenced_lock/clients/go; the
// package is fencedlock:
//
//	import fencedlock "github.com/fenced-lock/fenced_lock/clients/go"
//
// See the README for the whole story: clients/go/README.md.
package fencedlock
