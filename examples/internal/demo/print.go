// Package demo is the scaffolding the example programs share: an
// in-process shop (the orders application behind idem's server middleware)
// with the network faults the stories need, and the printing of what
// happens. None of it is what a client application would copy: each
// example's main.go is.
package demo

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/idemkit/idem"
)

// PrintTransitions returns an idem.Config.OnTransition hook that prints each
// journaled state change, such as
//
//	key 3f2a9c1e… checkout/cart-42: in_flight → unknown (sent, then: EOF)
//
// out must be safe for concurrent use (see SyncWriter): the hook runs on
// the goroutines that drive operations.
func PrintTransitions(out io.Writer) func(idem.Transition) {
	return func(t idem.Transition) {
		from := "new"
		if t.From.Valid() {
			from = t.From.String()
		}
		line := fmt.Sprintf("   key %.8s… %s: %s → %s", t.Key, t.ID, from, t.To)
		switch {
		case t.Reason != "":
			line += " (" + t.Reason + ")"
		case t.StatusCode != 0:
			line += fmt.Sprintf(" (HTTP %d)", t.StatusCode)
		}
		fmt.Fprintln(out, line)
	}
}

// SyncWriter serializes writes from the goroutines that print.
type SyncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// NewSyncWriter wraps w.
func NewSyncWriter(w io.Writer) *SyncWriter { return &SyncWriter{w: w} }

func (s *SyncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// OrderID reads the order ID from the shop's answer.
func OrderID(body []byte) string {
	var o struct {
		ID string `json:"order_id"`
	}
	if err := json.Unmarshal(body, &o); err != nil || o.ID == "" {
		return fmt.Sprintf("(unreadable answer %q)", body)
	}
	return o.ID
}
