package idem

import (
	"errors"
	"fmt"
	"strings"
)

// Errors a client call returns. Match them with errors.Is; an
// *OperationError carries what the journal knows. The package
// documentation has the table of every error, what it means for the
// operation, and in which order to test them.
var (
	// ErrOutcomeUnknown: the request may have reached the server and no
	// definitive answer came back (a timeout, a reset, a status endpoint
	// that did not answer). The operation is journaled; Resume (or calling
	// Do again) checks its status and never sends it under a new key.
	ErrOutcomeUnknown = errors.New("idem: outcome unknown")
	// ErrNotSent: the request certainly did not take effect (the server was
	// unreachable, or refused it before processing it, as with 429). The
	// operation is journaled as pending: Resume or Do will send it with the
	// same key, unless it is withdrawn with Cancel.
	ErrNotSent = errors.New("idem: not sent")
	// ErrRejected: the server gave a definitive answer other than success
	// (a 4xx, a key conflict, a 5xx it replays from its store). The
	// operation is settled as rejected and will never be sent again; the
	// *OperationError and the Result both carry the server's status and
	// body.
	ErrRejected = errors.New("idem: rejected by the server")
	// ErrKeyConflict: the server says the key was already used with a
	// different request. The operation is rejected: errors matching it
	// also match ErrRejected. Only when no earlier attempt of the
	// operation may have been processed (one refused before processing,
	// as with 429, was not): a key conflict answering a re-send after one
	// that may have been is about that earlier attempt (in a form the server tells
	// apart, such as a fresh token Authorize put in the URL), which may
	// have been applied, so the outcome is unknown (see KeyConflict).
	ErrKeyConflict = errors.New("idem: server reports the key was used with a different request")
	// ErrNeedsReconciliation: the server's key retention passed before the
	// outcome was confirmed, so the operation is expired and will not be
	// re-sent. An operator settles it with Reconcile.
	ErrNeedsReconciliation = errors.New("idem: operation needs reconciliation")
	// ErrKeyNotHonoured: the server answered one key twice with different
	// results, so it executed the request again, or its status endpoint
	// said it never saw a key it had answered with a success, so it would
	// execute the request again: it does not keep
	// idempotency keys. The operation is expired: errors matching it also
	// match ErrNeedsReconciliation. Nothing more is sent, and an operator
	// checks for a duplicate.
	ErrKeyNotHonoured = errors.New("idem: the server does not honour idempotency keys")
	// ErrCanceled: the operation was withdrawn with Cancel before it was
	// sent.
	ErrCanceled = errors.New("idem: operation was canceled")
	// ErrInvalidOp: the Op is malformed; nothing was journaled or sent.
	ErrInvalidOp = errors.New("idem: invalid operation")
	// ErrInvalidConfig: New was given a Config it cannot use.
	ErrInvalidConfig = errors.New("idem: invalid config")
	// ErrRetryBudgetExhausted: the client's shared retry budget is spent
	// (many operations are failing at once), so no retry was made. It is
	// the cause of an ErrNotSent or ErrOutcomeUnknown.
	ErrRetryBudgetExhausted = errors.New("idem: retry budget exhausted")
	// ErrClientClosed: the client was closed or is shutting down.
	ErrClientClosed = errors.New("idem: client is closed")
	// ErrAuthorizeFailed: Config.Authorize returned an error, so the
	// request was not sent; the error wraps Authorize's own too. It is no
	// attempt (Authorize runs before an attempt is journaled, or, for Do's
	// first, before the attempt its create journaled is sent, which the
	// next send then reuses), and the
	// call stops at once rather than fail the same way again: it is the
	// cause of an ErrNotSent (the operation stays pending) or, when an
	// earlier attempt may have reached the server, of an ErrOutcomeUnknown. The next Do of the operation, or a Resume once it
	// is due (after RetryPolicy.MaxBackoff), tries again.
	ErrAuthorizeFailed = errors.New("idem: Config.Authorize failed")
)

// authorizeError is Config.Authorize's error, as the transport returns it.
type authorizeError struct{ err error }

func (e *authorizeError) Error() string   { return ErrAuthorizeFailed.Error() + ": " + e.err.Error() }
func (e *authorizeError) Unwrap() []error { return []error{ErrAuthorizeFailed, e.err} }

// unsentIntent reports a record left pending because Authorize stopped the
// first send of Do, whose create had journaled it in_flight as attempt 1:
// that attempt was never sent, and the next send reuses it rather than
// count another. (Any later send runs Authorize before it is journaled.)
func unsentIntent(rec Record) bool {
	return rec.State == StatePending && rec.Attempts > 0 && strings.HasPrefix(rec.LastError, unsentNote)
}

// unsentNote starts the LastError of an unsentIntent record.
const unsentNote = "journaled attempt not sent: "

// unsentError is Authorize's failure on the send of an attempt already
// journaled; its text, kept as LastError, marks the record's last attempt
// as unsent.
type unsentError struct{ err error }

func (e unsentError) Error() string { return unsentNote + e.err.Error() }
func (e unsentError) Unwrap() error { return e.err }

// OperationError reports an operation that is not settled as succeeded: it
// says what the journal holds, the operation's key and state, and why.
//
// It matches, with errors.Is, the sentinel of its state (ErrNotSent for
// pending; ErrOutcomeUnknown for in_flight and unknown; ErrRejected, and
// ErrKeyConflict when that was the server's reason, for rejected;
// ErrNeedsReconciliation for expired, and ErrKeyNotHonoured when that was
// why, on a later call too; ErrCanceled for canceled), or
// ErrFingerprintMismatch when the operation ID was journaled with another
// request (State is then the existing record's), and its cause, such as
// context.DeadlineExceeded, ErrBadStatus or ErrKeyNotHonoured.
type OperationError struct {
	Key   string
	Scope string
	ID    string
	// State is the operation's journaled state when the call returned.
	State State
	// Attempts is the number of attempts sent so far. A send that
	// Config.Authorize stopped (ErrAuthorizeFailed) is none.
	Attempts int
	// StatusCode is the last HTTP status received, or zero; Body is the
	// server's answer when the operation was rejected.
	StatusCode int
	Body       []byte
	// Err is the cause: why the operation is where it is.
	Err error

	// sentinel overrides the state's sentinel (ErrFingerprintMismatch).
	sentinel error
	conflict bool // rejected for a key conflict
	// notHonoured: expired because the server does not honour keys.
	notHonoured bool
}

// sentinels returns the sentinels e matches, most specific first.
func (e *OperationError) sentinels() []error {
	switch {
	case e.sentinel != nil:
		return []error{e.sentinel}
	case e.conflict:
		return []error{ErrKeyConflict, ErrRejected}
	}
	switch e.State {
	case StatePending:
		return []error{ErrNotSent}
	case StateRejected:
		return []error{ErrRejected}
	case StateExpired:
		if e.notHonoured {
			return []error{ErrNeedsReconciliation, ErrKeyNotHonoured}
		}
		return []error{ErrNeedsReconciliation}
	case StateCanceled:
		return []error{ErrCanceled}
	}
	return []error{ErrOutcomeUnknown}
}

func (e *OperationError) Error() string {
	var what string
	switch e.sentinels()[0] {
	case ErrNotSent:
		what = "was not sent; it is journaled as pending and Resume (or Do) will send it with the same key, or Cancel withdraws it"
	case ErrRejected:
		what = "was rejected by the server; it will not be sent again"
	case ErrKeyConflict:
		what = "was rejected: the server says its key was already used with a different request"
	case ErrNeedsReconciliation:
		what = "is expired and will not be re-sent; check the business records, then settle it with Reconcile"
	case ErrCanceled:
		what = "was canceled before it was sent"
	case ErrFingerprintMismatch:
		what = fmt.Sprintf("is already journaled (%s) with a different request; nothing was sent; use a new operation ID for a different request", e.State)
	default:
		what = fmt.Sprintf("has an unknown outcome (journaled as %s); it may have been applied; Resume (or Do) will check its status and never send it under a new key", e.State)
	}
	msg := fmt.Sprintf("idem: operation %s/%s (key %s) %s", e.Scope, e.ID, e.Key, what)
	if e.Attempts > 0 {
		msg += fmt.Sprintf(" [%d attempt(s)", e.Attempts)
		if e.StatusCode != 0 {
			msg += fmt.Sprintf(", last status %d", e.StatusCode)
		}
		msg += "]"
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the sentinels and the cause.
func (e *OperationError) Unwrap() []error {
	if e.Err == nil {
		return e.sentinels()
	}
	return append(e.sentinels(), e.Err)
}

// opError describes rec, as the journal holds it, with cause. A record's
// LastError stands in for a missing cause of an unsettled operation, and a
// rejected record's answer is its Body.
func opError(rec Record, cause error) *OperationError {
	e := &OperationError{Key: rec.Key, Scope: rec.Scope, ID: rec.ID, State: rec.State, Attempts: rec.Attempts, Err: cause}
	if unsentIntent(rec) {
		e.Attempts--
	}
	if rec.Response != nil {
		e.StatusCode = rec.Response.StatusCode
		if rec.State == StateRejected {
			e.Body = rec.Response.Body
		}
	}
	if cause == nil && rec.LastError != "" && rec.State != StateSucceeded && rec.State != StateCanceled {
		e.Err = errors.New(rec.LastError)
	}
	if rec.State == StateRejected && rec.LastError != "" && isConflictNote(rec.LastError) {
		e.conflict = true
	}
	if rec.State == StateExpired && strings.HasPrefix(rec.LastError, notHonouredNote) {
		e.notHonoured = true
	}
	return e
}

// notHonouredNote starts the LastError of an operation parked because the
// server does not honour keys (park journals it), so that a later call
// reading the record reports ErrKeyNotHonoured too, not only its text.
var notHonouredNote = ErrKeyNotHonoured.Error() + ": "

// conflictNote starts the LastError of an operation rejected for a key
// conflict, so that the journal keeps why, and a later call reading the
// record reports ErrKeyConflict too.
const conflictNote = "key conflict: "

func isConflictNote(s string) bool {
	return len(s) >= len(conflictNote) && s[:len(conflictNote)] == conflictNote
}

func invalidOp(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidOp, fmt.Sprintf(format, args...))
}
