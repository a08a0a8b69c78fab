package operator

import (
	"context"
	"errors"
	"sort"
	"time"

	"github.com/idemkit/idem"
)

// Worker is one owner of leases in the journal, for the fleet views of
// "idem stats" and the web view's overview: whether it is alive, how many
// active operations carry its lease, and the lease that ends first.
type Worker struct {
	Owner string `json:"owner"`
	// Status is "alive" or "gone" when the journal can tell (PostgreSQL:
	// the worker's session holds its liveness lock or not), else "holding"
	// (a lease of it is not over) or "lapsed": on SQLite, and for a
	// PostgreSQL worker with no liveness record (WithoutLiveness), whose
	// leases the journal lets lapse instead of calling it gone.
	Status     string `json:"status"`
	Operations int    `json:"operations"`
	// OldestLease is when the first of its leases ends, nil when it holds
	// none.
	OldestLease *time.Time `json:"oldest_lease_until,omitempty"`
}

// ErrLivenessUnknown is what an Alive func returns when the journal cannot
// tell which workers are alive where it was opened: a PostgreSQL hot
// standby, whose locks are not the primary's. The views then show each
// worker's status by its leases, with this error's message as a note.
var ErrLivenessUnknown = errors.New("liveness unknown on a standby: run this against the primary")

// Fleet lists the owners of the leases of j's active operations (pending,
// in_flight, unknown) with their counts; alive, when not nil, tells which
// owners are alive or gone (those missing have no liveness record: their
// status is their leases'), and adds the live ones that hold nothing.
// Sorted by name.
func Fleet(ctx context.Context, j idem.Journal, alive map[string]bool, now time.Time) ([]Worker, error) {
	byOwner := map[string]*Worker{}
	held := map[string]bool{}
	f := idem.Filter{States: []idem.State{idem.StatePending, idem.StateInFlight, idem.StateUnknown}}
	for rec, err := range j.List(ctx, f) {
		if err != nil {
			return nil, err
		}
		l := rec.Lease
		if l.Owner == "" {
			continue
		}
		w := byOwner[l.Owner]
		if w == nil {
			w = &Worker{Owner: l.Owner}
			byOwner[l.Owner] = w
		}
		w.Operations++
		if w.OldestLease == nil || l.ExpiresAt.Before(*w.OldestLease) {
			at := l.ExpiresAt.UTC()
			w.OldestLease = &at
		}
		if l.Held(now) {
			held[l.Owner] = true
		}
	}
	for name, ok := range alive {
		if ok && byOwner[name] == nil {
			byOwner[name] = &Worker{Owner: name}
		}
	}
	out := make([]Worker, 0, len(byOwner))
	for name, w := range byOwner {
		live, known := alive[name]
		switch {
		case known && live:
			w.Status = "alive"
		case known:
			w.Status = "gone"
		case held[name]:
			w.Status = "holding"
		default:
			w.Status = "lapsed"
		}
		out = append(out, *w)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Owner < out[b].Owner })
	return out, nil
}
