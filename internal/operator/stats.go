package operator

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/idemkit/idem"
)

// Stats is what "idem stats" prints and the web view's overview shows:
// the number of operations by state and scope, the oldest unsettled one
// and the journal's size on disk.
type Stats struct {
	Journal   string `json:"journal"`
	SizeBytes int64  `json:"size_bytes"`
	FileBytes int64  `json:"file_bytes"`
	WALBytes  int64  `json:"wal_bytes"`
	Total     int    `json:"total"`
	// ByState has every state, zero or not.
	ByState map[string]int `json:"by_state"`
	ByScope []ScopeCount   `json:"by_scope"`
	// OldestUnsettled is the oldest operation that is not settled
	// (pending, in_flight, unknown, expired), or nil.
	OldestUnsettled *Oldest `json:"oldest_unsettled"`
	// Workers are the owners of leases of active operations, and on a
	// PostgreSQL journal the workers alive (see Fleet); filled by the
	// caller.
	Workers []Worker `json:"workers"`
	// LivenessUnknown, when not empty, says why Workers' statuses are
	// their leases' and not alive or gone (see ErrLivenessUnknown).
	LivenessUnknown string `json:"liveness_unknown,omitempty"`
}

// ScopeCount is one scope's operations by state.
type ScopeCount struct {
	Scope   string         `json:"scope"`
	Total   int            `json:"total"`
	ByState map[string]int `json:"by_state"`
}

// Oldest is the oldest unsettled operation's group: its scope and state,
// and when it was created.
type Oldest struct {
	Scope      string    `json:"scope"`
	State      string    `json:"state"`
	CreatedAt  time.Time `json:"created_at"`
	AgeSeconds int64     `json:"age_seconds"`
}

// Unsettled are the states of an operation that is not settled: it waits
// for the application, "idem resume" or an operator.
var Unsettled = []idem.State{idem.StatePending, idem.StateInFlight, idem.StateUnknown, idem.StateExpired}

// NewStats sums a journal's Count at now, with the size of the journal's
// file at path and its -wal.
func NewStats(path string, counts []idem.Count, now time.Time) (Stats, error) {
	s := Stats{Journal: path, ByState: map[string]int{}, ByScope: []ScopeCount{}, Workers: []Worker{}}
	var err error
	if s.FileBytes, err = fileSize(path); err != nil {
		return Stats{}, err
	}
	if s.WALBytes, err = fileSize(path + "-wal"); err != nil {
		return Stats{}, err
	}
	s.SizeBytes = s.FileBytes + s.WALBytes
	for _, st := range idem.States() {
		s.ByState[st.String()] = 0
	}
	for _, c := range counts { // ordered by scope, then state
		s.Total += c.N
		s.ByState[c.State.String()] += c.N
		if len(s.ByScope) == 0 || s.ByScope[len(s.ByScope)-1].Scope != c.Scope {
			s.ByScope = append(s.ByScope, ScopeCount{Scope: c.Scope, ByState: map[string]int{}})
		}
		sc := &s.ByScope[len(s.ByScope)-1]
		sc.Total += c.N
		sc.ByState[c.State.String()] += c.N
		if !c.State.Terminal() && (s.OldestUnsettled == nil || c.Oldest.Before(s.OldestUnsettled.CreatedAt)) {
			s.OldestUnsettled = &Oldest{Scope: c.Scope, State: c.State.String(), CreatedAt: c.Oldest.UTC(),
				AgeSeconds: int64(max(now.Sub(c.Oldest), 0) / time.Second)}
		}
	}
	return s, nil
}

// fileSize is the size of the file at path, zero when it does not exist.
func fileSize(path string) (int64, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// FormatBytes prints a size in bytes with a binary unit: 512 B, 1.5 KiB.
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), -1
	for v >= unit && i < 3 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGT"[i])
}
