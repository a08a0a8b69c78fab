package server

import "context"

// An Outcome is what the middleware did with one request that carried (or
// should have carried) a key, as Config.OnOutcome sees it: for metrics and
// for the attributes of the request's span.
type Outcome struct {
	// Kind says what was done.
	Kind OutcomeKind
	// Scope is Config.Scope's answer, and Key the request's key; both empty
	// when the request was refused before they were read (KeyInvalid).
	// Key is what the client sent: hash it before it goes anywhere.
	Scope, Key string
	// Status is the HTTP status the middleware answered with, or the
	// handler's.
	Status int
	// TookOver reports that the key's lock was stale (its holder presumed
	// dead) and this request ran the handler again.
	TookOver bool
	// StoreFailed reports that the key store failed: the claim (nothing
	// ran, 503), or storing the handler's response (it is stored in the
	// background, and the client was told to retry).
	StoreFailed bool
}

// OutcomeKind says what the middleware did with a keyed request.
type OutcomeKind uint8

const (
	// OutcomeRan: the key was claimed and the handler ran.
	OutcomeRan OutcomeKind = iota + 1
	// OutcomeReplayed: the key's stored response was sent again.
	OutcomeReplayed
	// OutcomeInProgress: another request holds the key (409), or this
	// one's response is still being stored.
	OutcomeInProgress
	// OutcomeKeyReused: the key belongs to another request (422).
	OutcomeKeyReused
	// OutcomeKeyInvalid: no key, an invalid one, an unreadable or too
	// large body, or a request the store cannot keep (ErrUnstorable) (400
	// or 413): nothing ran.
	OutcomeKeyInvalid
	// OutcomeStoreUnavailable: the key could not be claimed (503): nothing
	// ran.
	OutcomeStoreUnavailable
)

var outcomeKindNames = [...]string{OutcomeRan: "ran", OutcomeReplayed: "replayed", OutcomeInProgress: "in_progress",
	OutcomeKeyReused: "key_reused", OutcomeKeyInvalid: "key_invalid", OutcomeStoreUnavailable: "store_unavailable"}

func (k OutcomeKind) String() string {
	if int(k) < len(outcomeKindNames) && outcomeKindNames[k] != "" {
		return outcomeKindNames[k]
	}
	return "OutcomeKind(?)"
}

// report calls OnOutcome.
func (m *Middleware) report(ctx context.Context, o Outcome) {
	if m.cfg.OnOutcome != nil {
		m.cfg.OnOutcome(ctx, o)
	}
}
