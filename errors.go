package idem

import (
	"errors"
	"fmt"
)

// Errors a client call returns. Match them with errors.Is; an
// *OperationError carries what the journal knows.
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
	// ErrNeedsReconciliation: the server's key retention passed before the
	// outcome was confirmed, so the operation is expired and will not be
	// re-sent. An operator settles it with Reconcile.
	ErrNeedsReconciliation = errors.New("idem: operation needs reconciliation")
	// ErrKeyConflict: the server says the key was already used with a
	// different request (422, or a problem type saying so). The operation
	// is rejected.
	ErrKeyConflict = errors.New("idem: server reports the key was used with a different request")
	// ErrKeyNotHonoured: the server answered one key twice with different
	// results, so it executed the request again: it does not keep
	// idempotency keys. The operation is expired (ErrNeedsReconciliation):
	// nothing more is sent, and an operator checks for a duplicate.
	ErrKeyNotHonoured = errors.New("idem: the server does not honour idempotency keys")
	// ErrCanceled: the operation was withdrawn with Cancel before it was
	// sent.
	ErrCanceled = errors.New("idem: operation was canceled")
	// ErrInvalidOp: the Op is malformed; nothing was journaled or sent.
	ErrInvalidOp = errors.New("idem: invalid operation")
	// ErrInvalidConfig: New was given a Config it cannot use.
	ErrInvalidConfig = errors.New("idem: invalid config")
	// ErrRetryBudgetExhausted: the client's shared retry budget is spent
	// (many operations are failing at once), so no retry was made.
	ErrRetryBudgetExhausted = errors.New("idem: retry budget exhausted")
	// ErrClientClosed: the client was closed.
	ErrClientClosed = errors.New("idem: client is closed")
)

// OperationError reports an operation that did not reach a definitive
// answer, or was rejected for a key conflict. It says what the journal
// holds: the operation is safely journaled in State under Key.
//
// It matches, with errors.Is, the sentinel for its state (ErrNotSent for
// pending; ErrOutcomeUnknown for in_flight and unknown;
// ErrNeedsReconciliation for expired; ErrCanceled for canceled;
// ErrKeyConflict for a key conflict) and its cause, such as
// context.DeadlineExceeded.
type OperationError struct {
	Key   string
	Scope string
	ID    string
	// State is the operation's journaled state when the call returned.
	State State
	// Attempts is the number of attempts journaled so far.
	Attempts int
	// StatusCode is the last HTTP status received, or zero.
	StatusCode int
	// Err is the last cause.
	Err error

	conflict bool
}

func (e *OperationError) sentinel() error {
	switch {
	case e.conflict:
		return ErrKeyConflict
	case e.State == StatePending:
		return ErrNotSent
	case e.State == StateExpired:
		return ErrNeedsReconciliation
	case e.State == StateCanceled:
		return ErrCanceled
	default:
		return ErrOutcomeUnknown
	}
}

func (e *OperationError) Error() string {
	var what string
	switch e.sentinel() {
	case ErrNotSent:
		what = "was not sent; it is journaled as pending and Resume (or Do) will send it with the same key, or Cancel withdraws it"
	case ErrNeedsReconciliation:
		what = "is expired: the server's key retention passed before its outcome was confirmed; it will not be re-sent; settle it with Reconcile"
	case ErrCanceled:
		what = "was canceled before it was sent"
	case ErrKeyConflict:
		what = "was rejected: the server says its key was already used with a different request"
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

// Unwrap returns the sentinel for the state and the cause.
func (e *OperationError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.sentinel()}
	}
	return []error{e.sentinel(), e.Err}
}

func invalidOp(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidOp, fmt.Sprintf(format, args...))
}
