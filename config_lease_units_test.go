package idem_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem"
)

// LeaseDuration given as a bare number (15, meaning "15 s", is 15 ns) must
// be refused by New as a config error naming the field, or be used sanely.
// Found by review: New accepts it; its lease renewer then ticks every 5 ns
// (a core spinning for the client's life), and every Do fails, without
// sending, with "invalid journal record: a leased record needs a lease
// expiry in the future", which names neither the field nor the fix.
func TestReviewLeaseDurationInNanosecondsRefusedOrUsable(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	j := idem.NewMemoryJournal()
	defer j.Close()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL, LeaseDuration: 15})
	if err != nil {
		if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "LeaseDuration") {
			t.Fatalf("New: %v; want ErrInvalidConfig naming LeaseDuration", err)
		}
		return
	}
	defer c.Close()
	res, err := c.Do(context.Background(), idem.Op{ID: "pay", URL: "/p"})
	if err != nil {
		t.Fatalf("New accepted LeaseDuration 15ns, and Do failed after %d request(s) reached the server: %v", n.Load(), err)
	}
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("Do answered %d, want 201", res.StatusCode)
	}
}
