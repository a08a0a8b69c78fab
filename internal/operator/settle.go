package operator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem"
)

// ErrNoOutcome: a reconcile without its outcome. The idem command and the
// web view say it with their own names for the field.
var ErrNoOutcome = errors.New("the outcome is required: succeeded or rejected")

// ErrNoNote: a reconcile without a note saying what it is based on.
var ErrNoNote = errors.New("the note is required: say what the decision is based on")

// ParseOutcome checks a reconcile's outcome: succeeded or rejected.
func ParseOutcome(as string) (idem.State, error) {
	if as == "" {
		return 0, ErrNoOutcome
	}
	state, err := idem.ParseState(as)
	if err != nil || (state != idem.StateSucceeded && state != idem.StateRejected) {
		return 0, fmt.Errorf("%q: an operation is reconciled as succeeded or rejected", as)
	}
	return state, nil
}

// CheckNote checks a reconcile's note: it must say something.
func CheckNote(note string) error {
	if strings.TrimSpace(note) == "" {
		return ErrNoNote
	}
	return nil
}

// Reconcile records an operator's decision about rec (read from j at now)
// as the client's Reconcile does, and returns what was done in one line.
// state and note must have passed ParseOutcome and CheckNote.
func Reconcile(ctx context.Context, j idem.Journal, rec idem.Record, state idem.State, note string, now time.Time) (string, error) {
	return settle(ctx, j, rec, func(c *idem.Client) error { return c.Reconcile(ctx, rec.Key, state, note) },
		fmt.Sprintf("reconciled %s (%s/%s) as %s, was %s", rec.Key, rec.Scope, rec.ID, state, rec.State))
}

// Cancel withdraws rec (read from j at now), a pending operation never
// sent, as the client's Cancel does, and returns what was done in one
// line.
func Cancel(ctx context.Context, j idem.Journal, rec idem.Record, now time.Time) (string, error) {
	return settle(ctx, j, rec, func(c *idem.Client) error { return c.Cancel(ctx, rec.Key) },
		fmt.Sprintf("canceled %s (%s/%s)", rec.Key, rec.Scope, rec.ID))
}

// settle applies an operator's change to rec through a client, which
// enforces what may change (the state machine, the version), and returns
// done when it was applied.
//
// The journal fences the write as it fences a worker's Claim: it refuses
// it (ErrLeased) while a worker that is not known to be gone holds a live
// lease, and lets it through when the holder is gone (a PostgreSQL
// worker's liveness lock, an SQLite client's lock file), its lease
// unexpired or not. Checking the lease here instead would make an operator
// wait for a dead worker's lease to lapse.
func settle(ctx context.Context, j idem.Journal, rec idem.Record, change func(*idem.Client) error, done string) (string, error) {
	c, err := idem.New(idem.Config{Journal: j})
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := change(c); err != nil {
		if errors.Is(err, idem.ErrLeased) {
			return "", leased(ctx, j, rec, err)
		}
		return "", err
	}
	return done, nil
}

// leased says whom a refused write waits for, and until when, from the
// record as it is now.
func leased(ctx context.Context, j idem.Journal, rec idem.Record, err error) error {
	if now, gerr := j.Get(ctx, rec.Key); gerr == nil {
		rec = now
	}
	if rec.Lease.Owner == "" {
		return err
	}
	return leasedError{fmt.Sprintf("operation %s (%s/%s) is %s and being driven by %s until %s, when its lease lapses "+
		"unless the worker is seen gone first; wait for it to stop, then look again",
		rec.Key, rec.Scope, rec.ID, rec.State, rec.Lease.Owner, rec.Lease.ExpiresAt.UTC().Format(time.RFC3339)), err}
}

// leasedError says it in the operator's words and is still ErrLeased.
type leasedError struct {
	msg string
	err error
}

func (e leasedError) Error() string { return e.msg }
func (e leasedError) Unwrap() error { return e.err }
