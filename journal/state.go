package journal

import (
	"fmt"
	"strings"
)

// State is where an operation stands in its life cycle. The zero State is not
// a valid state; journals refuse it.
//
//	pending ──▶ in_flight ──▶ succeeded | rejected
//	   │            │
//	   │            └──▶ unknown ──(status check)──▶ succeeded | rejected | in_flight (resend, same key)
//	   ├──▶ canceled                    │
//	   └──────────────────────────────┴──▶ expired ──(Reconcile)──▶ succeeded | rejected
type State uint8

const (
	// StatePending: journaled and never received by the server, so it is
	// safe to send. An operation is pending after Begin, and after an
	// attempt that provably never left the machine (the dial failed).
	StatePending State = iota + 1
	// StateInFlight: an attempt is being sent. Found after a crash, it means
	// the same as StateUnknown.
	StateInFlight
	// StateUnknown: the request may have reached the server. The client
	// moves it on only after a status check (or a replay of the same key).
	StateUnknown
	// StateSucceeded: terminal; the server answered 2xx.
	StateSucceeded
	// StateRejected: terminal; the server gave a definitive answer other
	// than success (a 4xx, or a 5xx it stores and replays for the key).
	StateRejected
	// StateExpired: the server's key retention passed before the outcome was
	// confirmed. Nothing is re-sent; an operator settles it with Reconcile.
	StateExpired
	// StateCanceled: terminal; the caller withdrew a pending operation that
	// was never sent.
	StateCanceled
)

var stateNames = [...]string{
	StatePending:   "pending",
	StateInFlight:  "in_flight",
	StateUnknown:   "unknown",
	StateSucceeded: "succeeded",
	StateRejected:  "rejected",
	StateExpired:   "expired",
	StateCanceled:  "canceled",
}

// States lists every valid state in life-cycle order.
func States() []State {
	return []State{StatePending, StateInFlight, StateUnknown, StateSucceeded, StateRejected, StateExpired, StateCanceled}
}

// String returns the state's wire and journal name, such as "in_flight".
// The zero State, which no record has, prints as "none".
func (s State) String() string {
	if s.Valid() {
		return stateNames[s]
	}
	if s == 0 {
		return "none"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Valid reports whether s is one of the defined states.
func (s State) Valid() bool { return s >= StatePending && s <= StateCanceled }

// Terminal reports whether s is final: succeeded, rejected or canceled,
// what the docs call a settled operation. Expired is not terminal: it
// waits for an operator's decision.
func (s State) Terminal() bool {
	return s == StateSucceeded || s == StateRejected || s == StateCanceled
}

// Active reports whether the operation still has work the client drives by
// itself: pending, in_flight or unknown. Only active records are claimed.
func (s State) Active() bool {
	return s == StatePending || s == StateInFlight || s == StateUnknown
}

// CanMoveTo reports whether the journal allows a move from s to t.
// Terminal states never change; canceled is reachable only from pending;
// expired may only be settled as succeeded or rejected (or rewritten as
// expired, to update its note). Among the active states every move is
// allowed: which one the client makes is its policy, not the journal's.
// Journals enforce this on every update.
func (s State) CanMoveTo(t State) bool {
	if !s.Valid() || !t.Valid() || s.Terminal() {
		return false
	}
	switch {
	case s == StateExpired:
		return t == StateSucceeded || t == StateRejected || t == StateExpired
	case t == StateCanceled:
		return s == StatePending
	default:
		return true
	}
}

// MarshalText implements encoding.TextMarshaler.
func (s State) MarshalText() ([]byte, error) {
	if !s.Valid() {
		return nil, fmt.Errorf("idem: invalid state %d", uint8(s))
	}
	return []byte(s.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *State) UnmarshalText(b []byte) error {
	v, err := ParseState(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// ParseState parses a state name as printed by State.String. It accepts
// "inflight" and "in-flight" for convenience on a command line.
func ParseState(name string) (State, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	n = strings.NewReplacer("-", "_").Replace(n)
	if n == "inflight" {
		n = "in_flight"
	}
	for _, s := range States() {
		if stateNames[s] == n {
			return s, nil
		}
	}
	return 0, fmt.Errorf("idem: unknown state %q (want one of pending, in_flight, unknown, succeeded, rejected, expired, canceled)", name)
}
