package idem

import "github.com/idemkit/idem/journal"

// State is where an operation stands in its life cycle: pending, in_flight,
// unknown, succeeded, rejected, expired or canceled. The zero State is not a
// valid state. journal.State documents the state machine: which moves the
// journal allows, and what each state means for the operation.
type State = journal.State

// The states of an operation; see journal.State.
const (
	// StatePending: journaled and never received by the server, so it is
	// safe to send.
	StatePending = journal.StatePending
	// StateInFlight: an attempt is being sent. Found after a crash, it means
	// the same as StateUnknown.
	StateInFlight = journal.StateInFlight
	// StateUnknown: the request may have reached the server; only a status
	// check moves it on.
	StateUnknown = journal.StateUnknown
	// StateSucceeded: terminal; the server answered 2xx.
	StateSucceeded = journal.StateSucceeded
	// StateRejected: terminal; the server gave a definitive answer other
	// than success.
	StateRejected = journal.StateRejected
	// StateExpired: the server's key retention passed before the outcome was
	// confirmed. Nothing is re-sent; an operator settles it with Reconcile.
	StateExpired = journal.StateExpired
	// StateCanceled: terminal; the caller withdrew a pending operation that
	// was never sent.
	StateCanceled = journal.StateCanceled
)

// States lists every valid state in life-cycle order.
func States() []State { return journal.States() }

// ParseState parses a state name as printed by State.String. It accepts
// "inflight" and "in-flight" for convenience on a command line.
func ParseState(name string) (State, error) { return journal.ParseState(name) }
