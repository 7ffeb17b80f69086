package fencedlock

import (
	"errors"
	"fmt"

	"github.com/jackc/pgconn"
)

// The kinds of error. Test for them with errors.Is; the *Error behind them
// (errors.As) carries the SQLSTATE, message, detail and hint, and unwraps to
// the driver's *pgconn.PgError when the server raised it.
var (
	// ErrStaleToken (FL001): a guarded write or fenced_lock_assert with a
	// token that is not the live lease. The lease was lost and the database
	// refused the write; nothing was written.
	ErrStaleToken = errors.New("stale token")
	// ErrMissingToken (FL002): a guarded write without a token.
	ErrMissingToken = errors.New("missing token")
	// ErrModeConflict (FL003): the request can never be granted as asked
	// (another permit count or mode is live on the name, an upgrade from
	// shared to exclusive, waiting for a lease of this very session).
	ErrModeConflict = errors.New("mode conflict")
	// ErrWaitTimeout (55P03): Acquire waited WithWait without a grant.
	ErrWaitTimeout = errors.New("wait timeout")
	// ErrReadOnly (25006): a lease change on a standby or in a read-only
	// transaction.
	ErrReadOnly = errors.New("read only")
	// ErrNotAllowed (42501): renew or release of another role's lease, a
	// role without EXECUTE, and the like.
	ErrNotAllowed = errors.New("not allowed")
	// ErrInvalidArgument (22023): a bad argument value. The client checks
	// what it can before sending anything (Error.Argument names the
	// argument); the server judges the rest (a name over 512 bytes, a ttl
	// above fenced_lock.max_ttl) and its 22023 maps here too.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrUsage: a call that cannot work as made, refused before anything is
	// sent: an acquire on a connection inside a transaction block, a
	// session-bound lease through a transaction pooler. No SQLSTATE.
	ErrUsage = errors.New("usage error")

	// ErrLost: the lease was lost (Lease.Err after Lease.Done is closed);
	// the error is a *LostError saying why.
	ErrLost = errors.New("lease lost")
	// ErrReleased: Lease.Err after Release.
	ErrReleased = errors.New("lease released")
)

var kindBySQLState = map[string]error{
	"FL001": ErrStaleToken,
	"FL002": ErrMissingToken,
	"FL003": ErrModeConflict,
	"55P03": ErrWaitTimeout,
	"25006": ErrReadOnly,
	"42501": ErrNotAllowed,
	"22023": ErrInvalidArgument,
}

// Error is the error of every call of this package that the server or the
// argument checks refused. Code is the SQLSTATE ("" for a usage error).
type Error struct {
	Code    string
	Message string
	Detail  string
	Hint    string
	// Argument names the argument a client-side check refused ("" otherwise).
	Argument string

	kind error
	err  error
}

// SQLState returns the SQLSTATE, as pgconn.PgError does.
func (e *Error) SQLState() string { return e.Code }

func (e *Error) Error() string {
	s := "fencedlock: "
	if e.kind != nil {
		s += e.kind.Error() + ": "
	}
	s += e.Message
	if e.Code != "" {
		s += " (SQLSTATE " + e.Code + ")"
	}
	return s
}

// Is makes errors.Is(err, ErrStaleToken) and the like work.
func (e *Error) Is(target error) bool { return e.kind != nil && target == e.kind }

// Unwrap returns the driver's *pgconn.PgError, or nil for a client-side error.
func (e *Error) Unwrap() error { return e.err }

// Wrap maps an error of the pgx driver to an *Error when it carries a
// SQLSTATE (so that errors.Is(Wrap(err), ErrStaleToken) works on the error
// of your own guarded UPDATE) and returns any other error unchanged.
func Wrap(err error) error {
	if err == nil {
		return nil
	}
	var fe *Error
	if errors.As(err, &fe) {
		return err
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	return &Error{Code: pe.Code, Message: pe.Message, Detail: pe.Detail, Hint: pe.Hint,
		kind: kindBySQLState[pe.Code], err: err}
}

// SQLState returns the SQLSTATE carried by err (an *Error or a
// *pgconn.PgError anywhere in its chain), or "".
func SQLState(err error) string {
	var fe *Error
	if errors.As(err, &fe) {
		return fe.Code
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// IsStaleToken reports whether err says FL001, the database's refusal of a
// write under a lost lease, whether it came from this package or straight
// from pgx (your own guarded UPDATE).
func IsStaleToken(err error) bool { return SQLState(err) == "FL001" }

func invalidArgument(arg, format string, a ...interface{}) *Error {
	return &Error{Code: "22023", Argument: arg, Message: arg + ": " + fmt.Sprintf(format, a...),
		kind: ErrInvalidArgument}
}

func usageError(format string, a ...interface{}) *Error {
	return &Error{Message: fmt.Sprintf(format, a...), kind: ErrUsage}
}

// LostError says why a lease was lost. errors.Is(err, ErrLost) is true.
type LostError struct {
	Name   string
	Token  int64
	Reason string
	// Cause is the last error of the keepalive, if one led to the loss.
	Cause error
}

func (e *LostError) Error() string {
	s := fmt.Sprintf("fencedlock: lease %q (token %d) lost: %s", e.Name, e.Token, e.Reason)
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

func (e *LostError) Is(target error) bool { return target == ErrLost }

func (e *LostError) Unwrap() error { return e.Cause }
